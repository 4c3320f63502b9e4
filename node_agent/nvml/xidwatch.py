"""Each GPU's XID errors as they are raised: the last one and when, and how many of each.

The device plugin turns XIDs into allocation health; the GPU inventory (the labeller) and the metrics
exporter show them to people. Each reads NVML's event queue on its own (an NVML event set is per process
and sees every event raised after it was made), so neither needs the device plugin, and both work the
same in DRA mode, where there is none. One thread holds one event set open: an XID cannot be seen by a
process that polls once a minute. Each event calls ``on_xid`` (the labeller starts its next run at once).
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from node_agent.nvml import EventKind, NvmlError, NvmlNotSupported, NvmlSession
from node_agent.nvml.xid import EVENT_WAIT_SLICE_S, is_application_xid

log = logging.getLogger(__name__)

#: After NVML failed (driver reloading, GPU lost at start), how long before the event set is made again.
RETRY_S = 5.0
#: A GPU that could not register (lost) is retried this often, so one that comes back is watched again.
REREGISTER_S = 60.0


@dataclass(frozen=True)
class XidSeen:
    """One GPU's last XID and when it was raised (UTC)."""

    xid: int
    at: datetime.datetime

    @property
    def critical(self) -> bool:
        """An XID the device plugin also counts against the GPU (not one an application caused)."""
        return not is_application_xid(self.xid)


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


class XidRecorder:
    """Records each GPU's last XID from an NVML event set held open in a thread of its own."""

    def __init__(self, open_nvml: Callable[[], AbstractContextManager[NvmlSession]], on_xid: Callable[[], None], *,
                 clock: Callable[[], datetime.datetime] = utcnow) -> None:
        self._open = open_nvml
        self._on_xid = on_xid
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[int, XidSeen] = {}
        self._counts: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xid-recorder", daemon=True)

    def seen(self) -> dict[int, XidSeen]:
        """NVML index to the last XID raised on the GPU since this recorder started."""
        with self._lock:
            return dict(self._seen)

    def counts(self) -> dict[tuple[int, int], int]:
        """(NVML index, XID) to how many were raised since this recorder started."""
        with self._lock:
            return dict(self._counts)

    def wait_watching(self, timeout_s: float) -> bool:
        """Whether the event set is registered (XIDs raised from now on are recorded)."""
        return self._watching.wait(timeout_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the watch within a wait slice (the event set is freed as its ``with`` block ends)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except NvmlNotSupported as e:
                # A driver without event sets does not grow them: record nothing and say so once, as the
                # device plugin and the DRA plugin serve with health checks off (NVIDIA's plugin: "continuing
                # with health checks disabled"), instead of a warning every RETRY_S for the agent's life.
                log.warning("event=xid-watch-unsupported reason=%s detail=XIDs are not recorded on this node", e)
                return
            except NvmlError as e:
                log.warning("event=xid-watch-failed error=%s retry_s=%s", e, RETRY_S)
                self._stop.wait(RETRY_S)
            finally:
                self._watching.clear()

    def _watch(self) -> None:
        with self._open() as nvml, nvml.watch_events(kinds=(EventKind.XID,)) as watcher:
            for index, reason in sorted(watcher.failed.items()):
                log.info("event=xid-watch-skipped gpu=%d reason=%s", index, reason)
            self._watching.set()
            started = self._clock()
            while not self._stop.is_set():
                event = watcher.wait(EVENT_WAIT_SLICE_S)
                if event is not None and event.kind is EventKind.XID:
                    self._record(event.gpu_index, event.data, event.gi_id, event.ci_id)
                elif watcher.failed and (self._clock() - started).total_seconds() >= REREGISTER_S:
                    return  # make the set again: a GPU that was lost may be back

    def _record(self, index: int, xid: int, gi_id: int | None, ci_id: int | None) -> None:
        seen = XidSeen(xid, self._clock())
        with self._lock:
            self._seen[index] = seen
            self._counts[(index, xid)] = self._counts.get((index, xid), 0) + 1
        log.warning("event=xid gpu=%d xid=%d gpu_instance=%s compute_instance=%s critical=%s", index, xid,
                    "-" if gi_id is None else gi_id, "-" if ci_id is None else ci_id, seen.critical)
        self._on_xid()
