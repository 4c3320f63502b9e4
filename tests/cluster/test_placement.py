"""Proof 2: with the dev stack applied for real, the DaemonSet controller and kube-scheduler place
every agent exactly on the nodes meant for it, and the GPU taint keeps ordinary pods off GPU nodes.

Nodes are kwok Nodes labelled and tainted as Deckhouse labels a NodeGroup's nodes: the group label
``node.deckhouse.io/group`` plus the ``nodeTemplate`` the stack patches onto the NodeGroup. Each
group gets a node that finished setup and one that has not; one ordinary worker has no GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from localcluster import Kube
from localcluster.objects import create_kwok_node, wait_for
from nvgpu import catalogue
from tests.cluster.stack import AppliedStack, rendered

NS = "nvidia-gpu"
SETUP = "node.deckhouse.io/gpu-setup-complete"
PREFIX = "place-"


def _group_nodes(stack: AppliedStack) -> dict[str, dict[str, Any]]:
    """Deckhouse NodeGroup name -> its nodeTemplate, from the stack's NodeGroup patches."""
    return {o["metadata"]["name"]: o["spec"]["nodeTemplate"] for o in stack.of_kind("NodeGroup")}


@pytest.fixture(scope="module")
def nodes(kube: Kube, dev_stack: AppliedStack) -> dict[str, dict[str, Any]]:
    """name -> Node for every node this module made (two per NodeGroup, one plain worker)."""
    made: dict[str, dict[str, Any]] = {}
    for ng, template in _group_nodes(dev_stack).items():
        for ready in (True, False):
            name = f"{PREFIX}{ng}-{'ready' if ready else 'new'}"
            labels = {"node.deckhouse.io/group": ng, **template.get("labels", {})}
            if ready:
                labels[SETUP] = ""
            made[name] = create_kwok_node(kube, name, labels, template.get("taints", []))
    made[f"{PREFIX}worker"] = create_kwok_node(kube, f"{PREFIX}worker", {"node.deckhouse.io/group": "worker"})
    return made


def _expected(stack: AppliedStack, nodes: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """DaemonSet -> the nodes it must run on, from the stack's intent (not from the DaemonSets)."""
    by_group = {o["metadata"]["name"]: o for o in stack.of_kind("NodeGroup")}
    config = rendered(stack.name).config
    assert config is not None
    # The MIG manager serves groups whose GPUs can do MIG (or whose model is not declared).
    mig_groups = {g.name for g in config.node_groups
                  if g.gpu.model is None or catalogue.get_model(g.gpu.model).mig_capable}
    want: dict[str, set[str]] = {}
    for ds in stack.of_kind("DaemonSet"):
        want[ds["metadata"]["name"]] = set()
    for name, node in nodes.items():
        labels = node["metadata"]["labels"]
        if SETUP not in labels:
            continue  # nothing but node setup may run before setup completes
        ng = labels["node.deckhouse.io/group"]
        if ng not in by_group:
            continue  # the plain worker: no GPU agent at all
        group = labels["gpu.nvidia-gpu.io/node-group"]
        want[f"gpu-labeller-{group}"].add(name)
        plugin = f"device-plugin-{group}" if f"device-plugin-{group}" in want else f"dra-kubelet-plugin-{group}"
        want[plugin].add(name)
        if f"gpu-exporter-{group}" in want:  # GPU metrics (cluster.monitoring), behind the same gate
            want[f"gpu-exporter-{group}"].add(name)
        if f"mps-control-daemon-{group}" in want:  # an MPS group's control daemon, beside its plugin
            want[f"mps-control-daemon-{group}"].add(name)
        if "nvidia.com/mig.config" in labels and group in mig_groups:
            want["nvidia-gpu-mig-manager"].add(name)
    return want


def _placed(kube: Kube, ds_name: str) -> set[str]:
    pods = kube.list("v1", "Pod", NS)
    return {p["spec"].get("nodeName", "") for p in pods
            if any(o.get("kind") == "DaemonSet" and o.get("name") == ds_name
                   for o in p["metadata"].get("ownerReferences", []))
            and p["spec"].get("nodeName", "").startswith(PREFIX)}


def test_agents_land_exactly_where_meant(kube: Kube, dev_stack: AppliedStack,
                                         nodes: dict[str, dict[str, Any]]) -> None:
    want = _expected(dev_stack, nodes)
    assert set(want) == {d["metadata"]["name"] for d in dev_stack.of_kind("DaemonSet")}
    assert all(want.values()), f"every DaemonSet has a node to run on: {want}"

    def settled() -> dict[str, set[str]] | None:
        got = {ds: _placed(kube, ds) for ds in want}
        return got if got == want else None

    try:
        wait_for(settled, timeout=60, interval=0.5, what="DaemonSet pods on exactly the intended nodes")
    except TimeoutError:
        got = {ds: _placed(kube, ds) for ds in want}
        diff = {ds: {"missing": sorted(want[ds] - got[ds]), "unexpected": sorted(got[ds] - want[ds])}
                for ds in want if want[ds] != got[ds]}
        pytest.fail(f"placement differs: {diff}")

    def running() -> bool:
        pods = [p for p in kube.list("v1", "Pod", NS) if p["spec"].get("nodeName", "").startswith(PREFIX)]
        return bool(pods) and all(p.get("status", {}).get("phase") == "Running" for p in pods)

    wait_for(running, timeout=60, interval=0.5, what="agent pods Running (kwok)")
    # The DaemonSet controller agrees: every DaemonSet is fully scheduled and available.
    for ds in dev_stack.of_kind("DaemonSet"):
        status = kube.get("apps/v1", "DaemonSet", ds["metadata"]["name"], NS)["status"]
        assert status.get("numberMisscheduled", 0) == 0, ds["metadata"]["name"]


def _pod(name: str, node: str, tolerate: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "c", "image": "registry.example/app@sha256:" + "0" * 64}],
    }
    if tolerate:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def test_gpu_taint_keeps_ordinary_pods_off(kube: Kube, nodes: dict[str, dict[str, Any]]) -> None:
    gpu_node = f"{PREFIX}gpu-a30-ready"  # tainted nvidia.com/gpu only
    kube.create(_pod("taint-plain", gpu_node, tolerate=False))
    kube.create(_pod("taint-tolerating", gpu_node, tolerate=True))
    wait_for(lambda: kube.get("v1", "Pod", "taint-tolerating", "default")["spec"].get("nodeName"),
             timeout=30, what="the tolerating pod scheduled")

    def refused() -> str | None:
        pod = kube.get("v1", "Pod", "taint-plain", "default")
        cond = next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"), None)
        return cond.get("message") if cond and cond["status"] == "False" else None

    message = wait_for(refused, timeout=30, what="the scheduler's refusal of the plain pod")
    # The a30 node's only taint is nvidia.com/gpu, which the other pod tolerates and lands with.
    assert "untolerated taint" in message
    assert not kube.get("v1", "Pod", "taint-plain", "default")["spec"].get("nodeName")
    # Without a node selector the ordinary pod goes to the worker, the only node without a GPU taint
    # among this module's nodes (other modules' nodes are GPU nodes too, or tainted).
    plain = _pod("taint-anywhere", "", tolerate=False)
    plain["spec"]["nodeSelector"] = {"node.deckhouse.io/group": "worker"}
    kube.create(plain)
    node = wait_for(lambda: kube.get("v1", "Pod", "taint-anywhere", "default")["spec"].get("nodeName"),
                    timeout=30, what="the ordinary pod scheduled")
    assert node == f"{PREFIX}worker"


def test_a_pod_asking_for_the_nvidia_runtime_lands_on_a_set_up_gpu_node(kube: Kube, dev_stack: AppliedStack,
                                                                       nodes: dict[str, dict[str, Any]]) -> None:
    """A pod as NVIDIA's docs write it (``runtimeClassName: nvidia``, no toleration, no selector) is admitted;
    RuntimeClass admission adds the class's selector and toleration, and the scheduler puts it on a GPU
    node whose setup finished."""
    (rc,) = dev_stack.of_kind("RuntimeClass")
    assert rc["metadata"]["name"] == "nvidia"
    pod = _pod("nvidia-runtime", "", tolerate=False)
    pod["spec"] = {"runtimeClassName": "nvidia", "containers": pod["spec"]["containers"]}
    kube.create(pod)
    admitted = kube.get("v1", "Pod", "nvidia-runtime", "default")["spec"]
    assert admitted["nodeSelector"] == {SETUP: ""}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in admitted["tolerations"]
    node = wait_for(lambda: kube.get("v1", "Pod", "nvidia-runtime", "default")["spec"].get("nodeName"),
                    timeout=30, what="the nvidia-runtime pod scheduled")
    assert SETUP in kube.get("v1", "Node", node)["metadata"]["labels"], node
    assert node != f"{PREFIX}worker" and not node.endswith("-new"), node
