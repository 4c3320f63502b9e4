"""The drivers the stack deploys, against the real control plane (one of this module's own: the node,
namespace and eviction churn of a rollout stays out of the session's cluster the agent tests share).

* ``gpu.driver.source: gpuOperator``: with NVIDIA's NVIDIADriver CRD installed (the vendored one; the
  session's control plane installs every vendored CRD) the stack's objects are accepted, nothing of them
  is pruned, and the CRD's own rules hold them (``usePrecompiled`` is immutable).
* ``container``: the driver DaemonSets, one per OS release and kernel, place their pods (kwok's) on the
  group's nodes of that OS and kernel as node setup labels them, and never on a node whose host has a
  driver of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import ControlPlane, Kube
from localcluster.client import ApiError
from localcluster.objects import create_kwok_node, service_account_kube, wait_for, write_kubeconfig
from node_agent.driverupgrade.controller import UpgradeController, Watcher
from node_agent.driverupgrade.machine import IN_FLIGHT, DrainMode, UpgradeState
from node_agent.driverupgrade.nodestate import FIELD_MANAGER, field_owners
from node_agent.kube import nodes as agent_nodes
from node_agent.kube.pods import ready as pod_ready
from node_agent.kube.transport import Kube as AgentKube
from node_agent.kube.watch import ListWatch
from nvgpu import labels
from nvgpu.driver import UPGRADE_TAINT_KEY
from nvgpu.stackconfig import load_stack_config
from nvidia_gpu.components.manifests import driver, driverupgrade


@pytest.fixture(scope="module")
def kube(cluster: ControlPlane) -> Kube:
    """The module's own control plane (``tests.cluster.conftest.cluster``), with every vendored CRD."""
    return cluster.admin()


CLUSTER = {"kubernetesVersion": "1.34", "driverRoot": "/run/nvidia/driver",
           "agentImage": {"repository": "registry.example.com/agent", "tag": "1.0.0"}}


def _track(seen: dict[str, list[str]], states: dict[str, str | None]) -> None:
    """Append each node's state to its history when it changed."""
    for n, s in states.items():
        if s and (not seen[n] or seen[n][-1] != s):
            seen[n].append(s)


def test_the_nvidia_driver_objects_are_accepted_as_rendered(kube: Kube) -> None:
    cfg = load_stack_config({"cluster": CLUSTER, "nodeGroups": [
        {"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
         "gpu": {"model": "H100-80GB", "driver": {"source": "gpuOperator", "version": "550", "precompiled": True,
                                                  "kernelModules": "open"}}},
        {"name": "a100", "nodeSelector": {"matchLabels": {"pool": "a100"},
                                          "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
         "gpu": {"model": "A100-80GB", "driver": {"source": "gpuOperator", "version": "535.161.08"}}},
    ]})
    names = []
    try:
        for group in cfg.node_groups:
            obj = driver.nvidia_driver("drv-test", cfg.cluster, group)
            kube.create(obj)
            names.append(obj["metadata"]["name"])
            stored = kube.get(obj["apiVersion"], "NVIDIADriver", obj["metadata"]["name"])
            # Everything the stack set is kept (a field the CRD does not know would have been pruned).
            assert {k: stored["spec"][k] for k in obj["spec"]} == obj["spec"], group.name
        with pytest.raises(ApiError) as caught:
            kube.patch("nvidia.com/v1alpha1", "NVIDIADriver", "drv-test-driver-h100",
                       {"spec": {"usePrecompiled": False}})
        assert "usePrecompiled is an immutable field" in str(caught.value)
    finally:
        for name in names:
            kube.delete("nvidia.com/v1alpha1", "NVIDIADriver", name)


NS = "drv-containers"


def _node(kube: Kube, name: str, os_id: str, version_id: str, kernel: str, **extra: str) -> None:
    create_kwok_node(kube, name, {"pool": "drv", labels.OS_RELEASE_ID: os_id, labels.OS_RELEASE_VERSION_ID: version_id,
                                  labels.KERNEL_VERSION_FULL: kernel, **extra},
                     [{"key": labels.GPU_TAINT_KEY, "value": labels.GPU_TAINT_VALUE, "effect": "NoSchedule"}])


def _placed(kube: Kube) -> dict[str, str]:
    """Node -> the driver image its pod runs, once every pod is scheduled."""
    pods = kube.list("v1", "Pod", NS)
    if not pods or any(not p["spec"].get("nodeName") for p in pods):
        return {}
    return {p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"] for p in pods}


def test_driver_containers_land_by_os_release_and_kernel_and_skip_preinstalled_hosts(kube: Kube) -> None:
    cfg = load_stack_config({"cluster": CLUSTER, "nodeGroups": [
        {"name": "drv", "nodeSelector": {"matchLabels": {"pool": "drv"}},
         "gpu": {"model": "H100-80GB", "driver": {
             "source": "container", "version": "535", "precompiled": True, "osReleases": ["ubuntu22.04", "rhel9.4"],
             "kernels": ["5.15.0-105-generic", "5.14.0-427.13.1.el9_4.x86_64"]}}}]})
    group = cfg.node_groups[0]
    nodes: dict[str, Any] = {
        "drv-jammy": ("ubuntu", "22.04", "5.15.0-105-generic", {}),
        "drv-rhel": ("rhel", "9.4", "5.14.0-427.13.1.el9_4.x86_64", {}),
        "drv-own-driver": ("ubuntu", "22.04", "5.15.0-105-generic",
                           {labels.GPU_DEPLOY_DRIVER: labels.DRIVER_PREINSTALLED}),
        "drv-other-kernel": ("ubuntu", "22.04", "5.15.0-119-generic", {}),
        "drv-noble": ("ubuntu", "24.04", "6.8.0-45-generic", {}),
    }
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    try:
        for name, (os_id, version_id, kernel, extra) in nodes.items():
            _node(kube, name, os_id, version_id, kernel, **extra)
        sets = driver.driver_daemonsets(NS, cfg.cluster, group)
        for ds in sets:
            kube.create(ds)
        # Two of the four DaemonSets have a node to run on; the others none (no such OS and kernel here).
        placed = wait_for(lambda: (p := _placed(kube)) and len(p) == 2 and p, timeout=60,
                          what="the driver pods scheduled")
        assert placed == {
            "drv-jammy": "nvcr.io/nvidia/driver:535-5.15.0-105-generic-ubuntu22.04",
            "drv-rhel": "nvcr.io/nvidia/driver:535-5.14.0-427.13.1.el9_4.x86_64-rhel9.4"}
        for ds in sets:
            def observed(ds: dict[str, Any] = ds) -> Any:
                status = kube.get("apps/v1", "DaemonSet", ds["metadata"]["name"], NS).get("status", {})
                return status if status and status.get("observedGeneration") else None

            status = wait_for(observed, timeout=30, what="the DaemonSet controller's status")
            image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
            assert status.get("desiredNumberScheduled", 0) == (1 if image in placed.values() else 0), image
    finally:
        # The namespace first, its nodes after: kwok finishes a pod's deletion only while its node exists
        # (a pod of a deleted node waits for the pod garbage collector, a minute or more on a busy machine).
        kube.delete("v1", "Namespace", NS)
        wait_for(lambda: kube.get_or_none("v1", "Namespace", NS) is None, timeout=120, what=f"namespace {NS} gone")
        for name in nodes:
            kube.delete("v1", "Node", name)


UPGRADE_NS = "drv-upgrade"
UPGRADE_NODES = ("upg-a", "upg-b", "upg-c")


def _upgrade_group(version: str, **upgrade: Any) -> Any:
    cfg = load_stack_config({"cluster": {**CLUSTER, "namespace": UPGRADE_NS}, "nodeGroups": [
        {"name": "upg", "nodeSelector": {"matchLabels": {"pool": "upg"}},
         "gpu": {"model": "H100-80GB", "driver": {"source": "container", "version": version,
                                                  "osReleases": ["ubuntu22.04"], "upgrade": upgrade}}}]})
    return cfg.cluster, cfg.node_groups[0]


def _workload(kube: Kube, name: str, node: str, *, gpu: bool) -> None:
    """A ReplicaSet's pod on ``node`` (kwok runs it): one holding a GPU, or an ordinary one. Evicted, its
    replacement waits Pending while the node is cordoned (it tolerates only the GPU taint)."""
    resources = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    kube.create({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": UPGRADE_NS},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "work", "rs": name}},
                          "template": {"metadata": {"labels": {"app": "work", "rs": name}}, "spec": {
                              "nodeSelector": {"kubernetes.io/hostname": node},
                              "tolerations": [{"key": labels.GPU_TAINT_KEY, "operator": "Exists"}],
                              "containers": [{"name": "c", "image": "registry.example.com/work:1",
                                              "resources": resources}]}}}})


def _work_pods(kube: Kube) -> dict[str, str]:
    """The work pods bound to a node: name to node."""
    return {p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in kube.list("v1", "Pod", UPGRADE_NS, labelSelector="app=work") if p["spec"].get("nodeName")}


#: A GPU agent of the group (as the device plugin's DaemonSet is): it holds the driver open, so the upgrade
#: must stop it before the old driver can unload, and keep it away until the new one is up.
AGENT_DS = {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "device-plugin-upg", "namespace": UPGRADE_NS},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "device-plugin"}},
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": "device-plugin"}},
                                  "spec": {"nodeSelector": {"pool": "upg"},
                                           "tolerations": [{"key": labels.GPU_TAINT_KEY, "operator": "Exists"}],
                                           "containers": [{"name": "plugin",
                                                           "image": "registry.example.com/agent:1.0.0"}]}}}}


def _agent_pods(kube: Kube) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in kube.list("v1", "Pod", UPGRADE_NS, labelSelector="app.kubernetes.io/name=device-plugin"):
        if p["spec"].get("nodeName"):
            out.setdefault(p["spec"]["nodeName"], []).append(p)
    return out


def _driver_pods(kube: Kube) -> dict[str, dict[str, Any]]:
    return {p["spec"]["nodeName"]: p for p in kube.list("v1", "Pod", UPGRADE_NS,
                                                         labelSelector=driver.DRIVER_SELECTOR_LABEL)
            if p["spec"].get("nodeName")}



@pytest.fixture
def upgrade_cluster(kube: Kube, tmp_path: Path) -> Iterator[Path]:
    """Three kwok GPU nodes of one group (Deckhouse's NodeGroup ``gpu-upg`` too) with a driver DaemonSet at
    550.90.07 running on each, a GPU agent DaemonSet, a GPU pod and an ordinary pod per node (a
    ReplicaSet's, as a drain moves), and the controller's identity (its ServiceAccount and RBAC as the
    stack renders them for Deckhouse, which adds reading NodeGroups): the kubeconfig of its token."""
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": UPGRADE_NS}})
    try:
        for name in UPGRADE_NODES:
            create_kwok_node(kube, name, {"pool": "upg", labels.OS_RELEASE_ID: "ubuntu",
                                          labels.OS_RELEASE_VERSION_ID: "22.04", labels.NODE_GROUP: "upg",
                                          labels.DECKHOUSE_NODE_GROUP: "gpu-upg"},
                             [{"key": labels.GPU_TAINT_KEY, "value": labels.GPU_TAINT_VALUE, "effect": "NoSchedule"}],
                             gpus=8)
        for obj in driverupgrade.rbac(UPGRADE_NS, deckhouse=True):
            kube.apply(obj)
        kube.apply(AGENT_DS)
        cluster, group = _upgrade_group("550.90.07")
        for ds in driver.driver_daemonsets(UPGRADE_NS, cluster, group):
            kube.apply(ds)
        wait_for(lambda: len(p := _driver_pods(kube)) == 3 and all(pod_ready(x) for x in p.values()), timeout=60,
                 what="the driver pods ready on the three nodes")
        wait_for(lambda: len(_agent_pods(kube)) == 3, timeout=60, what="the GPU agent on the three nodes")
        for name in UPGRADE_NODES:
            _workload(kube, f"train-{name}", name, gpu=True)
            _workload(kube, f"web-{name}", name, gpu=False)
        wait_for(lambda: len(_work_pods(kube)) == 2 * len(UPGRADE_NODES), timeout=60, what="the work pods running")
        token = service_account_kube(kube, UPGRADE_NS, driverupgrade.COMPONENT)
        yield write_kubeconfig(token, tmp_path / "driver-upgrade.kubeconfig", user=driverupgrade.COMPONENT)
    finally:
        # The namespace first (the next test makes it again), its nodes after: kwok finishes a pod's
        # deletion only while its node exists.
        kube.delete("v1", "Namespace", UPGRADE_NS)
        kube.delete("deckhouse.io/v1", "NodeGroup", "gpu-upg")
        for obj in driverupgrade.rbac(UPGRADE_NS, deckhouse=True):
            if obj["kind"].startswith("Cluster"):
                kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        wait_for(lambda: kube.get_or_none("v1", "Namespace", UPGRADE_NS) is None, timeout=120,
                 what=f"namespace {UPGRADE_NS} gone")
        for name in UPGRADE_NODES:
            kube.delete("v1", "Node", name)
        wait_for(lambda: all(kube.get_or_none("v1", "Node", n) is None for n in UPGRADE_NODES), timeout=30,
                 what="the test's nodes gone")


def _states(kube: Kube) -> dict[str, str | None]:
    out = {}
    for name in UPGRADE_NODES:
        node = kube.get("v1", "Node", name)
        out[name] = node["metadata"].get("labels", {}).get(labels.DRIVER_UPGRADE_STATE)
    return out


@pytest.mark.timeout(300)
def test_a_version_change_walks_each_node_through_the_upgrade_one_at_a_time(kube: Kube, upgrade_cluster: Path
                                                                             ) -> None:
    old = {n: p["metadata"]["name"] for n, p in _driver_pods(kube).items()}
    old_work = set(_work_pods(kube))
    # An operator cordoned the last node before the upgrade: it stays cordoned after.
    kube.patch("v1", "Node", UPGRADE_NODES[-1], {"spec": {"unschedulable": True}})
    # A change that is not the driver's (the check's image) replaces no driver.
    other_image = {**CLUSTER, "agentImage": {"repository": "registry.example.com/agent", "tag": "1.0.1"}}
    cfg = load_stack_config({"cluster": {**other_image, "namespace": UPGRADE_NS}, "nodeGroups": [
        {"name": "upg", "nodeSelector": {"matchLabels": {"pool": "upg"}},
         "gpu": {"model": "H100-80GB", "driver": {"source": "container", "version": "550.90.07",
                                                  "osReleases": ["ubuntu22.04"]}}}]})
    for ds in driver.driver_daemonsets(UPGRADE_NS, cfg.cluster, cfg.node_groups[0]):
        kube.apply(ds)
    agent_kube = AgentKube.connect(upgrade_cluster)
    for _ in range(3):
        UpgradeController(agent_kube, UPGRADE_NS).run_round()
    assert set(_states(kube).values()) == {None}, "the check's image is not the driver's"
    before = agent_kube.calls
    UpgradeController(agent_kube, UPGRADE_NS).run_round()
    # An idle round: the driver DaemonSets, their pods, one list of the groups' nodes (not a read per node).
    assert agent_kube.calls - before == 3

    cluster, group = _upgrade_group("550.127.05")  # what `pulumi up` applies after the version change
    for ds in driver.driver_daemonsets(UPGRADE_NS, cluster, group):
        kube.apply(ds)
    seen: dict[str, list[str]] = {n: [] for n in UPGRADE_NODES}
    out_of_service_at_once = 0
    agents_with_old_driver_gone: list[str] = []
    looks_at_a_replacement = 0
    for _ in range(200):
        # A new controller every round: all it knows is on the nodes (a restart between any two steps).
        UpgradeController(agent_kube, UPGRADE_NS).run_round()
        states = _states(kube)
        _track(seen, states)
        in_flight = [n for n, s in states.items() if s and UpgradeState(s) in IN_FLIGHT]
        cordoned = [n for n in UPGRADE_NODES[:-1] if kube.get("v1", "Node", n)["spec"].get("unschedulable")]
        out_of_service_at_once = max(out_of_service_at_once, len(in_flight), len(cordoned))
        drivers, agents = _driver_pods(kube), _agent_pods(kube)
        for n in UPGRADE_NODES:  # the driver being replaced: no agent may hold it then
            pod = drivers.get(n)
            replaced = pod is None or pod["metadata"]["name"] != old[n] or pod["metadata"].get("deletionTimestamp")
            if replaced and states[n] in ("pod-restart-required", "validation-required"):
                looks_at_a_replacement += 1
                if agents.get(n):
                    agents_with_old_driver_gone.append(n)
        if all(s == UpgradeState.DONE.value for s in states.values()):
            break
        time.sleep(0.2)
    walk = ["upgrade-required", "drain-required", "pod-restart-required", "validation-required",
            "uncordon-required", "upgrade-done"]
    for n in UPGRADE_NODES:
        # Each node in order (a round may take two steps between looks: subsequence, ending done).
        assert seen[n][-1] == "upgrade-done", (n, seen[n])
        assert [s for s in walk if s in seen[n]] == seen[n], (n, seen[n])
    assert out_of_service_at_once == 1, "maxUnavailable 1: one node cordoned or in flight at a time"
    pods = _driver_pods(kube)
    assert set(pods) == set(UPGRADE_NODES) and not set(old.values()) & {p["metadata"]["name"] for p in pods.values()}
    image = "nvcr.io/nvidia/driver:550.127.05-ubuntu22.04"
    assert all(p["spec"]["containers"][0]["image"] == image and pod_ready(p) for p in pods.values())
    assert looks_at_a_replacement >= len(UPGRADE_NODES), "a replacement was seen on every node"
    assert not agents_with_old_driver_gone, "the GPU agents were stopped before the driver pod was replaced"
    # The drain moved every workload (drain: true); the nodes are schedulable again but the one an operator
    # cordoned; the upgrade's taint is gone and the agents are back.
    assert not old_work & {p["metadata"]["name"] for p in kube.list("v1", "Pod", UPGRADE_NS,
                                                                 labelSelector="app=work")}
    nodes = {n: kube.get("v1", "Node", n) for n in UPGRADE_NODES}
    assert [n for n, o in nodes.items() if o["spec"].get("unschedulable")] == [UPGRADE_NODES[-1]]
    assert not any(t["key"] == UPGRADE_TAINT_KEY for o in nodes.values() for t in o["spec"].get("taints") or [])
    wait_for(lambda: len(_agent_pods(kube)) == 3, timeout=60, what="the GPU agents back on every node")


@pytest.mark.timeout(300)
def test_at_rest_the_controller_waits_on_its_watches_and_a_version_change_wakes_it(
        kube: Kube, upgrade_cluster: Path) -> None:
    """The controller's loop with its own token: the stack's RBAC lets it watch the driver DaemonSets, their
    pods and the nodes (a refused watch would fall back to a list every few seconds). Settled, it sends
    nothing for as long as nothing changes, though its interval is 0.2 s; a version change starts the
    rollout within seconds, without a timer."""
    class Kept(UpgradeController):
        kept: list[Watcher] = []

        def watches(self, wake: Callable[[], None]) -> list[Watcher]:
            self.kept = super().watches(wake)
            return self.kept

    agent_kube = AgentKube.connect(upgrade_cluster)
    controller, stop = Kept(agent_kube, UPGRADE_NS), threading.Event()
    loop = threading.Thread(target=controller.run, args=(stop,), kwargs={"interval_s": 0.2, "resync_s": 3600},
                            daemon=True)
    loop.start()
    try:
        def watching() -> bool:
            kept = [w for w in controller.kept if isinstance(w, ListWatch)]
            return len(kept) == 3 and all(w.watches >= 1 for w in kept)

        wait_for(watching, timeout=30, what="the controller's three watches open")
        seen = [-1]

        def quiet() -> bool:  # the watches' first lists wake it once more: a second round at start
            was, seen[0] = seen[0], agent_kube.calls
            return was == seen[0]

        wait_for(quiet, timeout=30, interval=1.0, what="the controller settled")
        quiet_from = agent_kube.calls
        time.sleep(2)  # ten intervals
        assert agent_kube.calls == quiet_from, "settled: no round, no list, no re-watch"
        assert not any(isinstance(w, ListWatch) and w.poll_only for w in controller.kept), "a watch was refused"
        cluster_cfg, group = _upgrade_group("550.127.05")
        for ds in driver.driver_daemonsets(UPGRADE_NS, cluster_cfg, group):
            kube.apply(ds)
        wait_for(lambda: "upgrade-required" in _states(kube).values(), timeout=15,
                 what="the version change woke the controller")
    finally:
        stop.set()
        loop.join(15)
    assert not loop.is_alive(), "stopped, with its watches shut"


@pytest.mark.timeout(300)
def test_a_node_that_cannot_be_drained_fails_and_stops_the_rollout(kube: Kube, upgrade_cluster: Path) -> None:
    """A PodDisruptionBudget keeps the first node's GPU pod: its drain times out, the node is marked
    upgrade-failed with an Event, and no other node leaves service."""
    kube.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                 "metadata": {"name": "keep-work", "namespace": UPGRADE_NS},
                 "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "work"}}}})
    cluster, group = _upgrade_group("550.127.05", drainTimeoutSeconds=30)
    for ds in driver.driver_daemonsets(UPGRADE_NS, cluster, group):
        kube.apply(ds)
    controller = UpgradeController(AgentKube.connect(upgrade_cluster), UPGRADE_NS)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        controller.run_round()
        states = _states(kube)
        if "upgrade-failed" in states.values():
            break
        time.sleep(1)
    failed = [n for n, s in states.items() if s == "upgrade-failed"]
    assert len(failed) == 1, states
    (bad,) = failed
    for _ in range(3):  # further rounds start no other node
        controller.run_round()
    others = {n: s for n, s in _states(kube).items() if n != bad}
    assert set(others.values()) == {"upgrade-required"}, others
    node = kube.get("v1", "Node", bad)
    assert "drain did not finish" in node["metadata"]["annotations"]["gpu.nvidia-gpu.io/driver-upgrade-failure"]
    reasons = [e["reason"] for e in kube.list("v1", "Event", "default")
               if e["involvedObject"].get("name") == bad]
    assert "DriverUpgradeFailed" in reasons


def _nodegroup(disruptions: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": "gpu-upg"},
            "spec": {"nodeType": "Static", "disruptions": disruptions}}


@pytest.mark.timeout(300)
def test_on_deckhouse_the_nodegroups_disruption_settings_hold(kube: Kube, upgrade_cluster: Path) -> None:
    """The Deckhouse path (``--drain deckhouse``), the controller with its own RBAC (it reads the NodeGroup):
    outside the NodeGroup's automatic disruption windows no node leaves service; with ``approvalMode:
    Manual`` a node asks (``update.node.deckhouse.io/disruption-required``, and an Event says how to
    approve), stays in service until a person approves it (``disruption-approved``), then walks on, one at a
    time; the annotations are gone once it is done."""
    now = time.gmtime()
    closed = f"{(now.tm_hour + 2) % 24:02d}:00"  # a one-hour window two hours from now: closed now
    kube.apply(_nodegroup({"approvalMode": "Automatic", "automatic": {
        "windows": [{"from": closed, "to": f"{(now.tm_hour + 3) % 24:02d}:00"}]}}))
    cluster, group = _upgrade_group("550.127.05")
    for ds in driver.driver_daemonsets(UPGRADE_NS, cluster, group):
        kube.apply(ds)
    controller = UpgradeController(AgentKube.connect(upgrade_cluster), UPGRADE_NS, drain_mode=DrainMode.DECKHOUSE)
    for _ in range(3):
        controller.run_round()
    assert set(_states(kube).values()) == {UpgradeState.REQUIRED.value}, "outside the windows: nobody leaves"
    assert not any(kube.get("v1", "Node", n)["spec"].get("unschedulable") for n in UPGRADE_NODES)

    kube.apply(_nodegroup({"approvalMode": "Manual"}))
    for _ in range(3):
        controller.run_round()
    asking = {n: s for n, s in _states(kube).items() if s == UpgradeState.CORDON.value}
    assert len(asking) == 1, _states(kube)
    (first,) = asking
    node = kube.get("v1", "Node", first)
    assert labels.DISRUPTION_REQUIRED in node["metadata"]["annotations"]
    assert not node["spec"].get("unschedulable"), "nothing is disrupted before a person approves"
    reasons = [e["reason"] for e in kube.list("v1", "Event", "default") if e["involvedObject"].get("name") == first]
    assert "DriverUpgradeAwaitsApproval" in reasons
    seen: dict[str, list[str]] = {n: [s] if s else [] for n, s in _states(kube).items()}
    for _ in range(300):
        for name in UPGRADE_NODES:  # the person: approve a node that asks
            notes = kube.get("v1", "Node", name)["metadata"].get("annotations", {})
            if labels.DISRUPTION_REQUIRED in notes and labels.DISRUPTION_APPROVED not in notes:
                kube.patch("v1", "Node", name, {"metadata": {"annotations": {labels.DISRUPTION_APPROVED: ""}}})
        controller.run_round()
        states = _states(kube)
        _track(seen, states)
        if all(s == UpgradeState.DONE.value for s in states.values()):
            break
        time.sleep(0.2)
    for n in UPGRADE_NODES:
        assert seen[n][-1] == "upgrade-done" and "cordon-required" in seen[n], (n, seen[n])
        notes = kube.get("v1", "Node", n)["metadata"].get("annotations", {})
        assert labels.DISRUPTION_REQUIRED not in notes and labels.DISRUPTION_APPROVED not in notes, n
        assert not kube.get("v1", "Node", n)["spec"].get("unschedulable")


@pytest.mark.timeout(300)
def test_a_forged_upgrade_state_neither_stops_the_rollout_nor_skips_a_node(
        kube: Kube, cluster: ControlPlane, upgrade_cluster: Path) -> None:
    """Other clients write the upgrade state the controller keeps on the nodes: a person's ``kubectl label``
    (its own field manager) marks a node not yet started ``upgrade-failed``, and a node agent's transport
    (no field manager: the API server records ``python-urllib3``) marks the node being drained
    ``uncordon-required``. The real API server's ``managedFields`` names them, not the controller: the
    controller acts on neither (the first would stop the rollout, the second give the node back with its
    old driver), writes its own state back, says so in an Event, and the rollout goes through every node."""
    old = {n: p["metadata"]["name"] for n, p in _driver_pods(kube).items()}
    cluster_cfg, group = _upgrade_group("550.127.05")
    for ds in driver.driver_daemonsets(UPGRADE_NS, cluster_cfg, group):
        kube.apply(ds)
    agent_kube = AgentKube.connect(upgrade_cluster)
    UpgradeController(agent_kube, UPGRADE_NS).run_round()
    assert set(_states(kube).values()) == {"upgrade-required"}
    last = UPGRADE_NODES[-1]
    kube.request("PATCH", f"/api/v1/nodes/{last}",
                 {"metadata": {"labels": {labels.DRIVER_UPGRADE_STATE: "upgrade-failed"},
                               "annotations": {labels.DRIVER_UPGRADE_FAILURE: "forged"}}},
                 content_type="application/merge-patch+json", query={"fieldManager": "kubectl-label"})
    node_agent = AgentKube.connect(cluster.kubeconfig)  # the agent's transport, as a node agent writes
    forged_drain: str | None = None
    seen: dict[str, list[str]] = {n: [] for n in UPGRADE_NODES}
    for _ in range(200):
        # A new controller every round, as in the walk above: it trusts only what the nodes' managedFields say.
        UpgradeController(agent_kube, UPGRADE_NS).run_round()
        states = _states(kube)
        _track(seen, states)
        assert states[last] != "upgrade-failed", "the forged failure was put back at once"
        if forged_drain is None and (draining := [n for n, s in states.items() if s == "drain-required"]):
            forged_drain = draining[0]
            agent_nodes.patch_node(node_agent, forged_drain,
                                   {"metadata": {"labels": {labels.DRIVER_UPGRADE_STATE: "uncordon-required"}}})
            UpgradeController(agent_kube, UPGRADE_NS).run_round()
            assert _states(kube)[forged_drain] in ("drain-required", "pod-restart-required"), _states(kube)
            assert kube.get("v1", "Node", forged_drain)["spec"].get("unschedulable"), "still out of service"
            assert _driver_pods(kube)[forged_drain]["metadata"]["name"] == old[forged_drain], "not skipped"
        if all(s == "upgrade-done" for s in states.values()):
            break
        time.sleep(0.2)
    assert forged_drain is not None, seen
    assert all(s[-1] == "upgrade-done" for s in seen.values()), seen
    pods = _driver_pods(kube)
    assert not set(old.values()) & {p["metadata"]["name"] for p in pods.values()}, "every driver replaced"
    for name in UPGRADE_NODES:
        node = kube.get("v1", "Node", name)
        assert field_owners(node)[("labels", labels.DRIVER_UPGRADE_STATE)] == {FIELD_MANAGER}, node["metadata"]
        assert labels.DRIVER_UPGRADE_FAILURE not in node["metadata"].get("annotations", {})
    for name in (last, forged_drain):
        reasons = [e["reason"] for e in kube.list("v1", "Event", "default") if e["involvedObject"].get("name") == name]
        assert "DriverUpgradeStateForged" in reasons, (name, reasons)
