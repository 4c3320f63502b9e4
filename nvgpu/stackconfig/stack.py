"""The whole ``nvidia-gpu:`` config: ``cluster`` and ``nodeGroups``, and the checks no section can make alone
(unique names, one group per Deckhouse NodeGroup, DRA against the Kubernetes version, the toolkit
container against the node-setup backend).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    Field,
    model_validator,
)

from nvgpu import toolkit as toolkitspec
from nvgpu.stackconfig import resolved
from nvgpu.stackconfig.cluster import DRA_GA_MINOR, Cluster
from nvgpu.stackconfig.common import ConfigModel, Loc, first_indices, raise_all
from nvgpu.stackconfig.dra import DRA_DEVICE_TAINTS_MINOR
from nvgpu.stackconfig.gpu import Sharing
from nvgpu.stackconfig.modes import AllocationMode, NodeSetupBackend
from nvgpu.stackconfig.nodegroup import NodeGroup


class StackConfig(ConfigModel):
    """The whole ``nvidia-gpu:`` namespace of a stack: the cluster settings and the node groups, checked together."""

    #: The settings every node group shares.
    cluster: Cluster
    #: The groups of GPU nodes, each with its selection, GPUs, driver and toolkit; names unique.
    node_groups: Annotated[list[NodeGroup], Field(min_length=1)]

    @model_validator(mode="after")
    def _cross(self) -> StackConfig:
        problems: list[tuple[Loc, str]] = []
        first = first_indices([g.name for g in self.node_groups])
        problems += [(("nodeGroups", i, "name"), f"{g.name!r} is the name of nodeGroups[{first[g.name]}] already; "
                                                 "node group names must be unique")
                     for i, g in enumerate(self.node_groups) if first[g.name] != i]
        on_node_group = first_indices([g.node_group or f"\0{i}" for i, g in enumerate(self.node_groups)])
        problems += [(("nodeGroups", i, "nodeGroup"), (
            f"{g.node_group!r} is the Deckhouse NodeGroup of nodeGroups[{on_node_group[g.node_group]}] "
            f"({self.node_groups[on_node_group[g.node_group]].name!r}) already: its nodes would get two groups' "
            "labels, taints and node scripts; one node group per Deckhouse NodeGroup"))
            for i, g in enumerate(self.node_groups) if g.node_group and on_node_group[g.node_group] != i]
        for i, g in enumerate(self.node_groups):
            if self.cluster.node_setup is NodeSetupBackend.DECKHOUSE and g.toolkit.container:
                problems.append((("nodeGroups", i, "toolkit", "source"), (
                    "'container' needs cluster.nodeSetup 'daemonset': on Deckhouse, bashible configures the "
                    "runtime when the node joins, before any pod could install the toolkit; bake the toolkit "
                    "into the node image (source preinstalled)")))
            tag = g.toolkit.image.tag
            toolkit_release = toolkitspec.release(tag) if g.toolkit.container else None
            if g.gpu.sharing is Sharing.MIG and toolkit_release and toolkit_release < toolkitspec.MIG_MONITOR_SINCE:
                since = "v" + ".".join(map(str, toolkitspec.MIG_MONITOR_SINCE))
                problems.append((("nodeGroups", i, "toolkit", "image", "tag"), (
                    f"{tag!r} is older than {since}: on MIG GPUs the toolkit would not give the device plugin, "
                    "labeller and exporter the MIG monitor capability (/dev/nvidia-caps/nvidia-cap2; "
                    "NVIDIA/nvidia-container-toolkit#1740), and NVML refuses them the GPUs; use "
                    f"{since} or later (the default is {toolkitspec.DEFAULT_TAG})")))
            if self.cluster.node_setup is NodeSetupBackend.DECKHOUSE and g.node_group is None:
                problems.append((("nodeGroups", i, "nodeGroup"), "required with cluster.nodeSetup 'deckhouse', which "
                                                                 "configures Deckhouse NodeGroups (nodeSelector is for "
                                                                 "nodeSetup 'daemonset')"))
            if self.allocation_mode(g) is AllocationMode.DRA and self.cluster.kubernetes_minor < DRA_GA_MINOR:
                where: Loc = ("nodeGroups", i, "allocationMode") if g.allocation_mode else ("cluster", "allocationMode")
                problems.append((where, f"'dra' needs Kubernetes 1.{DRA_GA_MINOR}+ (resource.k8s.io/v1) and "
                                        f"cluster.kubernetesVersion is {self.cluster.kubernetes_version}"
                                        + ("" if g.allocation_mode else f" (node group {g.name!r} inherits it)")))
        raise_all(problems + self._dra_problems())
        return self

    def _dra_problems(self) -> list[tuple[Loc, str]]:
        problems: list[tuple[Loc, str]] = []
        for i, g in enumerate(self.node_groups):
            if g.passthrough and self.allocation_mode(g) is not AllocationMode.DRA:
                problems.append((("nodeGroups", i, "passthrough"), "needs allocationMode 'dra' (VFIO devices "
                                                                   "are offered through the vfio.gpu.nvidia.com "
                                                                   "DeviceClass)"))
            if "device_list_strategy" in g.gpu.model_fields_set and self.allocation_mode(g) is AllocationMode.DRA:
                problems.append((("nodeGroups", i, "gpu", "deviceListStrategy"), (
                    "only for allocationMode 'devicePlugin': under DRA the kubelet plugin hands out GPUs as CDI "
                    "devices; remove it")))
        dra = self.cluster.dra
        if dra.health_action == "taint" and self.cluster.kubernetes_minor < DRA_DEVICE_TAINTS_MINOR:
            problems.append((("cluster", "dra", "healthAction"), (
                f"'taint' needs DRADeviceTaints, on by default from Kubernetes 1.{DRA_DEVICE_TAINTS_MINOR}, and "
                f"cluster.kubernetesVersion is {self.cluster.kubernetes_version} (use 'withdraw')")))
        if dra.claim_quotas and not self.uses_dra:
            problems.append((("cluster", "dra", "claimQuotas"), "set, but no node group uses allocationMode 'dra': "
                                                                "the quotas would limit claims nobody can satisfy"))
        return problems

    @property
    def uses_dra(self) -> bool:
        return any(self.allocation_mode(g) is AllocationMode.DRA for g in self.node_groups)

    def allocation_mode(self, group: NodeGroup) -> AllocationMode:
        """The group's allocation mode (:func:`nvgpu.stackconfig.resolved.allocation_mode`)."""
        return resolved.allocation_mode(self.cluster, group)
