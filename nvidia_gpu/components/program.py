"""The one build function ``__main__.py`` calls: validated stack config in, every component of the stack out.

It also owns the Pulumi-side read of the config namespace, because the engine hands config to the
program as strings (structured values JSON-encoded) and this is the single place that undoes that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from nvgpu.driver import DriverSource
from nvgpu.nodelabels import desired_node_taints
from nvgpu.nodescripts import NodeScript
from nvgpu.stackconfig import (
    CONFIG_NAMESPACE,
    AllocationMode,
    NodeGroup,
    StackConfig,
    namespace_values,
)
from nvgpu.stackconfig.resolved import GroupPlan
from nvidia_gpu.components.dra_stack import DraStack, DraStackArgs
from nvidia_gpu.components.driver_upgrade import DriverUpgrade, DriverUpgradeArgs
from nvidia_gpu.components.manifests import previewaccess
from nvidia_gpu.components.mig_profile import MigProfile, MigProfileArgs
from nvidia_gpu.components.monitoring import GpuMonitoring, GpuMonitoringArgs
from nvidia_gpu.components.node_group import GpuNodeGroup, GpuNodeGroupArgs
from nvidia_gpu.components.node_group import node_scripts as group_node_scripts
from nvidia_gpu.components.platform import GpuPlatform, GpuPlatformArgs
from nvidia_gpu.components.register import recording, register


@dataclass(frozen=True)
class Stack:
    provider: k8s.Provider
    platform: GpuPlatform
    node_groups: dict[str, GpuNodeGroup]
    dra: DraStack | None = None
    mig: MigProfile | None = None
    monitoring: GpuMonitoring | None = None
    driver_upgrade: DriverUpgrade | None = None


def decode_config_value(raw: Any) -> Any:
    """The engine passes objects and lists as JSON text and scalars as plain text; give back YAML's values."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def runtime_config_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``nvidia-gpu:*`` keys of the engine's config map, decoded, keyed without the namespace."""
    return {key: decode_config_value(value) for key, value in namespace_values(config).items()}


def node_scripts(config: StackConfig, group: NodeGroup) -> tuple[NodeScript, ...]:
    """The bashible steps for ``group`` (see :func:`nvidia_gpu.components.node_group.node_scripts`)."""
    return group_node_scripts(GroupPlan.of(config.cluster, group))


def build_stack(config: StackConfig) -> Stack:
    with recording() as seen:
        stack = _build_stack(config)
    identity = config.cluster.preview_identity
    if identity is not None:
        # After everything else: its role is derived from what the stack registered.
        namespace = config.cluster.namespace
        objects = [previewaccess.Applied(r.manifest, r.mode != "read") for r in seen]
        before: list[pulumi.Resource] = []
        for manifest in previewaccess.manifests(namespace, identity, objects):
            opts = pulumi.ResourceOptions(parent=stack.platform, providers={"kubernetes": stack.provider},
                                          depends_on=list(before))
            before.append(register(f"{namespace}-preview-{manifest['kind'].lower()}", manifest, opts))
    return stack


def _build_stack(config: StackConfig) -> Stack:
    cluster = config.cluster
    provider = k8s.Provider(
        f"{cluster.namespace}-kubernetes",
        context=cluster.kube_context,
        enable_server_side_apply=True,
        # The stack's ConfigMaps no longer need it: register_config_map updates their content in place
        # under any provider (a user's own may lack it). Kept so deployed stacks' provider config stays as it was.
        enable_config_map_mutable=True,
    )
    with_provider = pulumi.ResourceOptions(providers={"kubernetes": provider})
    taint_keys = sorted({t.key for group in config.node_groups for t in desired_node_taints(group)})
    platform = GpuPlatform(cluster.namespace, GpuPlatformArgs(cluster=cluster, node_taint_keys=taint_keys),
                           with_provider)
    groups: dict[str, GpuNodeGroup] = {}
    for group in config.node_groups:
        groups[group.name] = GpuNodeGroup(
            group.name,
            GpuNodeGroupArgs(
                cluster=cluster,
                group=group,
                allocation_mode=config.allocation_mode(group),
                platform=platform.refs,
            ),
            with_provider,
        )
    dra_groups = [g for g in config.node_groups if config.allocation_mode(g) is AllocationMode.DRA]
    dra = None
    if dra_groups:
        dra = DraStack(f"{cluster.namespace}-dra", DraStackArgs(cluster=cluster, groups=dra_groups,
                                                                platform=platform.refs), with_provider)
    # Stack-wide: the MIG manager must outlive a group's MIG setting to roll its nodes back.
    mig = MigProfile(f"{cluster.namespace}-mig", MigProfileArgs(cluster=cluster, groups=config.node_groups,
                                                               depends_on=platform.refs.dependencies), with_provider)
    monitoring = GpuMonitoring(f"{cluster.namespace}-monitoring",
                               GpuMonitoringArgs(platform=platform.refs, groups=config.node_groups), with_provider)
    # Stack-wide: one controller rolls driver changes through every group whose driver containers it runs.
    upgrade = None
    if any(g.gpu.driver.source is DriverSource.CONTAINER for g in config.node_groups):
        upgrade = DriverUpgrade(f"{cluster.namespace}-driver-upgrade",
                                DriverUpgradeArgs(cluster=cluster, groups=config.node_groups,
                                                  depends_on=platform.refs.dependencies), with_provider)
    pulumi.export("namespace", platform.namespace)
    pulumi.export("nodeGroups", sorted(groups))
    # Labels and taints per group (the labeller applies them off Deckhouse; provisioning can set them earlier).
    pulumi.export("nodeTemplates", {n: {"labels": g.node_labels, "taints": g.node_taints} for n, g in groups.items()})
    return Stack(provider=provider, platform=platform, node_groups=groups, dra=dra, mig=mig, monitoring=monitoring,
                 driver_upgrade=upgrade)


__all__ = ["CONFIG_NAMESPACE", "Stack", "build_stack", "runtime_config_values"]
