"""nvidia-gpu as a Pulumi component library: NVIDIA GPUs on Kubernetes from a program of your own.

What a user imports is this package's top level::

    import pulumi
    import pulumi_kubernetes as k8s
    import nvidia_gpu

    provider = k8s.Provider("gpu-cluster", kubeconfig=...)
    platform = nvidia_gpu.GpuPlatform("gpu", nvidia_gpu.GpuPlatformArgs(
        namespace="nvidia-gpu", agent_image="registry.example/nvidia-gpu-agent:1.2.3",
    ), opts=pulumi.ResourceOptions(provider=provider))
    nvidia_gpu.GpuNodeGroup("gpu-a100", nvidia_gpu.GpuNodeGroupArgs(
        platform=platform, group={"name": "gpu-a100", "gpuModel": "A100-SXM4-80GB"},
    ), opts=pulumi.ResourceOptions(provider=provider))

* :class:`GpuPlatform` / :class:`GpuPlatformArgs`: the cluster-wide part (namespace, agents' RBAC,
  the runtime class, the node labeller); :class:`GpuNodeGroup` / :class:`GpuNodeGroupArgs`: one group
  of GPU nodes (node setup, device plugin or DRA driver, sharing, MIG), with :class:`SharingPolicy`,
  :class:`MigProfile` and :class:`DraStack` (and their ``Args``) as its parts when used on their own.
* :func:`build_stack`: a whole stack from a validated :class:`nvgpu.stackconfig.StackConfig`, what
  this repository's own ``__main__.py`` runs.

Args take plain values (validated before anything registers, the field named in the error) and, where a
value usually comes from another resource, a ``pulumi.Input``: see each ``Args`` class. The provider goes
through ``opts`` as for any Pulumi component; children inherit it.

``nvidia_gpu.policies`` holds the CrossGuard rules (the pack directory ``policies/`` serves them) and
``nvidia_gpu.preview`` the offline preview (``python -m nvidia_gpu.preview --stack dev``); neither is
needed to deploy. The names here load on first use, so the pack process and the preview, which import
those subpackages, do not pay for the components' imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvidia_gpu.components.dra_stack import DraStack, DraStackArgs
    from nvidia_gpu.components.mig_profile import MigProfile, MigProfileArgs
    from nvidia_gpu.components.node_group import GpuNodeGroup, GpuNodeGroupArgs
    from nvidia_gpu.components.platform import GpuPlatform, GpuPlatformArgs
    from nvidia_gpu.components.program import build_stack
    from nvidia_gpu.components.sharing_policy import SharingPolicy, SharingPolicyArgs

#: Public name -> the module that defines it.
_EXPORTS = {
    "GpuPlatform": "nvidia_gpu.components.platform",
    "GpuPlatformArgs": "nvidia_gpu.components.platform",
    "GpuNodeGroup": "nvidia_gpu.components.node_group",
    "GpuNodeGroupArgs": "nvidia_gpu.components.node_group",
    "SharingPolicy": "nvidia_gpu.components.sharing_policy",
    "SharingPolicyArgs": "nvidia_gpu.components.sharing_policy",
    "MigProfile": "nvidia_gpu.components.mig_profile",
    "MigProfileArgs": "nvidia_gpu.components.mig_profile",
    "DraStack": "nvidia_gpu.components.dra_stack",
    "DraStackArgs": "nvidia_gpu.components.dra_stack",
    "build_stack": "nvidia_gpu.components.program",
}

__all__ = [
    "DraStack",
    "DraStackArgs",
    "GpuNodeGroup",
    "GpuNodeGroupArgs",
    "GpuPlatform",
    "GpuPlatformArgs",
    "MigProfile",
    "MigProfileArgs",
    "SharingPolicy",
    "SharingPolicyArgs",
    "build_stack",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nvidia_gpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
