"""The labeller's own-Node watch over HTTP (kmock: a real watch stream): the Node read from memory once
watched, hand edits seen without a read, a patch's answer kept, a stale copy dropped after a 409; and the
loop's request count at rest."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from node_agent.kube import transport
from node_agent.kube.nodeowner import LABELLER
from node_agent.kube.ownnode import OwnNodeWatch
from node_agent.kube.watch import WatchTiming
from node_agent.labeller.nodepatch import WatchedNodeApi
from tests.kit.fakehost import build_fake_host
from tests.kit.kmock import api, kmock_server
from tests.kit.kubelet.common import wait_until
from tests.node_agent.agent_testkit import ApiServer, Cli
from tests.node_agent.deviceplugin.test_nodewatch import connect

NODE = "gpu-1"
#: kmock never ends a watch by itself: a long read timeout, so no re-list happens during a test.
KMOCK = WatchTiming(request_timeout_s=5, watch_timeout_s=60, read_slack_s=5, backoff_initial_s=0.01,
                    backoff_max_s=0.05)


@pytest.fixture
def kmock_url() -> Iterator[str]:
    with kmock_server() as url:
        core = client.CoreV1Api(api(url))
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=NODE, labels={"team": "ml"})))
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="gpu-2", labels={"team": "other"})))
        yield url


@pytest.fixture
def account(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("t0k3n\n")
    return tmp_path


def _set(url: str, node: str, labels: dict[str, str | None]) -> None:
    client.CoreV1Api(api(url)).patch_node(node, {"metadata": {"labels": labels}},
                                          _content_type="application/merge-patch+json")


def test_the_node_is_read_from_the_watch_once_it_runs(kmock_url: str, account: Path) -> None:
    w = OwnNodeWatch(connect(kmock_url, account), NODE, timing=KMOCK)
    w.start()
    try:
        wait_until(lambda: w.watches >= 1, what="watch opened")
        assert w.current()["metadata"]["labels"]["team"] == "ml" and w.gets == 0
        _set(kmock_url, "gpu-2", {"team": "changed"})  # another node's change is not ours
        _set(kmock_url, NODE, {"team": "edited"})
        wait_until(lambda: w.current()["metadata"]["labels"]["team"] == "edited", timeout=3, what="hand edit seen")
        assert (w.gets, w.lists) == (0, 1)  # one GET at start; every change came over the watch
    finally:
        w.stop()


def test_a_patch_answer_is_kept_and_a_conflict_drops_the_copy(kmock_url: str, account: Path) -> None:
    kube = connect(kmock_url, account)
    w = OwnNodeWatch(kube, NODE, timing=KMOCK)  # not started: only offers and reads
    api_ = WatchedNodeApi(kube, w)
    assert api_.labels(NODE)["team"] == "ml" and w.gets == 1
    api_.patch_labels(NODE, {"nvidia.com/gpu.present": "true"}, writer=LABELLER)
    assert api_.labels(NODE)["nvidia.com/gpu.present"] == "true" and w.gets == 1  # the patch's answer
    w.offer({"metadata": {"name": NODE, "resourceVersion": "10", "labels": {"v": "10"}}})
    w.offer({"metadata": {"name": NODE, "resourceVersion": "9", "labels": {"v": "9"}}})
    assert api_.labels(NODE) == {"v": "10"}  # a watch event a patch overtook never replaces the newer copy
    w.invalidate()
    assert api_.labels(NODE)["team"] == "ml" and w.gets == 2


def test_a_labeller_at_rest_makes_no_request(tmp_path: Path, cli: Cli, api_server: ApiServer,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Six runs of the loop with the Node watched: the first labels (one read, one patch, one watch); the
    rest find nothing changed and ask the API server nothing (NVIDIA's GFD stamped its Node every run, and
    ours read it twice and patched it once a run)."""
    host = build_fake_host(tmp_path, "l4x2")
    seen: list[tuple[str, str]] = []
    real_request, real_stream = transport.Kube.request, transport.Kube.stream

    def request(self: transport.Kube, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        seen.append((method, path))
        return real_request(self, method, path, *args, **kwargs)

    def stream(self: transport.Kube, path: str, **kwargs: Any) -> Any:
        seen.append(("WATCH", path))
        return real_stream(self, path, **kwargs)

    monkeypatch.setattr(transport.Kube, "request", request)
    monkeypatch.setattr(transport.Kube, "stream", stream)
    started = time.monotonic()
    code, _ = cli(host.root, "simulated:l4x2", "labels", "--patch-node", "--loop", "--interval", "0.3",
                  "--iterations", "6", node="gpu-node-1", kubeconfig=api_server.kubeconfig)
    assert code == 0 and time.monotonic() - started >= 1.5
    assert api_server.labels("gpu-node-1")["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert sorted(m for m, p in seen if "/nodes" in p) == ["GET", "PATCH", "WATCH"], seen
