"""nvidia-gpu as a Pulumi component library: NVIDIA GPUs on Kubernetes from a program of your own.

What a user imports is this package's top level::

    import pulumi
    import pulumi_kubernetes as k8s
    import nvidia_gpu

    provider = k8s.Provider("gpu-cluster", enable_server_side_apply=True)
    opts = pulumi.ResourceOptions(provider=provider)  # the provider goes through opts; children inherit it
    platform = nvidia_gpu.GpuPlatform("gpu", nvidia_gpu.GpuPlatformArgs(
        cluster={"kubernetesVersion": "1.34", "nodeSetup": "daemonset"},
        namespace="team-gpu",  # or an Output (another resource's name)
        agent_image="registry.example.com/nvidia-gpu-agent:1.2.3",  # or an Output
    ), opts=opts)
    nvidia_gpu.GpuNodeGroup("a100", nvidia_gpu.GpuNodeGroupArgs(
        platform=platform,
        group={"name": "a100", "nodeSelector": {"matchLabels": {"gpu-pool": "a100"}}},
    ), opts=opts)

* :class:`GpuPlatform` / :class:`GpuPlatformArgs`: the cluster-wide part (the namespace, the agents'
  ServiceAccounts and RBAC, the ``nvidia`` RuntimeClass); :class:`GpuNodeGroup` / :class:`GpuNodeGroupArgs`:
  one group of GPU nodes (node setup, the labeller, the device plugin and its :class:`SharingPolicy`);
  :class:`MigProfile` (the MIG manager), :class:`DraStack` (the DRA driver), :class:`GpuMonitoring` (the
  exporters, scrape objects, alerts and dashboards) and :class:`DriverUpgrade` (the driver upgrade
  controller), with their ``Args``.
* :func:`build_stack`: a whole stack from a validated :class:`nvgpu.stackconfig.StackConfig`, what
  this repository's own ``__main__.py`` runs.

``cluster`` and ``group`` take the stack config's keys as plain values (docs/concepts/stack-config.md, and
every key in docs/reference/stack-config.md), validated as the args are built: a bad plain value raises
``ValueError`` naming the field, before anything registers. Where a value usually comes from another
resource (the namespace, the agent image, extra labels) a ``pulumi.Input`` is accepted and checked when it
resolves, the field named in the error: see :class:`GpuPlatformArgs`. :class:`GpuNodeGroupArgs` takes the
platform itself and defaults the cluster settings, allocation mode, node-setup scripts and labels from it.

``nvidia_gpu.policies`` holds the CrossGuard rules (the pack directory ``policies/`` serves them) and
``nvidia_gpu.preview`` the offline preview (``python -m nvidia_gpu.preview --stack dev``); neither is
needed to deploy. The names here load on first use, so the pack process and the preview, which import
those subpackages, do not pay for the components' imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nvidia_gpu.components import registry

if TYPE_CHECKING:  # what type checkers see; at run time the registry's names load on first use (__getattr__)
    from nvidia_gpu.components.dra_stack import DraStack as DraStack
    from nvidia_gpu.components.dra_stack import DraStackArgs as DraStackArgs
    from nvidia_gpu.components.driver_upgrade import DriverUpgrade as DriverUpgrade
    from nvidia_gpu.components.driver_upgrade import DriverUpgradeArgs as DriverUpgradeArgs
    from nvidia_gpu.components.mig_profile import MigProfile as MigProfile
    from nvidia_gpu.components.mig_profile import MigProfileArgs as MigProfileArgs
    from nvidia_gpu.components.monitoring import GpuMonitoring as GpuMonitoring
    from nvidia_gpu.components.monitoring import GpuMonitoringArgs as GpuMonitoringArgs
    from nvidia_gpu.components.node_group import GpuNodeGroup as GpuNodeGroup
    from nvidia_gpu.components.node_group import GpuNodeGroupArgs as GpuNodeGroupArgs
    from nvidia_gpu.components.platform import GpuPlatform as GpuPlatform
    from nvidia_gpu.components.platform import GpuPlatformArgs as GpuPlatformArgs
    from nvidia_gpu.components.program import build_stack as build_stack
    from nvidia_gpu.components.sharing_policy import SharingPolicy as SharingPolicy
    from nvidia_gpu.components.sharing_policy import SharingPolicyArgs as SharingPolicyArgs

#: Public name -> the module that defines it: every component of the registry with its ``...Args``, and
#: ``build_stack``.
_EXPORTS = {
    **{name: c.module for c in registry.COMPONENTS for name in (c.name, c.args)},
    "build_stack": "nvidia_gpu.components.program",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605  # derived from the registry (the names are in _EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nvidia_gpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
