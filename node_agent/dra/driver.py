"""The DRA driver: inventory -> ResourceSlices, and the kubelet's prepare/unprepare calls -> per-claim results.

Each claim gets its own result, so one bad claim never fails the batch. The claim is read from the API
server before the node lock is taken (slow calls outside the serialised section, as the Go helper does).
Every call works against a deadline: the gRPC deadline the kubelet set (45 s in kubelet's client) minus a
safety margin, capped by the driver's own budget, so the driver answers with per-claim errors the kubelet
will retry instead of being cut off mid-way by a DEADLINE_EXCEEDED that discards the whole response.

The inventory loop polls the device source (NVML calls are cheap and bounded) and republishes the pool
within one poll interval of any change: MIG reconfiguration, a GPU falling off the bus, a GPU bound to or
released from vfio-pci.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from node_agent.cdi.driveredits import DriverEditsSource
from node_agent.cdi.spec import ContainerEdits
from node_agent.dra.api import DraApi
from node_agent.dra.checkpoint import Recovery
from node_agent.dra.claims import ClaimError, ClaimRef, parse_claim
from node_agent.dra.devices import Allocatable, HealthAction, InventorySource, allocatable_devices
from node_agent.dra.hostfs import HostPaths
from node_agent.dra.metrics import DraMetrics
from node_agent.dra.publisher import Publication, SlicePublisher
from node_agent.dra.sharing import SharingBackend
from node_agent.dra.state import Deadline, DeviceState, PrepareError, ResultDevice
from node_agent.host.atomic import LockTimeout
from node_agent.kube.errors import KubeError, NotFound
from nvgpu.nodescripts import facts

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = f"{facts.STATE_DIR}/dra"
#: Kubelet's ``defaultClientCallTimeout`` for DRA calls.
KUBELET_CALL_TIMEOUT = 45.0


@dataclass(frozen=True)
class DriverSettings:
    driver: str = "gpu.nvidia.com"
    node: str = ""
    state_dir: str = DEFAULT_STATE_DIR
    health: HealthAction = HealthAction.WITHDRAW
    #: Seconds between inventory polls; republishing happens within one interval of a change. NVML
    #: offers events for XIDs only, not for MIG layouts or vfio-pci bindings, so the inventory is polled;
    #: at 0.5 s that cost 1.8% of a core on an idle node (NVIDIA's plugin: 0.01%).
    poll_interval: float = 5.0
    #: Seconds between checks that the API server still holds this pool's slices, each one list call. A
    #: watch of the pool's slices (:func:`node_agent.kubelet.dra.process.serve`) asks for one at once when
    #: anyone changes or deletes them (the kubelet deletes a node's slices when it starts, and 30 s after
    #: a driver becomes unreachable); this is the net under it.
    resync_interval: float = 600.0
    #: The driver's own budget for one kubelet call, whatever deadline the kubelet sets.
    call_budget: float = 40.0
    #: Answer this long before the caller's gRPC deadline, so the answer still arrives.
    deadline_margin: float = 1.0
    lock_timeout: float = 10.0


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[ResultDevice, ...] = ()
    error: str = ""


class DraDriver:
    def __init__(self, settings: DriverSettings, *, api: DraApi, source: InventorySource, host: HostPaths,
                 backend: SharingBackend, clock: Callable[[], float] = time.monotonic,
                 driver_files: DriverEditsSource | None = None, metrics: DraMetrics | None = None) -> None:
        if not settings.node:
            raise ValueError("the DRA driver needs the node name (--node-name or NODE_NAME)")
        self.settings = settings
        self._api = api
        self._source = source
        self._clock = clock
        self._devices: dict[str, Allocatable] = {}
        self._published: list[Allocatable] | None = None
        self._dirty = True
        self._inv_lock = threading.Lock()
        #: The running driver's version (from the last inventory): which driver files the CDI specs mount.
        self._driver_version = ""
        self._driver_files = driver_files
        #: Set on uninstall: the pool has been withdrawn and must not be published again.
        self.withdrawn = threading.Event()
        # Claim reads run here so a stalled API server cannot hold a kubelet call past its deadline
        # (the HTTP client retries on its own; the abandoned read finishes in the background).
        self._fetchers = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="dra-claim-read")
        self.publisher = SlicePublisher(api, settings.driver, settings.node)
        self.state = DeviceState(driver=settings.driver, pool=settings.node, host=host, backend=backend,
                                 devices=self.devices, state_dir=settings.state_dir,
                                 lock_timeout=settings.lock_timeout, driver_edits=self._driver_edits)
        self.metrics = metrics or DraMetrics(settings.driver)
        self.metrics.watch_devices(self._published_by_health)
        self.metrics.watch_prepared(self.state.prepared_count)

    # -- inventory -------------------------------------------------------------------------------------
    def devices(self) -> Mapping[str, Allocatable]:
        with self._inv_lock:
            return dict(self._devices)

    def _snapshot(self) -> list[Allocatable]:
        inventory = self._source.snapshot()
        devices = allocatable_devices(inventory, self.settings.driver, self.settings.health)
        with self._inv_lock:
            self._devices = {d.name: d for d in devices}
            if inventory.gpus or inventory.migs:
                self._driver_version = inventory.driver_version
        return devices

    def _published_by_health(self) -> dict[str, int]:
        with self._inv_lock:
            published = list(self._published or ())
        healthy = sum(d.healthy for d in published)
        return {"Healthy": healthy, "Unhealthy": len(published) - healthy}

    def _driver_edits(self) -> ContainerEdits | None:
        with self._inv_lock:
            version = self._driver_version
        if self._driver_files is None or not version:
            return None
        return self._driver_files.edits(version)

    def refresh(self, devices: list[Allocatable] | None = None) -> Publication | None:
        """Take a snapshot (unless given) and publish it if it differs from the last publication."""
        if devices is None:
            devices = self._snapshot()
        with self._inv_lock:
            changed = devices != self._published
            if (not changed and not self._dirty) or self.withdrawn.is_set():
                return None
        try:
            pub = self.publisher.publish(devices)
        except KubeError as e:
            self._dirty = True
            self.metrics.published(ok=False)
            log.warning("event=publish-failed error=%s", e)
            return None
        self.metrics.published(ok=True)
        with self._inv_lock:
            self._published = devices
            self._dirty = False
        return pub

    def withdraw(self) -> int:
        """Stop publishing and delete this node's slices (uninstall)."""
        self.withdrawn.set()
        return self.publisher.withdraw()

    def start(self) -> Publication | None:
        """Inventory, then journal recovery (which matches recorded devices against the inventory), then
        publication: the pool appears only once prepare is safe to serve."""
        devices = self._snapshot()
        self.state.startup()
        self._report_recovery()
        return self.refresh(devices)

    def _report_recovery(self) -> None:
        loaded = self.state.last_recovery
        if loaded is None or loaded.recovery not in (Recovery.CORRUPTED, Recovery.REBOOT):
            return
        corrupted = loaded.recovery is Recovery.CORRUPTED
        reason = "DRACheckpointCorrupted" if corrupted else "DRACheckpointDiscarded"
        message = (f"DRA driver {self.settings.driver}: checkpoint unreadable ({loaded.detail}); rebuilt "
                   f"{len(loaded.data.prepared_claims)} prepared claim(s) from the CDI specs and undo records on "
                   "the node"
                   if corrupted else f"DRA driver {self.settings.driver}: node rebooted ({loaded.detail}); "
                   "prepared claims from the previous boot were discarded and will be prepared again")
        node = self.publisher.node_ref()
        try:
            self._api.node_event(node.name, node.uid, reason=reason, message=message, warning=corrupted)
        except KubeError as e:
            log.warning("event=node-event-failed reason=%s error=%s", reason, e)

    def resync(self) -> None:
        """Check the published slices against the API server at the next refresh (after a kubelet restart
        re-registered the plugin, or periodically)."""
        self._dirty = True

    def run_inventory_loop(self, stop: threading.Event) -> None:
        """The named background loop; a failure in one tick is logged and retried on the next."""
        last_resync = self._clock()
        while True:
            # Asleep on NVML's XID events: a critical XID is published at once, the rest every poll_interval.
            self._source.wait_change(self.settings.poll_interval, stop)
            if stop.is_set():
                return
            if self._clock() - last_resync >= self.settings.resync_interval:
                last_resync = self._clock()
                self.resync()
            try:
                self.refresh()
                self.metrics.inventory_pass()
            except Exception:
                log.exception("event=inventory-refresh-failed")

    # -- kubelet calls ---------------------------------------------------------------------------------
    def _deadline(self, timeout: float | None) -> Deadline:
        budget = self.settings.call_budget
        if timeout is not None:
            budget = min(budget, timeout - self.settings.deadline_margin)
        return Deadline(self._clock() + max(budget, 0.0), self._clock)

    def prepare(self, refs: Sequence[ClaimRef], timeout: float | None = None) -> dict[str, PrepareOutcome]:
        deadline = self._deadline(timeout)
        out: dict[str, PrepareOutcome] = {}
        for ref in refs:
            with self.metrics.timed_prepare():
                out[ref.uid] = self._prepare_one(ref, deadline)
            self.metrics.prepared(ok=not out[ref.uid].error)
        return out

    def _prepare_one(self, ref: ClaimRef, deadline: Deadline) -> PrepareOutcome:
        """One claim's answer: its devices, or the error kubelet shows on the pod (never raises)."""
        try:
            deadline.check(f"claim {ref} was read")
            started = self._clock()
            raw = self._read_claim(ref, deadline)
            read = self._clock()
            known = set(self.devices())
            try:
                claim = parse_claim(raw, ref, driver=self.settings.driver, pool=self.settings.node,
                                    known_devices=known)
            except ClaimError:
                # A device withdrawn since this claim was prepared (unhealthy, reconfigured) is still
                # this claim's: an idempotent re-prepare must return it, so read the journal then.
                claim = parse_claim(raw, ref, driver=self.settings.driver, pool=self.settings.node,
                                    known_devices=known | self.state.recorded_devices(ref.uid))
            devices = self.state.prepare(claim, deadline)
            log.debug("event=prepare-timing claim=%s read_ms=%.2f prepare_ms=%.2f", ref,
                      (read - started) * 1e3, (self._clock() - read) * 1e3)
            return PrepareOutcome(devices=tuple(devices))
        except (KubeError, ClaimError, PrepareError, LockTimeout) as e:
            msg = f"claim {ref}: not found" if isinstance(e, NotFound) else str(e)
            log.warning("event=prepare-refused claim=%s uid=%s error=%s", ref, ref.uid, msg)
            return PrepareOutcome(error=msg)
        except Exception as e:
            log.exception("event=prepare-crashed claim=%s uid=%s", ref, ref.uid)
            return PrepareOutcome(error=f"claim {ref}: internal error: {e}")

    def _read_claim(self, ref: ClaimRef, deadline: Deadline) -> dict[str, Any]:
        remaining = deadline.remaining()
        future = self._fetchers.submit(self._api.get_claim, ref.namespace, ref.name, remaining)
        try:
            return future.result(timeout=max(remaining, 0.0))
        except futures.TimeoutError:
            future.cancel()
            raise PrepareError(f"claim {ref}: the API server did not answer within {remaining:.1f}s; "
                               "the kubelet will retry") from None

    def close(self) -> None:
        self._fetchers.shutdown(wait=False, cancel_futures=True)

    def unprepare(self, refs: Sequence[ClaimRef], timeout: float | None = None) -> dict[str, str]:
        deadline = self._deadline(timeout)
        out: dict[str, str] = {}
        for ref in refs:
            try:
                self.state.unprepare(ref, deadline)
                out[ref.uid] = ""
            except (PrepareError, LockTimeout) as e:
                out[ref.uid] = str(e)
            except Exception as e:
                log.exception("event=unprepare-crashed claim=%s uid=%s", ref, ref.uid)
                out[ref.uid] = f"claim {ref}: internal error: {e}"
            self.metrics.unprepared(ok=not out[ref.uid])
        return out
