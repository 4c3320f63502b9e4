"""The migration preflight against the real API server, DaemonSet controller and kwok: a GPU-Operator-like
device plugin placed on a node group's nodes is reported (by its pods and its selector, read through
``KubeReader``), and the handover the message gives (the operator's per-node deploy label set to
``false``) makes the DaemonSet controller take it off those nodes and the finding go away."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from localcluster import Kube
from localcluster.objects import create_kwok_node, wait_for
from nvgpu.stackconfig import StackConfig, load_stack_config
from nvidia_gpu.preflight import migration
from nvidia_gpu.preflight.model import Finding, Severity
from nvidia_gpu.preflight.reader import KubeReader

DEPLOY = migration.deploy_label(migration.Role.DEVICE_PLUGIN)
NAME = "nvidia-device-plugin-daemonset"


@pytest.fixture()
def operator_cluster(kube: Kube) -> Iterator[tuple[str, str, list[str]]]:
    """A namespace holding an operator-style device plugin DaemonSet, three nodes of a fresh pool and one
    node outside it, every one labelled for the operand as the operator labels GPU nodes."""
    tag = secrets.token_hex(3)
    namespace, pool = f"gpu-operator-{tag}", f"migrate-{tag}"
    nodes = [f"{pool}-{i}" for i in range(3)]
    outside = f"{pool}-other"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        for name in nodes:
            create_kwok_node(kube, name, {"pool": pool, DEPLOY: "true"})
        create_kwok_node(kube, outside, {"pool": f"{pool}-cpu", DEPLOY: "true"})
        # As assets/state-device-plugin/0500_daemonset.yaml renders it (NVIDIA/gpu-operator).
        kube.create({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": NAME, "namespace": namespace, "labels": {"app": NAME}},
            "spec": {"selector": {"matchLabels": {"app": NAME}}, "template": {
                "metadata": {"labels": {"app": NAME}},
                "spec": {"nodeSelector": {DEPLOY: "true"},
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                         "priorityClassName": "system-node-critical",
                         "containers": [{"name": "nvidia-device-plugin",
                                         "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}]}}},
        })
        yield namespace, pool, nodes
    finally:
        kube.delete("v1", "Namespace", namespace)
        for name in [*nodes, outside]:
            kube.delete("v1", "Node", name)


def _pods_on(kube: Kube, namespace: str) -> set[str]:
    return {p["spec"].get("nodeName", "") for p in kube.list("v1", "Pod", namespace, labelSelector=f"app={NAME}")
            if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}


def _config(pool: str) -> StackConfig:
    return load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "agentImage": "registry.example.com/agent:1.0"},
        "nodeGroups": [{"name": "migrating", "nodeSelector": {"matchLabels": {"pool": pool}}}],
    })


def _about(found: list[Finding], namespace: str) -> list[Finding]:
    return [f for f in found if f.subject == f"DaemonSet/{namespace}/{NAME}"]


def test_an_operator_device_plugin_is_reported_until_its_nodes_are_handed_over(
        kube: Kube, operator_cluster: tuple[str, str, list[str]]) -> None:
    namespace, pool, nodes = operator_cluster
    wait_for(lambda: _pods_on(kube, namespace) >= set(nodes), timeout=90, interval=0.5,
             what="the DaemonSet controller's device plugin pods Running on the pool (kwok)")
    reader, config = KubeReader(kube), _config(pool)

    [f] = _about(migration.findings(config, reader), namespace)
    assert f.severity is Severity.ERROR
    assert f"3 node(s) of node group 'migrating' ({', '.join(nodes)})" in f.message
    command = migration.label_command(config.node_groups[0], DEPLOY)
    assert command == f"kubectl label nodes -l 'pool={pool}' {DEPLOY}=false --overwrite" and command in f.message

    for name in nodes:  # the handover, as the command does it
        kube.patch("v1", "Node", name, {"metadata": {"labels": {DEPLOY: "false"}}})
    wait_for(lambda: not _about(migration.findings(config, reader), namespace), timeout=90, interval=0.5,
             what="the device plugin gone from the handed-over nodes")
    assert _pods_on(kube, namespace) & set(nodes) == set()
    assert f"{pool}-other" in _pods_on(kube, namespace)  # the operator keeps serving the other nodes
