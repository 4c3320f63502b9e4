"""node_agent.kube.watch against a scripted API stand-in: bookmarks, 410 re-lists, refusals, backoff, stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from node_agent.kube import errors
from node_agent.kube.transport import Kube
from node_agent.kube.watch import ListWatch, WatchTiming, watch_once
from tests.kit.kubelet.common import wait_until
from tests.kit.loopback_api import LoopbackApi, Seen
from tests.kit.pauses import Pauses

PODS = "/api/v1/pods"
FAST = WatchTiming(request_timeout_s=2, watch_timeout_s=5, read_slack_s=2, backoff_initial_s=0.2,
                   backoff_max_s=0.4, relist_interval_s=0.05, jitter=0.5)


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class Script:
    """Lists answer ``lists`` in turn (the last repeated); each watch takes the next step of ``watches``:
    events to stream (the stream then ends), an HTTP status, or ``"hold"`` (stream nothing, stay open)."""

    def __init__(self, api: LoopbackApi, lists: list[str], watches: list[Any]) -> None:
        self.lists, self.watches = lists, watches
        self.release = threading.Event()
        api.routes[("GET", PODS)] = self

    def __call__(self, handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        h: Any = handler
        if seen.query.get("watch") != "true":
            rv = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
            h.answer(200, {"metadata": {"resourceVersion": rv}, "items": [pod("p", rv)]})
            return
        step = self.watches.pop(0) if self.watches else "hold"
        if isinstance(step, int):
            h.answer(step, {"kind": "Status", "code": step, "message": f"status {step}"})
            return
        h.stream([] if step == "hold" else step, hold=self.release if step == "hold" else None)


@pytest.fixture
def api() -> Iterator[LoopbackApi]:
    server = LoopbackApi()
    yield server
    server.close()


def calls(api: LoopbackApi) -> list[tuple[str, str | None]]:
    return [(s.query.get("watch", "list"), s.query.get("resourceVersion")) for s in api.requests("GET", PODS)]


def test_bookmarks_advance_the_version_and_410_lists_again(api: LoopbackApi) -> None:
    script = Script(api, lists=["10", "20"], watches=[
        [{"type": "ADDED", "object": pod("q", "11")},
         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}],
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}],
        410,
    ])
    listed: list[list[str]] = []
    changes: list[tuple[str, str]] = []
    w = ListWatch(Kube.for_url(api.url), PODS, field_selector="spec.nodeName=n1", timing=FAST,
                  on_list=lambda items: listed.append([i["metadata"]["name"] for i in items]),
                  on_event=lambda kind, obj: changes.append((kind, obj["metadata"]["name"])))
    w.start()
    try:
        wait_until(lambda: len(calls(api)) >= 7, what="the scripted steps")
    finally:
        script.release.set()
        w.stop()
    assert calls(api)[:7] == [
        ("list", None), ("true", "10"),  # the watch starts at the list's version
        ("true", "15"),                  # resumed from the bookmark, not from the last object; ERROR 410
        ("list", None), ("true", "20"),  # listed again at once; HTTP 410
        ("list", None), ("true", "20"),  # and again
    ]
    assert changes == [("ADDED", "q")]  # bookmarks are no changes
    assert listed[:3] == [["p"], ["p"], ["p"]]
    watches = [s.query for s in api.requests("GET", PODS) if s.query.get("watch")]
    assert all(q["allowWatchBookmarks"] == "true" and q["fieldSelector"] == "spec.nodeName=n1"
               and q["timeoutSeconds"] == "5" for q in watches)


def test_failures_back_off_doubling_capped_with_jitter(api: LoopbackApi) -> None:
    Script(api, lists=["1"], watches=[500] * 50)
    pauses = Pauses(limit=6)
    draws = iter([0.0, 0.5, 0.99, 0.0, 0.5, 0.0])
    w = ListWatch(Kube.for_url(api.url), PODS, timing=FAST, on_list=lambda items: None,
                  on_event=lambda kind, obj: None, pause=pauses, draw=lambda: next(draws))
    w.start()
    try:
        assert pauses.reached.wait(10), pauses.asked
    finally:
        w.stop()
    # 0.2 s doubling to the 0.4 s cap; each wait drawn from [(1 - 0.5) * wait, wait], never longer.
    assert pauses.asked == pytest.approx([0.2, 0.3, 0.4 * (1 - 0.5 * 0.99), 0.4, 0.3, 0.4])
    # Each failed watch relists before the next: one list per wait, no busy loop in between.
    assert w.lists == 6 and w.watches == 6
    assert calls(api)[:2] == [("list", None), ("true", "1")]


def test_a_refused_watch_relists_then_tries_again(api: LoopbackApi) -> None:
    Script(api, lists=["1"], watches=[403, 405, [{"type": "MODIFIED", "object": pod("p", "3")}]])
    changes: list[str] = []
    w = ListWatch(Kube.for_url(api.url), PODS, timing=FAST, on_list=lambda items: None,
                  on_event=lambda kind, obj: changes.append(obj["metadata"]["resourceVersion"]))
    w.start()
    try:
        wait_until(lambda: w.poll_only, what="the watch refused")
        wait_until(lambda: changes == ["3"], timeout=5, what="the watch tried again and delivered")
    finally:
        w.stop()
    kinds = [k for k, _ in calls(api)]
    assert kinds.count("list") >= 3 and not w.poll_only


def test_stop_cuts_an_open_watch_short(api: LoopbackApi) -> None:
    Script(api, lists=["1"], watches=["hold"])
    w = ListWatch(Kube.for_url(api.url), PODS, timing=WatchTiming(watch_timeout_s=60, read_slack_s=30),
                  on_list=lambda items: None, on_event=lambda kind, obj: None)
    w.start()
    wait_until(lambda: w.watches == 1 and len(calls(api)) == 2, what="the watch open")
    time.sleep(0.1)
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 1.0
    assert w.thread is not None and not w.thread.is_alive()


def test_watch_once_raises_the_class_of_an_error_event(api: LoopbackApi) -> None:
    api.routes[("GET", PODS)] = lambda h, seen: h.stream(  # type: ignore[attr-defined]
        [{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}}])
    with pytest.raises(errors.ServerError, match="etcd"):
        list(watch_once(Kube.for_url(api.url), PODS, resource_version="1", timeout_s=1, read_slack_s=1))
