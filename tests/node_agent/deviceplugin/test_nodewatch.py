"""The node label watch over HTTP: against kmock (a real watch stream) and a scripted API server
(resourceVersion handling, 410 Gone as an event and as a status, errors with backoff, watch refused)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from node_agent.deviceplugin.nodelabel import CONFIG_LABEL
from node_agent.deviceplugin.nodewatch import NodeLabelWatch, WatchTiming
from node_agent.kube.errors import Unreachable
from node_agent.kube.transport import Kube
from tests.kit.kmock import api, kmock_server
from tests.kit.kubelet.common import wait_until
from tests.kit.pauses import Pauses
from tests.node_agent.deviceplugin.plugin_process import switching_plugin

NODE = "gpu-1"
FAST = WatchTiming(request_timeout_s=5, watch_timeout_s=1, read_slack_s=1, backoff_initial_s=0.01,
                   backoff_max_s=0.05, relist_interval_s=0.05)
#: kmock never ends a watch by itself: a long read timeout, so no re-list happens during a test.
KMOCK = WatchTiming(request_timeout_s=5, watch_timeout_s=60, read_slack_s=5, backoff_initial_s=0.01,
                    backoff_max_s=0.05)



@pytest.fixture
def account(tmp_path: Path) -> Path:
    """A kubeconfig with a token file, as the watch reads credentials through ``node_agent.kube.credentials``."""
    (tmp_path / "token").write_text("t0k3n\n")
    return tmp_path


def connect(url: str, account: Path) -> Kube:
    path = account / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: t\n"
                    f"clusters: [{{name: t, cluster: {{server: '{url}'}}}}]\n"
                    "users: [{name: t, user: {tokenFile: token}}]\n"
                    "contexts: [{name: t, context: {cluster: t, user: t}}]\n")
    return Kube.connect(path)


@pytest.fixture
def kmock_url() -> Iterator[str]:
    with kmock_server() as url:
        core = client.CoreV1Api(api(url))
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=NODE, labels={CONFIG_LABEL: "a"})))
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="gpu-2", labels={CONFIG_LABEL: "z"})))
        yield url


def set_label(url: str, node: str, value: str | None) -> None:
    client.CoreV1Api(api(url)).patch_node(node, {"metadata": {"labels": {CONFIG_LABEL: value}}},
                                          _content_type="application/merge-patch+json")


def test_watch_follows_the_label_over_http(kmock_url: str, account: Path) -> None:
    w = NodeLabelWatch(NODE, kube=connect(kmock_url, account), timing=KMOCK)
    changes: list[str | None] = []
    w.subscribe(lambda: changes.append(w.label()))
    assert w.label() == "a"
    w.start()
    try:
        wait_until(lambda: w.watches >= 1, what="watch opened")
        lists = w.lists
        set_label(kmock_url, "gpu-2", "other")  # another node's change is not ours
        set_label(kmock_url, NODE, "b")
        wait_until(lambda: w.label() == "b", timeout=3, what="label b")
        set_label(kmock_url, NODE, None)
        wait_until(lambda: w.label() is None, timeout=3, what="label removed")
        assert changes == ["b", None]
        assert w.lists == lists  # the changes came over the watch, not from polling
    finally:
        w.stop()


def test_config_switches_live_when_the_watched_label_changes(kmock_url: str, account: Path, tmp_path: Path,
                                                             sock_dir: Path) -> None:
    """The whole command path: label watch -> config watcher woken -> plugins rebuilt under the new name.
    File polling is slowed to a minute, so only the watch can make the switch in time."""
    labels = NodeLabelWatch(NODE, kube=connect(kmock_url, account), timing=KMOCK)
    with switching_plugin(tmp_path, sock_dir, labels, default="a", poll_interval="60") as (proc, kubelet):
        labels.subscribe(proc.watcher.wake)
        labels.start()
        try:
            kubelet.wait_registered({"nvidia.com/gpu"})
            wait_until(lambda: labels.watches >= 1, what="watch opened")
            start = time.monotonic()
            set_label(kmock_url, NODE, "shared")
            kubelet.wait_registered({"nvidia.com/gpu.shared"}, timeout=5, after=start)
            kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4)
        finally:
            labels.stop()


# -- a scripted API server for what kmock lacks (resourceVersion, 410, refusals) ---------------------------------
class ScriptedApi:
    """Answers lists from ``lists`` and each watch with the next entry of ``watches``: a list of events
    (the stream then ends, as at ``timeoutSeconds``) or an HTTP status. Records every request's query."""

    def __init__(self, lists: list[tuple[str, str | None]], watches: list[list[dict[str, Any]] | int]) -> None:
        self.lists = lists
        self.watches = watches
        self.requests: list[dict[str, str]] = []
        self.done = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(url.query))
                q["auth"] = self.headers.get("Authorization", "")
                outer.requests.append(q)
                assert url.path == "/api/v1/nodes" and q["fieldSelector"] == f"metadata.name={NODE}"
                if q.get("watch") != "true":
                    rv, value = outer.lists.pop(0) if len(outer.lists) > 1 else outer.lists[0]
                    return self._json(200, {"kind": "NodeList", "metadata": {"resourceVersion": rv},
                                            "items": [node(rv, value)]})
                if not outer.watches:
                    outer.done.set()
                    return self._json(403, {"kind": "Status", "code": 403})
                step = outer.watches.pop(0)
                if isinstance(step, int):
                    return self._json(step, {"kind": "Status", "code": step})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                for ev in step:
                    self.wfile.write(json.dumps(ev).encode() + b"\n")
                    self.wfile.flush()

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def node(rv: str, value: str | None, name: str = NODE) -> dict[str, Any]:
    labels = {CONFIG_LABEL: value} if value is not None else {}
    return {"kind": "Node", "metadata": {"name": name, "resourceVersion": rv, "labels": labels}}


def test_resource_versions_expiry_errors_and_refusal(account: Path) -> None:
    api_server = ScriptedApi(
        lists=[("10", "x"), ("20", "z"), ("30", "z2"), ("40", "z3")],
        watches=[
            [{"type": "MODIFIED", "object": node("11", "y")},
             {"type": "MODIFIED", "object": node("12", "ignored", name="gpu-2")},
             {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "15"}}}],
            [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}],
            410,
            500,
            [{"type": "DELETED", "object": node("41", "z3")}],
            # then: 403 (watch refused) -> re-list every relist_interval_s, retry the watch with backoff
        ])
    seen: list[str | None] = []
    w = NodeLabelWatch(NODE, kube=connect(api_server.url, account), timing=FAST)
    w.subscribe(lambda: seen.append(w.label()))
    w.start()
    try:
        assert api_server.done.wait(10)
        wait_until(lambda: w.poll_only and w.lists >= 7, what="re-listing after the refused watch")
    finally:
        w.stop()
        api_server.close()
    reqs = [(r.get("watch", "list"), r.get("resourceVersion")) for r in api_server.requests]
    assert reqs[:10] == [
        ("list", None), ("true", "10"),  # watch from the list's version
        ("true", "15"),                 # resumed from the bookmark after the stream ended; ERROR 410 event
        ("list", None), ("true", "20"),  # re-listed; HTTP 410
        ("list", None), ("true", "30"),  # re-listed; HTTP 500: backoff, list again
        ("list", None), ("true", "40"),  # DELETED, stream ends
        ("true", "41"),                  # 403: watch refused
    ]
    assert all(r["auth"] == "Bearer t0k3n" for r in api_server.requests)
    assert all(r.get("timeoutSeconds") == "1" and r.get("allowWatchBookmarks") == "true"
               for r in api_server.requests if "watch" in r)
    # Changes only (the first list is the starting point); the deleted Node has no label.
    assert seen[:5] == ["y", "z", "z2", "z3", None]
    # After the refusal: re-lists, and now and then the watch again (a refusal can pass, as right after an
    # API server restart), each attempt from the list just before it.
    tail = reqs[10:]
    assert tail[0][0] == "list" and {k for k, _ in tail} == {"list", "true"}, tail
    assert all(tail[i - 1][0] == "list" for i, (k, _) in enumerate(tail) if k == "true"), tail


def test_unreachable_api_backs_off_and_label_raises(account: Path) -> None:
    pauses = Pauses(limit=6)
    w = NodeLabelWatch(NODE, kube=connect("http://127.0.0.1:9", account), pause=pauses,
                       timing=WatchTiming(request_timeout_s=1, backoff_initial_s=0.05, backoff_max_s=0.2))
    with pytest.raises(Unreachable):
        w.label()
    lists = w.lists
    w.start()
    try:
        assert pauses.reached.wait(10), pauses.asked
    finally:
        w.stop()
    # One list per wait (not a busy loop), each wait at most the doubled backoff and never past its 0.2 s cap.
    assert w.lists - lists == 6
    assert all(0 < p <= min(0.05 * 2 ** i, 0.2) for i, p in enumerate(pauses.asked)), pauses.asked
