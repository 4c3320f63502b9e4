"""The exporter's ``/metrics``: an NVML session held across scrapes, reopened after NVML fails.

A scrape reads the GPUs through one session (opening NVML per scrape costs more than the reading: every
handle and the MIG layout again). When NVML itself goes (a driver reload, an upgrade), the scrape answers
the exporter's own series with the failure counted, closes the session and the next scrape opens a new
one, so the exporter follows a driver restart without a pod restart; a scrape that finds every GPU lost
closes it too (after a driver reload the old handles answer "lost" for good). Scrapes are serialised: two
Prometheus servers scraping at once read NVML one after the other, never interleaved.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from node_agent.exporter.collector import Exporter, info_family, own_families, render
from node_agent.exporter.counters import Selection
from node_agent.exporter.holders import ContainerDevices, Holders, holders
from node_agent.nvml import Gpu, NvmlError, NvmlSession
from node_agent.nvml.xidwatch import XidRecorder

log = logging.getLogger(__name__)


class MetricsService:
    """Renders ``/metrics``; ``live`` is false while NVML cannot be opened."""

    def __init__(self, open_nvml: Callable[[], AbstractContextManager[NvmlSession]], selection: Selection,
                 hostname: str, *, pod_resources: Callable[[], list[ContainerDevices]] | None = None,
                 dra_driver: str = "gpu.nvidia.com", xids: XidRecorder | None = None,
                 info: Mapping[str, str] | None = None) -> None:
        self._open = open_nvml
        self._selection = selection
        self._hostname = hostname
        self._pod_resources = pod_resources
        self._dra_driver = dra_driver
        self._xids = xids
        self._info = dict(info or {})
        self._lock = threading.Lock()
        self._stack: contextlib.ExitStack | None = None
        self._session: NvmlSession | None = None
        self._failures: dict[str, int] = {}
        self._healthy = True
        for w in selection.warnings:
            log.warning("event=counter-not-served detail=%s", w)

    def _holders(self, gpus: Sequence[Gpu]) -> Holders:
        assert self._pod_resources is not None
        return holders(self._pod_resources(), gpus, dra_driver=self._dra_driver)

    def _nvml(self) -> NvmlSession:
        if self._session is None:
            stack = contextlib.ExitStack()
            self._session = stack.enter_context(self._open())
            self._stack = stack
        return self._session

    def _drop(self) -> None:
        if self._stack is not None:
            with contextlib.suppress(Exception):
                self._stack.close()
        self._stack, self._session = None, None

    def render(self) -> bytes:
        with self._lock:
            last: Callable[[], dict[int, int]] = dict  # type: ignore[no-redef]
            counts: Callable[[], dict[tuple[int, int], int]] = dict
            if self._xids is not None:
                recorder = self._xids

                def last() -> dict[int, int]:
                    return {i: seen.xid for i, seen in recorder.seen().items()}

                counts = recorder.counts
            try:
                exporter = Exporter(self._nvml(), self._selection.fields, self._hostname, xid_last=last,
                                    xid_counts=counts, holders=self._holders if self._pod_resources else None,
                                    failures=self._failures)
                families = exporter.collect()
                self._healthy = True
                if exporter.lost and not exporter.read:  # every GPU gone: a driver reload leaves stale handles
                    self._drop()
            except NvmlError as e:
                self._failures["nvml"] = self._failures.get("nvml", 0) + 1
                log.warning("event=scrape-failed error=%s", e)
                self._drop()
                self._healthy = False
                families = own_families(self._hostname, {}, counts(), self._failures, None)
            if self._info:
                families.append(info_family(self._hostname, self._info))
            return render(families)

    def live(self) -> bool:
        return self._healthy

    def close(self) -> None:
        with self._lock:
            self._drop()
