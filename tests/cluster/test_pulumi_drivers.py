"""The drivers stack (``Pulumi.drivers.yaml``) through the real Pulumi engine, on a control plane of its own:
``preview`` lists what the offline preview renders, ``up`` applies all three driver sources (driver
DaemonSets per OS release and kernel, an ``NVIDIADriver``, a pre-installed group), a changed
``driver.version`` is applied by a second ``up`` without touching a node (``OnDelete``), the stack's
upgrade controller, run with the token of the ServiceAccount the engine created and the RBAC it applied,
rolls the new driver one node at a time, and ``destroy`` leaves the cluster as it was.

Driver pods run on kwok nodes (kwok reports their containers ready); what a driver pod's readiness
means on a real node, NVIDIA's ``nvidia-smi`` probe and the agent's check against the declared driver,
is tested in ``tests/node_agent/setup/test_monitor.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane, Kube
from localcluster.objects import create_kwok_node, service_account_kube, wait_for, write_kubeconfig
from node_agent.driverupgrade.controller import UpgradeController
from node_agent.driverupgrade.machine import IN_FLIGHT, UpgradeState
from node_agent.kube.pods import ready as pod_ready
from node_agent.kube.transport import Kube as AgentKube
from nvgpu import labels
from nvidia_gpu.components.manifests import driver, driverupgrade
from tests.cluster.pulumi_project import KINDS, Project, assert_same_objects, make_project, settled, snapshot

STACK = "drivers"
NS = "gpu-drivers"
#: Two nodes of the precompiled group (same OS and kernel: one DaemonSet serves both), one pre-installed.
H100 = ("drv-h100-a", "drv-h100-b")
H200 = "drv-h200"
SNAPSHOT_KINDS = [*KINDS, ("apps/v1", "Deployment"), ("nvidia.com/v1alpha1", "NVIDIADriver")]


def _gpu_node(kube: Kube, name: str, pool: str, **extra: str) -> None:
    create_kwok_node(kube, name, {"example.com/gpu-pool": pool, labels.OS_RELEASE_ID: "ubuntu",
                                  labels.OS_RELEASE_VERSION_ID: "22.04",
                                  labels.KERNEL_VERSION_FULL: "5.15.0-105-generic", **extra},
                     [{"key": labels.GPU_TAINT_KEY, "value": labels.GPU_TAINT_VALUE, "effect": "NoSchedule"}],
                     gpus=8)



def _ready_driver_pods(kube: Kube) -> dict[str, dict[str, Any]] | None:
    """The driver pods by node once both H100 nodes have a ready one, else ``None`` (for ``wait_for``)."""
    pods = _driver_pods(kube)
    return pods if len(pods) == 2 and all(pod_ready(p) for p in pods.values()) else None


def _driver_pods(kube: Kube) -> dict[str, dict[str, Any]]:
    return {p["spec"]["nodeName"]: p for p in kube.list("v1", "Pod", NS, labelSelector=driver.DRIVER_SELECTOR_LABEL)
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}


def _images(pods: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {n: p["spec"]["containers"][0]["image"] for n, p in pods.items()}


@pytest.mark.timeout(900)
def test_the_drivers_stack_applies_rolls_a_version_change_and_destroys(cluster: ControlPlane,
                                                                       tmp_path_factory: pytest.TempPathFactory
                                                                       ) -> None:
    kube = cluster.admin()
    work = tmp_path_factory.mktemp("engine-drivers")
    project: Project = make_project(cluster, work, STACK)
    project.pulumi("stack", "init", STACK)
    assert_same_objects(json.loads(project.pulumi("preview", "--json").stdout)["steps"], STACK)
    before = snapshot(kube, SNAPSHOT_KINDS)
    for name in H100:
        _gpu_node(kube, name, "h100")
    _gpu_node(kube, H200, "h200", **{labels.GPU_DEPLOY_DRIVER: labels.DRIVER_PREINSTALLED})
    try:
        project.pulumi("up", "--yes", "--skip-preview")
        # The precompiled group's DaemonSet for ubuntu 22.04 and its kernel runs on both H100 nodes, and no
        # driver container runs on the node with a driver of its own.
        placed = wait_for(lambda: _ready_driver_pods(kube), timeout=120, what="the driver pods ready on the H100 nodes")
        assert _images(placed) == dict.fromkeys(H100, "nvcr.io/nvidia/driver:535-5.15.0-105-generic-ubuntu22.04")
        nvidia_drivers = kube.list("nvidia.com/v1alpha1", "NVIDIADriver")
        assert [(d["spec"]["version"], d["spec"]["kernelModuleType"]) for d in nvidia_drivers] == [
            ("550.90.07", "proprietary")]
        project.pulumi("up", "--yes", "--expect-no-changes")

        # The version change: the branch moves from 535 to 550. `up` changes the DaemonSets' templates only.
        config_path = project.config_file()
        config = yaml.safe_load(config_path.read_text())
        h100 = next(g for g in config["config"]["nvidia-gpu:nodeGroups"] if g["name"] == "h100-precompiled")
        h100["gpu"]["driver"]["version"] = "550"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        project.pulumi("up", "--yes", "--skip-preview")
        old = {n: p["metadata"]["name"] for n, p in _driver_pods(kube).items()}
        assert set(old) == set(H100), "OnDelete: `up` replaced no driver pod"

        token = service_account_kube(kube, NS, driverupgrade.COMPONENT)
        kubeconfig = write_kubeconfig(token, work / "driver-upgrade.kubeconfig", user=driverupgrade.COMPONENT)
        controller = UpgradeController(AgentKube.connect(kubeconfig), NS)
        out_of_service = 0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            controller.run_round()
            nodes = {n: kube.get("v1", "Node", n) for n in H100}
            states = {n: o["metadata"].get("labels", {}).get(labels.DRIVER_UPGRADE_STATE) for n, o in nodes.items()}
            away = {n for n, s in states.items() if s and UpgradeState(s) in IN_FLIGHT}
            away |= {n for n, o in nodes.items() if o["spec"].get("unschedulable")}
            out_of_service = max(out_of_service, len(away))
            if set(states.values()) == {UpgradeState.DONE.value}:
                break
            time.sleep(0.5)
        assert set(states.values()) == {UpgradeState.DONE.value}, states
        assert out_of_service == 1, "maxUnavailable 1: one node out of service at a time"
        new = wait_for(lambda: _ready_driver_pods(kube), timeout=60, what="the new driver pods ready")
        assert _images(new) == dict.fromkeys(H100, "nvcr.io/nvidia/driver:550-5.15.0-105-generic-ubuntu22.04")
        assert not set(old.values()) & {p["metadata"]["name"] for p in new.values()}
        assert H200 not in new
        project.pulumi("up", "--yes", "--expect-no-changes")
        project.pulumi("destroy", "--yes")
        wait_for(lambda: kube.get_or_none("v1", "Namespace", NS) is None, timeout=90, what=f"namespace {NS} gone")
        assert settled(kube, before, SNAPSHOT_KINDS) == before
    finally:
        for name in (*H100, H200):
            kube.delete("v1", "Node", name)

