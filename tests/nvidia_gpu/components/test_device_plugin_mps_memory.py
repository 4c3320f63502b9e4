"""The MPS control daemon of an MPS group runs in its own container (as NVIDIA's ``mps-control-daemon``
DaemonSet): its memory limit is sized for the daemon and its server (``workloads.MPS_*``), and every group's
device plugin keeps the agent's own limit."""

from __future__ import annotations

from typing import Any

import pytest

from nvgpu.stackconfig import GroupPlan
from nvidia_gpu.components.manifests import dra, workloads
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.manifests.workloads import GroupContext
from tests.nvidia_gpu.components.component_helpers import group, stack_config


def _ctx(sharing: str) -> GroupContext:
    cfg = stack_config([group("g", sharing=sharing)])
    (g,) = cfg.node_groups
    return GroupContext(cfg.cluster.namespace, cfg.cluster, g, GroupPlan.of(cfg.cluster, g))


def _plugin_resources(sharing: str) -> dict[str, Any]:
    (container,) = workloads.device_plugin_daemonset(_ctx(sharing))["spec"]["template"]["spec"]["containers"]
    resources: dict[str, Any] = container["resources"]
    return resources


def test_mps_control_daemon_limit_covers_the_daemon_and_server() -> None:
    ds = workloads.mps_control_daemon_daemonset(_ctx("MPS"))
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    # 192 MiB for the agent + 128 MiB control daemon and server + 64 MiB per GPU for 8 GPUs.
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "192Mi"},
                                      "limits": {"cpu": "500m", "memory": "832Mi"}}
    agent = workloads.RESOURCES[AgentRole.DEVICE_PLUGIN]
    extra = workloads.MPS_BASE_MIB + workloads.MPS_PER_GPU_MIB * workloads.MPS_SIZED_FOR_GPUS
    assert int(container["resources"]["limits"]["memory"][:-2]) == int(agent.memory_limit[:-2]) + extra


@pytest.mark.parametrize("sharing", ["Exclusive", "TimeSlicing", "MPS", "MIG"])
def test_every_device_plugin_keeps_the_agents_limit(sharing: str) -> None:
    assert _plugin_resources(sharing) == {"requests": {"cpu": "50m", "memory": "64Mi"},
                                          "limits": {"cpu": "500m", "memory": "192Mi"}}


def test_dra_plugin_limit_covers_the_mps_daemons_of_its_claims() -> None:
    """MPS claims start their control daemon in the DRA plugin's container, in any DRA group."""
    cfg = stack_config([{"name": "d", "nodeGroup": "ng-d", "allocationMode": "dra"}])
    (g,) = cfg.node_groups
    ds = dra.plugin_daemonset(cfg.cluster.namespace, cfg.cluster, g, GroupPlan.of(cfg.cluster, g))
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"},
                                      "limits": {"cpu": "500m", "memory": "832Mi"}}
