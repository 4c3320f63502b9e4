"""Uninstall: withdraw this node's ResourceSlices when the stack's uninstall marker is deleted.

The ``DraStack`` component creates a ConfigMap that depends on every other DRA object, so Pulumi deletes
it first on uninstall. Every running plugin adds the :data:`FINALIZER` to it; when the marker gets a
``deletionTimestamp``, each plugin stops publishing and deletes its node's slices, and any plugin removes
the finalizer once no slice of the driver is left anywhere (or the grace period has passed, so a dead
node cannot block ``pulumi destroy`` forever). Only then does Pulumi delete the DaemonSet, the RBAC and
the DeviceClasses, so no ResourceSlice outlives the driver that could serve it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum

from node_agent.dra.api import DraApi
from node_agent.kube.errors import KubeError

log = logging.getLogger(__name__)

FINALIZER = "gpu.nvidia-gpu.io/dra-slices-cleanup"
#: After this long since the marker's deletion, the finalizer goes even if some node's slices remain.
GRACE_SECONDS = 60.0


class MarkerState(StrEnum):
    ABSENT = "absent"
    ARMED = "armed"
    UNINSTALLING = "uninstalling"
    RELEASED = "released"


def _deleted_since(meta: dict[str, object], now: float) -> float | None:
    stamp = meta.get("deletionTimestamp")
    if not stamp:
        return None
    try:
        when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return max(now - when, 0.0)


class UninstallWatcher:
    def __init__(self, api: DraApi, *, driver: str, marker: str, withdraw: Callable[[], int],
                 grace: float = GRACE_SECONDS, wall_clock: Callable[[], float] = time.time) -> None:
        namespace, _, name = marker.partition("/")
        if not namespace or not name:
            raise ValueError(f"uninstall marker {marker!r} must be <namespace>/<name>")
        self._api = api
        self._driver = driver
        self._ns, self._name = namespace, name
        self._withdraw = withdraw
        self._grace = grace
        self._now = wall_clock
        self.uninstalling = threading.Event()
        #: The marker's version at the last check ("" when absent or unknown): the watch resumes from it.
        self.resource_version = ""

    def check(self) -> MarkerState:
        """One reconciliation step (the loop calls it when the marker changed, and every few seconds while
        uninstalling)."""
        cm = self._api.get_config_map(self._ns, self._name)
        self.resource_version = ""
        if cm is None:
            return MarkerState.ABSENT
        meta = cm.get("metadata") or {}
        self.resource_version = str(meta.get("resourceVersion") or "")
        finalizers = list(meta.get("finalizers") or [])
        since = _deleted_since(meta, self._now())
        if since is None:
            if FINALIZER not in finalizers:
                self._api.patch_config_map(self._ns, self._name, {"metadata": {"finalizers": [*finalizers, FINALIZER]}})
            return MarkerState.ARMED
        if not self.uninstalling.is_set():
            self.uninstalling.set()
            gone = self._withdraw()
            log.info("event=uninstall-slices-withdrawn driver=%s slices=%d", self._driver, gone)
        remaining = self._api.list_driver_slices(self._driver)
        if FINALIZER in finalizers and (not remaining or since >= self._grace):
            if remaining:
                log.warning("event=uninstall-grace-expired slices_left=%d", len(remaining))
            self._api.patch_config_map(self._ns, self._name,
                                       {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}})
            return MarkerState.RELEASED
        return MarkerState.UNINSTALLING

    def run(self, stop: threading.Event, interval: float = 5.0, watch_timeout: float = 300.0) -> None:
        """Check, then wait for the marker to change: a watch while it is armed or not there yet (at rest
        one request per ``watch_timeout``, resumed from where the last ended; polling it every 5 s cost 12
        requests a minute on every DRA node), ``interval`` while uninstalling (the other nodes' slices
        are counted) or when the watch fails."""
        while True:
            try:
                state = self.check()
                if state in (MarkerState.ARMED, MarkerState.ABSENT):  # absent: not created yet
                    self._wait_for_change(stop, watch_timeout)
                    if stop.is_set():
                        return
                    continue
            except KubeError as e:
                log.warning("event=uninstall-check-failed error=%s", e)
            if stop.wait(interval):
                return

    def _wait_for_change(self, stop: threading.Event, watch_timeout: float) -> None:
        rv = self.resource_version
        while not stop.is_set():
            latest = self._api.wait_config_map_change(self._ns, self._name, rv, watch_timeout)
            if latest is None:
                return
            rv = latest
