"""Which pods the driver upgrade moves, leaves, or stops (``node_agent.driverupgrade.controller``): the
node's GPU agents are every agent of the committed stacks that holds the GPUs open, and none of the pods
the node needs while its driver is replaced; the drain leaves what ``kubectl drain`` leaves."""

from __future__ import annotations

from typing import Any

import pytest

from node_agent.driverupgrade.controller import gpu_agent, workloads
from node_agent.driverupgrade.machine import PodRef
from nvgpu.driver import UpgradePolicy
from tests.cluster.stack import rendered

#: Hold NVML or the GPUs' device nodes for as long as they run.
HOLDERS = {"device-plugin", "mps-control-daemon", "gpu-labeller", "dra-kubelet-plugin", "gpu-exporter", "dcgm-exporter"}
#: Must stay (node setup's gate and monitor, the MIG manager, the driver itself, the toolkit).
STAYS = {"gpu-setup", "mig-manager", "nvidia-driver", "nvidia-container-toolkit"}


def _pod_of(ds: dict[str, Any]) -> dict[str, Any]:
    template = ds["spec"]["template"]
    return {"metadata": {**template["metadata"], "namespace": "ns", "name": "p",
                         "ownerReferences": [{"kind": "DaemonSet", "name": ds["metadata"]["name"],
                                              "controller": True}]},
            "spec": template["spec"], "status": {"phase": "Running"}}


@pytest.mark.parametrize("stack", ["dev", "prod", "drivers"])
def test_the_stacks_gpu_agents_are_stopped_and_nothing_the_node_needs(stack: str) -> None:
    seen: dict[str, bool] = {}
    for m in rendered(stack).manifests:
        obj = m.object
        if obj.get("kind") != "DaemonSet":
            continue
        name = obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        seen[name] = gpu_agent(_pod_of(obj))
    assert {n for n, agent in seen.items() if agent} == HOLDERS & set(seen), seen
    assert not {n for n, agent in seen.items() if agent} & STAYS
    assert set(seen) <= HOLDERS | STAYS, f"a new DaemonSet: decide whether it holds the GPUs ({set(seen)})"


def _pod(name: str, *, owner: bool = True, empty_dir: bool = False, gpu: bool = False) -> dict[str, Any]:
    owners = [{"kind": "ReplicaSet", "name": "rs", "controller": True}] if owner else []
    return {"metadata": {"namespace": "ml", "name": name, "ownerReferences": owners},
            "spec": {"volumes": [{"name": "scratch", "emptyDir": {}}] if empty_dir else [],
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}} if gpu else {}}]},
            "status": {"phase": "Running"}}


def test_the_drain_leaves_bare_and_emptydir_pods_unless_the_policy_says() -> None:
    pods = [_pod("ok", gpu=True), _pod("bare", owner=False), _pod("scratch", empty_dir=True)]
    moved, gpus, refused = workloads(pods, UpgradePolicy())
    assert moved == (PodRef("ml", "ok"), PodRef("ml", "bare"), PodRef("ml", "scratch"))
    assert gpus == (PodRef("ml", "ok"),)
    assert set(refused) == {PodRef("ml", "bare"), PodRef("ml", "scratch")}
    assert "upgrade.force" in refused[PodRef("ml", "bare")]
    assert "upgrade.deleteEmptyDir" in refused[PodRef("ml", "scratch")]
    _, _, none = workloads(pods, UpgradePolicy(force=True, delete_empty_dir=True))
    assert none == {}
