"""Watches this node's config label, so a changed label switches the plugin's config within a second.

Polling the Node every few seconds costs one GET per interval on every GPU node and still reacts late.
:class:`NodeLabelWatch` lists the own Node once (``fieldSelector=metadata.name=<node>``), then watches
from the list's ``resourceVersion``, keeping the version current from every event and bookmark. The
API server ends each watch after ``timeoutSeconds``; the next one resumes from the last version.

Failures, by kind:

* ``410 Gone`` (as the HTTP status or as an ``ERROR`` event): the version is too old; list again.
* any other error or a dead connection (the read timeout is longer than the watch's own): back off
  (doubling, capped) and list again before watching, so a change made meanwhile is not missed.
* ``403``/``405`` on the watch (the ServiceAccount may ``get`` but not ``watch`` nodes): re-list every
  ``relist_interval_s`` and try the watch again after the failure backoff (doubling, capped), because
  a refusal can pass (an API server just restarted, a ClusterRole being replaced).

The last value is cached, so :meth:`NodeLabelWatch.label` costs nothing once the watch runs; each change
calls the subscribers (the config watcher's ``wake``). Only ``urllib`` and ``json``, like the label GET,
to keep the plugin's memory small. Credentials: the pod's ServiceAccount, or the agent's ``--kubeconfig``
when it has one (:class:`~node_agent.deviceplugin.nodelabel.ApiEndpoint`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.deviceplugin.nodelabel import CONFIG_LABEL, SERVICE_ACCOUNT, ApiEndpoint, node_label

log = logging.getLogger(__name__)

class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class WatchFailed(Exception):
    """The API server ended the watch with an ``ERROR`` event other than 410."""


@dataclass(frozen=True)
class WatchTiming:
    #: Seconds one GET (the list) may take.
    request_timeout_s: float = 10.0
    #: ``timeoutSeconds`` of one watch request: the server ends the stream then and we resume from the last version.
    watch_timeout_s: float = 300.0
    #: Extra seconds to wait for the next line before taking the connection for dead.
    read_slack_s: float = 30.0
    #: First wait after a failure; it doubles up to ``backoff_max_s`` and resets once a watch delivers.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    #: Seconds between re-lists when the server refuses to watch. A refused watch is tried again with
    #: the failure backoff above (a refusal can pass: an API server whose authorizer has not synced
    #: yet after a restart, a ClusterRole being replaced by ``pulumi up``).
    relist_interval_s: float = 5.0


class NodeLabelWatch:
    """A :class:`~node_agent.deviceplugin.nodelabel.LabelSource` kept current by a watch on the own Node."""

    def __init__(self, node_name: str, key: str = CONFIG_LABEL, *, server: str | None = None,
                 account_dir: Path = SERVICE_ACCOUNT, kubeconfig: Path | None = None,
                 timing: WatchTiming | None = None) -> None:
        self.api = ApiEndpoint(server, account_dir, kubeconfig=kubeconfig)
        self.node_name = node_name
        self.key = key
        self.timing = timing or WatchTiming()
        selector = urllib.parse.quote(f"metadata.name={node_name}", safe="")
        self._list_path = f"/api/v1/nodes?fieldSelector={selector}"
        self._lock = threading.Lock()
        self._value: str | None = None
        self._synced = False
        self._subscribers: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None  #: the open watch response, so stop() can cut it short
        #: Counters for tests and logs: lists made, watches opened.
        self.lists = 0
        self.watches = 0
        self.events = 0
        self.poll_only = False

    # -- LabelSource ---------------------------------------------------------------------------------
    def label(self) -> str | None:
        """The label's value: cached once listed, else one list now (raises ``OSError`` when unreadable)."""
        with self._lock:
            if self._synced:
                return self._value
        value, _ = self._list()
        self._set(value)
        return value

    def subscribe(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (from the watch thread) after every change of the label's value."""
        self._subscribers.append(fn)

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-label-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, cutting an open watch short (it could otherwise block for a read timeout)."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # urllib has no way to interrupt a blocked read; shutting the socket down does (HTTP and TLS).
            with contextlib.suppress(AttributeError, OSError):
                resp.fp.raw._sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- internals -----------------------------------------------------------------------------------
    def _set(self, value: str | None) -> None:
        with self._lock:
            if self._synced and self._value == value:
                return
            first, self._synced, self._value = not self._synced, True, value
        if first:
            return  # the first value read is the starting point, not a change
        log.info("event=node-label-changed label=%s value=%s", self.key, value)
        for fn in self._subscribers:
            fn()

    def _list(self) -> tuple[str | None, str]:
        """The label and the list's resourceVersion (the label is unset when the Node is not listed)."""
        self.lists += 1
        with self.api.open(self._list_path, self.timing.request_timeout_s) as resp:
            data = json.load(resp)
        value = None
        for item in data.get("items") or []:
            if (item.get("metadata") or {}).get("name") == self.node_name:
                value = node_label(item, self.key)
        return value, str((data.get("metadata") or {}).get("resourceVersion") or "")

    def _events(self, resource_version: str) -> Iterator[dict[str, Any]]:
        query = {"watch": "true", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(max(1, int(self.timing.watch_timeout_s)))}
        if resource_version:
            query["resourceVersion"] = resource_version
        path = f"{self._list_path}&{urllib.parse.urlencode(query)}"
        self.watches += 1
        with self.api.open(path, self.timing.watch_timeout_s + self.timing.read_slack_s) as resp:
            self._resp = resp
            try:
                if self._stop.is_set():
                    return
                for line in resp:
                    if self._stop.is_set():
                        return
                    if line.strip():
                        yield json.loads(line)
            finally:
                self._resp = None

    def _watch(self, resource_version: str) -> str:
        """Follow one watch request; returns the last resourceVersion seen when the server ends it."""
        rv = resource_version
        for event in self._events(rv):
            self.events += 1
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(str(obj.get("message", "")))
                raise WatchFailed(f"{obj.get('code')} {obj.get('reason', '')}: {obj.get('message', '')}")
            meta = obj.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or rv)
            if kind == "BOOKMARK" or meta.get("name") != self.node_name:
                continue  # a server that ignores the field selector sends other nodes too
            self._set(None if kind == "DELETED" else node_label(obj, self.key))
        return rv

    def _run(self) -> None:
        t = self.timing
        rv: str | None = None
        backoff = t.backoff_initial_s
        watch_retry = t.backoff_initial_s  #: while refused: the wait before the next watch attempt
        retry_at = 0.0
        while not self._stop.is_set():
            delivered = self.events
            try:
                if rv is None:
                    value, rv = self._list()
                    self._set(value)
                if self.poll_only:
                    now = time.monotonic()
                    if now < retry_at:
                        rv = None
                        self._stop.wait(min(t.relist_interval_s, retry_at - now))
                        continue
                    log.info("event=node-watch-retry")
                    self.poll_only = False
                rv = self._watch(rv)
                backoff = t.backoff_initial_s  # the stream ran its course: resume at once
                watch_retry = t.backoff_initial_s
            except WatchExpired as e:
                log.info("event=node-watch-expired action=relist detail=%s", e)
                rv = None
            except urllib.error.HTTPError as e:
                e.close()
                if e.code == 410:
                    log.info("event=node-watch-expired action=relist")
                    rv = None
                    continue
                if e.code in (403, 405) and rv is not None:
                    log.warning("event=node-watch-refused status=%d action=relist-every interval_s=%.0f "
                                "watch_retry_in_s=%.1f", e.code, t.relist_interval_s, watch_retry)
                    self.poll_only = True
                    retry_at = time.monotonic() + watch_retry
                    watch_retry = min(watch_retry * 2, t.backoff_max_s)
                    continue
                backoff = self._back_off(f"HTTP {e.code} {e.reason}", backoff)
                rv = None
            except (OSError, ValueError, WatchFailed) as e:  # URLError, timeouts, resets, bad JSON
                if self.events != delivered:
                    backoff = t.backoff_initial_s  # the watch worked for a while: a fresh failure
                backoff = self._back_off(repr(e), backoff)
                rv = None

    def _back_off(self, error: str, backoff: float) -> float:
        log.warning("event=node-watch-failed error=%s action=relist retry_in_s=%.1f", error, backoff)
        self._stop.wait(backoff)
        return min(backoff * 2, self.timing.backoff_max_s)
