"""node_agent.kube against the real API server: Node merge patches, the taint precondition, Events, error
classes, and a list-then-watch that keeps delivering across an API server restart."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import ControlPlane, Kube
from localcluster.objects import wait_for, write_kubeconfig
from node_agent.kube import errors, events, nodes
from node_agent.kube.transport import Kube as AgentKube
from node_agent.kube.watch import ListWatch, WatchTiming

NODE = "kube-layer-node"
TIMING = WatchTiming(request_timeout_s=5, watch_timeout_s=30, read_slack_s=5, backoff_initial_s=0.1,
                     backoff_max_s=1.0)


@pytest.fixture
def node(kube: Kube) -> Iterator[str]:
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"keep": "me"}},
                 "spec": {"taints": [{"key": "other.example.com/t", "value": "x", "effect": "NoSchedule",
                                      "timeAdded": "2026-01-01T00:00:00Z"}]}})
    yield NODE
    kube.delete("v1", "Node", NODE)


@pytest.fixture
def agent(kube: Kube, tmp_path: Path) -> AgentKube:
    return AgentKube.connect(write_kubeconfig(kube, tmp_path / "kubeconfig"))


def test_merge_patches_keep_others_keys_and_the_taint_list_is_guarded(agent: AgentKube, kube: Kube,
                                                                     node: str) -> None:
    read = nodes.get_node(agent, node)
    after = nodes.patch_node(agent, node, nodes.patch_body(labels={"ours": "1"}, annotations={"a": "b"}))
    assert nodes.labels_of(after)["keep"] == "me" and nodes.labels_of(after)["ours"] == "1"
    after = nodes.patch_node(agent, node, nodes.patch_body(labels={"ours": None}))
    assert "ours" not in nodes.labels_of(after) and nodes.annotations_of(after)["a"] == "b"
    # The taint list computed from the first read: the Node moved on since, so the server refuses it.
    stale = nodes.patch_body(taints=[*nodes.taints_of(read), {"key": "ours", "effect": "NoSchedule"}],
                             resource_version=read["metadata"]["resourceVersion"])
    with pytest.raises(errors.Conflict):
        nodes.patch_node(agent, node, stale)
    for _ in range(3):  # the node lifecycle controller may write the Node too: re-read and decide again
        fresh = nodes.get_node(agent, node)
        body = nodes.patch_body(taints=[*nodes.taints_of(fresh), {"key": "ours", "effect": "NoSchedule"}],
                                resource_version=fresh["metadata"]["resourceVersion"])
        try:
            taints = {t["key"]: t for t in nodes.taints_of(nodes.patch_node(agent, node, body))}
            break
        except errors.Conflict:
            continue
    else:
        pytest.fail("the Node kept changing under three fresh reads")
    # The other controller's taint given back as it was, timeAdded included.
    assert taints["other.example.com/t"]["timeAdded"] == "2026-01-01T00:00:00Z" and "ours" in taints


def test_error_classes_and_events(agent: AgentKube, kube: Kube, node: str) -> None:
    with pytest.raises(errors.NotFound):
        nodes.get_node(agent, "no-such-node")
    with pytest.raises(errors.Invalid):
        nodes.patch_node(agent, node, {"spec": {"taints": [{"key": "bad key!", "effect": "NoSchedule"}]}})
    uid = nodes.get_node(agent, node)["metadata"]["uid"]
    events.post_node_event(agent, node, uid, component="test", reason="Probe", message="x" * 2000, warning=True)
    # Ours only: the node lifecycle controller records the Node's own events (RegisteredNode) meanwhile.
    mine = [e for e in kube.list("v1", "Event", "default") if e["involvedObject"]["name"] == node
            and e.get("source", {}).get("component") == "test"]
    assert [(e["reason"], e["type"], len(e["message"])) for e in mine] == [("Probe", "Warning", 1024)]


def test_list_watch_delivers_changes_across_an_api_server_restart(agent: AgentKube, kube: Kube, node: str,
                                                                  control_plane: ControlPlane) -> None:
    values: list[str | None] = []
    lock = threading.Lock()

    def record(obj: dict[str, Any]) -> None:
        with lock:
            values.append(nodes.label_of(obj, "watched"))

    def record_all(items: list[dict[str, Any]]) -> None:
        for item in items:
            record(item)

    w = ListWatch(agent, nodes.NODES, field_selector=f"metadata.name={node}", timing=TIMING,
                  on_list=record_all, on_event=lambda kind, obj: record(obj))
    w.start()
    try:
        wait_for(lambda: w.watches >= 1, timeout=10, interval=0.05, what="the watch opened")
        kube.patch("v1", "Node", node, {"metadata": {"labels": {"watched": "before"}}})
        wait_for(lambda: values[-1:] == ["before"], timeout=5, interval=0.05, what="the change over the watch")
        assert w.lists == 1
        control_plane.restart_apiserver()
        kube.patch("v1", "Node", node, {"metadata": {"labels": {"watched": "after"}}})
        wait_for(lambda: values[-1:] == ["after"], timeout=30, interval=0.1, what="the change after the restart")
    finally:
        w.stop()
    assert w.thread is not None and not w.thread.is_alive()
