"""The agent's one watch helper: list, then watch from the list's resourceVersion, for as long as it runs.

Polling costs one GET per interval on every GPU node and still reacts late; a watch delivers a change
within milliseconds. :func:`watch_once` follows one watch request (``allowWatchBookmarks``, so the
version keeps moving while nothing of ours changes, and a resume after the server's ``timeoutSeconds``
is cheap). :class:`ListWatch` runs list and watch in a loop on its own thread; failures, by kind:

* :class:`~node_agent.kube.errors.Gone` (410, as the HTTP status or as an ``ERROR`` event): the version
  is older than the API server keeps; list again, at once.
* :class:`~node_agent.kube.errors.Forbidden`/:class:`~node_agent.kube.errors.MethodNotAllowed` on the
  watch while the list works (a role may ``get`` and ``list`` but not ``watch``): list every
  ``relist_interval_s``, and try the watch again after the failure backoff, because a refusal can pass
  (an API server whose authorizer has not synced yet after a restart, a ClusterRole being replaced).
* anything else (a dead connection: the read timeout is the watch's own plus ``read_slack_s``; a 5xx;
  an API server restarting): back off, doubling up to ``backoff_max_s`` with jitter so that the
  DaemonSet's pods on every node do not come back in step, then list again before watching, so a
  change made meanwhile is not missed. The backoff resets once a watch has delivered.

:meth:`ListWatch.stop` ends the loop at once, shutting an open stream
(:meth:`~node_agent.kube.transport.Stream.shutdown`) instead of waiting out its read timeout.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from node_agent.kube.errors import Forbidden, Gone, KubeError, MethodNotAllowed, for_status
from node_agent.kube.transport import Kube, Stream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchTiming:
    #: Seconds one list may take.
    request_timeout_s: float = 10.0
    #: ``timeoutSeconds`` of one watch request: the server ends the stream then and we resume from the last version.
    watch_timeout_s: float = 300.0
    #: Extra seconds to wait for the next line before taking the connection for dead.
    read_slack_s: float = 30.0
    #: First wait after a failure; it doubles up to ``backoff_max_s`` and resets once a watch delivers.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    #: Seconds between re-lists while the server refuses to watch.
    relist_interval_s: float = 5.0
    #: Each backoff wait is drawn from [(1 - jitter) * wait, wait]: never longer than stated.
    jitter: float = 0.2


def watch_once(kube: Kube, path: str, *, resource_version: str, timeout_s: float, read_slack_s: float,
               query: Mapping[str, str] | None = None,
               on_open: Callable[[Stream], None] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """One watch request on the collection ``path``: yields ``(type, object)`` (``BOOKMARK`` included)
    until the server ends the stream. Raises :class:`Gone` for a too-old version (either form), the
    class for the code of any other ``ERROR`` event, and like :meth:`Kube.request` otherwise.
    ``on_open`` gets the open stream (to shut it down from elsewhere)."""
    q: dict[str, str | int | bool] = {**(query or {}), "watch": True, "allowWatchBookmarks": True,
                                      "timeoutSeconds": max(1, int(timeout_s))}
    if resource_version:
        q["resourceVersion"] = resource_version
    what = f"watch {path}"
    with kube.stream(path, query=q, read_timeout_s=timeout_s + read_slack_s, what=what) as stream:
        if on_open is not None:
            on_open(stream)
        for event in stream:
            kind = str(event.get("type") or "")
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 500)
                message = f"{what}: {code} {obj.get('reason', '')}: {obj.get('message', '')}"
                raise Gone(message) if code == 410 else for_status(code, message)
            yield kind, obj


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class ListWatch:
    """List ``path`` (with ``field_selector`` and ``label_selector``), then watch it, on a thread, until
    :meth:`stop`.

    ``on_list`` gets each list's items (a fresh start: anything not listed is gone); ``on_event`` each
    ``ADDED``/``MODIFIED``/``DELETED`` change. Both run on the watch thread. ``lists``, ``watches`` and
    ``events`` count for tests and logs; ``poll_only`` is set while the watch is refused.

    ``pause`` is every wait of the loop (backoff, the re-list interval while refused): it gets the stop event
    and the seconds, and returns early when the event is set. ``clock`` and ``draw`` (a number in [0, 1) for
    the jitter) are the loop's time and randomness. Tests pass their own, so a backoff schedule is read off
    the waits asked for instead of slept through.
    """

    def __init__(self, kube: Kube, path: str, *, on_list: Callable[[list[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None], field_selector: str = "",
                 label_selector: str = "", timing: WatchTiming | None = None, name: str = "list-watch",
                 log_as: str = "watch", pause: Callable[[threading.Event, float], object] | None = None,
                 clock: Callable[[], float] = time.monotonic, draw: Callable[[], float] = random.random) -> None:
        self.kube = kube
        self.path = path
        self.on_list = on_list
        self.on_event = on_event
        self.query = {k: v for k, v in (("fieldSelector", field_selector), ("labelSelector", label_selector)) if v}
        self.timing = timing or WatchTiming()
        self.name = name
        self.log_as = log_as  #: the logs' event prefix: ``<log_as>-failed``, ``-expired``, ``-refused``, ``-retry``
        self.lists = 0
        self.watches = 0
        self.events = 0
        self.poll_only = False
        self._stop = threading.Event()
        self._pause = pause or threading.Event.wait
        self._clock = clock
        self._draw = draw
        self._stream: Stream | None = None
        self._thread: threading.Thread | None = None

    def list(self) -> str:
        """One list, handed to ``on_list``; answers its resourceVersion."""
        self.lists += 1
        data = self.kube.get(self.path, query=self.query, timeout=self.timing.request_timeout_s,
                             what=f"list {self.path}")
        items = [i for i in (data or {}).get("items") or [] if isinstance(i, dict)]
        self.on_list(items)
        return resource_version(data or {})

    def watch(self, rv: str) -> str:
        """Follow one watch from ``rv``; answers the last version seen when the server ends it."""
        self.watches += 1
        for kind, obj in watch_once(self.kube, self.path, resource_version=rv, query=self.query,
                                    timeout_s=self.timing.watch_timeout_s, read_slack_s=self.timing.read_slack_s,
                                    on_open=self._opened):
            if self._stop.is_set():
                break
            self.events += 1
            rv = resource_version(obj) or rv
            if kind != "BOOKMARK":
                self.on_event(kind, obj)
        self._stream = None
        return rv

    def _opened(self, stream: Stream) -> None:
        self._stream = stream
        if self._stop.is_set():  # a stop that came while the request was sent found nothing to shut
            stream.shutdown()

    # -- the loop ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the loop, cutting an open watch short (it could otherwise block for a read timeout)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.shutdown()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def run(self) -> None:
        t = self.timing
        rv: str | None = None
        backoff = t.backoff_initial_s
        watch_retry = t.backoff_initial_s  #: while refused: the wait before the next watch attempt
        retry_at = 0.0
        while not self._stop.is_set():
            delivered = self.events
            try:
                if rv is None:
                    rv = self.list()
                if self.poll_only:
                    now = self._clock()
                    if now < retry_at:
                        rv = None
                        self._pause(self._stop, min(t.relist_interval_s, retry_at - now))
                        continue
                    log.info("event=%s-retry path=%s", self.log_as, self.path)
                    self.poll_only = False
                rv = self.watch(rv)
                backoff = watch_retry = t.backoff_initial_s  # the stream ran its course: resume at once
            except Gone as e:
                log.info("event=%s-expired path=%s action=relist detail=%s", self.log_as, self.path, e)
                rv = None
            except (Forbidden, MethodNotAllowed) as e:
                if rv is None:  # the list itself was refused: a failure like any other
                    backoff = self._back_off(e, backoff)
                    continue
                log.warning("event=%s-refused path=%s status=%s action=relist-every interval_s=%.0f "
                            "watch_retry_in_s=%.1f", self.log_as, self.path, e.status, t.relist_interval_s,
                            watch_retry)
                self.poll_only = True
                retry_at = self._clock() + watch_retry
                watch_retry = min(watch_retry * 2, t.backoff_max_s)
            except KubeError as e:  # unreachable, timeouts, resets, 5xx, bad JSON
                if self._stop.is_set():
                    return
                if self.events != delivered:
                    backoff = t.backoff_initial_s  # the watch worked for a while: a fresh failure
                backoff = self._back_off(e, backoff)
                rv = None
            finally:
                self._stream = None

    def _back_off(self, error: KubeError, backoff: float) -> float:
        wait = backoff * (1 - self.timing.jitter * self._draw())
        log.warning("event=%s-failed path=%s error=%s action=relist retry_in_s=%.2f", self.log_as, self.path, error,
                    wait)
        self._pause(self._stop, wait)
        return min(backoff * 2, self.timing.backoff_max_s)
