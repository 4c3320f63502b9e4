"""The device plugin's configuration, in NVIDIA's config-file format, one named config per sharing mode.

Like Deckhouse's ``nvidia-device-plugin-<group>`` ConfigMap, every group gets all four named configs
(``Exclusive``, ``TimeSlicing``, ``MPS``, ``MIG``) rendered with the group's own parameters. The agent
picks the file named by the node label ``node.deckhouse.io/device-gpu.config`` and falls back to the
group's configured mode, so an operator can move one node to another mode by relabelling it.
Unlike Deckhouse, the keys are spelled exactly like the label values (Deckhouse ships ``Mig`` for ``MIG``).
"""

from __future__ import annotations

from typing import Any

from nvgpu import hostpaths, yamltext
from nvgpu.stackconfig import Mps, NodeGroup, Sharing, TimeSlicing
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, group_object_name

CONFIG_VERSION = "v1"
GPU_RESOURCE = "nvidia.com/gpu"
#: Where MPS pipes and shared memory live on the host (mounted into the plugin and MPS clients).
MPS_ROOT = hostpaths.DEVICE_PLUGIN_MPS_ROOT
COMPONENT = "device-plugin-config"


def _flags(group: NodeGroup, mig_strategy: str, mps: bool) -> dict[str, Any]:
    # deviceListStrategy: the group's (volume-mounts by default, not NVIDIA's and Deckhouse's envvar, which
    # node setup's toolkit config refuses in unprivileged containers unless the group chose it).
    strategy = [s.value for s in group.gpu.device_list_strategy]
    flags: dict[str, Any] = {
        "migStrategy": mig_strategy,
        "failOnInitError": True,
        "plugin": {"passDeviceSpecs": True, "deviceListStrategy": strategy, "deviceIDStrategy": "uuid"},
    }
    if mps:
        flags["mpsRoot"] = MPS_ROOT
    return flags


def _replicated(replicas: int) -> dict[str, Any]:
    return {
        "renameByDefault": False,
        # A pod asking for two replicas of one GPU would get the same GPU twice; refuse it like Deckhouse.
        "failRequestsGreaterThanOne": True,
        "resources": [{"name": GPU_RESOURCE, "replicas": replicas}],
    }


def device_plugin_config(group: NodeGroup, mode: Sharing) -> dict[str, Any]:
    """One config document for ``mode`` with the group's parameters (defaults where the group sets none)."""
    gpu = group.gpu
    if mode is Sharing.EXCLUSIVE:
        return {"version": CONFIG_VERSION, "flags": _flags(group, "none", mps=False)}
    if mode is Sharing.TIME_SLICING:
        count = (gpu.time_slicing or TimeSlicing()).partition_count
        return {
            "version": CONFIG_VERSION,
            "flags": _flags(group, "none", mps=False),
            "sharing": {"timeSlicing": _replicated(count)},
        }
    if mode is Sharing.MPS:
        count = (gpu.mps or Mps()).partition_count
        return {"version": CONFIG_VERSION, "flags": _flags(group, "none", mps=True),
                "sharing": {"mps": _replicated(count)}}
    return {"version": CONFIG_VERSION, "flags": _flags(group, gpu.effective_mig.strategy.value, mps=False)}


def render_named_configs(group: NodeGroup) -> dict[str, str]:
    """``{mode: YAML text}`` for every sharing mode, in a stable order (the ConfigMap's ``data``)."""
    return {
        mode.value: yamltext.dump(device_plugin_config(group, mode))
        for mode in Sharing
    }


def config_map_name(group: NodeGroup) -> str:
    return group_object_name(COMPONENT, group.name)


def config_map(namespace_name: str, group: NodeGroup) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(group),
            "namespace": namespace_name,
            "labels": app_labels(COMPONENT, group.name, node_group=group.name),
        },
        "data": render_named_configs(group),
    }
