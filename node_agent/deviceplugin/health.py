"""Device health: NVML events mark devices Unhealthy; only NVML showing the GPU recovered brings them back.

NVIDIA's plugin marks a device Unhealthy on a critical XID and never looks again (NVIDIA/k8s-device-plugin
``internal/rm/health.go``: it only ever sends devices to its unhealthy channel; only a pod restart
recovers). Here a :class:`HealthMonitor` turns events into per-device state on a :class:`HealthBoard`,
which wakes every ListAndWatch stream at once. A device turns Healthy again only when, ``recovery_quiet_s``
after its last bad event, its GPU answers NVML and NVML shows nothing outstanding: no recovery action
(``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``), no pending or failed row remap, no pending retired page (NVIDIA
"GPU Memory Error Management", "Error Recovery and Response Flags"). XIDs 48, 63, 94 and 95 leave a GPU
that still answers NVML but needs a reset first: a quiet period alone put pods on it that crashed. Where
the GPU answers none of those reads, the quiet period alone decides, as before (NVIDIA would hold it until
the plugin restarts). A healthy GPU whose NVML names a recovery action or a failed remap is taken out too,
with or without an XID (one raised before this process started). A GPU that fell off the bus is Unhealthy
at once and recovers only when re-checks pass (it came back).

Events are matched to GPUs by the UUID NVML gives for the event's device, as NVIDIA's plugin does; an
event for a device that is none of ours (or whose UUID NVML cannot give) re-checks every GPU at once.

XID filtering follows NVIDIA: 13, 31, 43, 45, 68 and 109 are application errors and ignored;
``DP_DISABLE_HEALTHCHECKS`` is ``all`` / ``xids`` (no checks) or a list of extra XIDs to ignore;
``DP_ENABLE_HEALTHCHECKS`` lists XIDs that count even when disabled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from node_agent.deviceplugin.devices import WHOLE_GPU, Gpu, HealthEvent, HealthEventKind, NodeDevices, Recovery
from node_agent.nvml.xid import APPLICATION_XIDS, EVENT_WAIT_SLICE_S

log = logging.getLogger(__name__)

#: XIDs NVIDIA's plugin never treats as device failures (they are caused by applications).
DEFAULT_IGNORED_XIDS: frozenset[int] = APPLICATION_XIDS
DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"


def _xid_list(text: str) -> tuple[bool, frozenset[int]]:
    everything = False
    xids: set[int] = set()
    for part in text.lower().split(","):
        p = part.strip()
        if p in ("all", "xids"):
            everything = True
        elif p.isdigit():
            xids.add(int(p))
    return everything, frozenset(xids)


@dataclass(frozen=True)
class HealthPolicy:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    disable_all: bool = False
    enabled_xids: frozenset[int] = frozenset()
    enable_all: bool = False
    #: Seconds a device must stay free of bad events, with passing re-checks, to turn Healthy again.
    recovery_quiet_s: float = 60.0
    #: Seconds between re-checks of unhealthy devices.
    recheck_interval_s: float = 5.0
    #: Seconds between reads of what NVML says a healthy GPU needs (its recovery action, row remapper,
    #: retired pages). A GPU that an XID hit is read at every re-check; a need that arrives without an XID
    #: (one NVIDIA's plugin never reads) is found within this time, at three NVML calls a GPU instead of
    #: three every re-check.
    recovery_read_interval_s: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], recovery_quiet_s: float = 60.0,
                 recheck_interval_s: float = 5.0) -> HealthPolicy:
        disable_all, disabled = _xid_list(env.get(DISABLE_ENV, ""))
        enable_all, enabled = _xid_list(env.get(ENABLE_ENV, ""))
        return cls(ignored_xids=DEFAULT_IGNORED_XIDS | disabled, disable_all=disable_all, enabled_xids=enabled,
                   enable_all=enable_all, recovery_quiet_s=recovery_quiet_s, recheck_interval_s=recheck_interval_s)

    @property
    def checks_enabled(self) -> bool:
        return not self.disable_all or self.enable_all or bool(self.enabled_xids)

    def is_critical(self, xid: int) -> bool:
        if self.enable_all or xid in self.enabled_xids:
            return True
        if self.disable_all:
            return False
        return xid not in self.ignored_xids


Transition = Callable[[str, bool, str], None]  # (device uuid, healthy, reason)


@dataclass
class _State:
    healthy: bool = True
    last_bad: float = 0.0
    reason: str = ""
    need: str = ""  #: what NVML says the GPU needs before it is trusted again (reset, reboot, replacement ...)


@dataclass
class HealthBoard:
    """Health per physical device UUID (GPU or MIG), with a change counter streams can wait on.

    One board lives as long as the process: a kubelet restart or a reload rebuilds the plugins but
    must not turn a failed GPU Healthy again (only passing re-checks do)."""

    clock: Callable[[], float] = time.monotonic
    _states: dict[str, _State] = field(default_factory=dict)
    _version: int = 0
    _wakes: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _listeners: list[Transition] = field(default_factory=list)

    def add_listener(self, fn: Transition) -> None:
        if fn not in self._listeners:  # a board outlives plugin generations; each adds its listener once
            self._listeners.append(fn)

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def healthy(self, uuid: str) -> bool:
        with self._cond:
            s = self._states.get(uuid)
            return s is None or s.healthy

    def unhealthy(self) -> dict[str, str]:
        with self._cond:
            return {u: s.reason for u, s in self._states.items() if not s.healthy}

    def needs(self) -> dict[str, str]:
        """Unhealthy devices NVML says need something (``reset``, ``reboot``, ``replacement`` ...) to recover."""
        with self._cond:
            return {u: s.need for u, s in self._states.items() if not s.healthy and s.need}

    def hold(self, uuid: str, need: str) -> None:
        """Keep an unhealthy device unhealthy and record what it needs (no transition, no wake-up)."""
        with self._cond:
            s = self._states.get(uuid)
            if s is not None and not s.healthy and s.need != need:
                log.warning("event=health-held device=%s reason=%s needs=%s", uuid, s.reason, need)
                s.need = need

    def last_bad(self, uuid: str) -> float:
        with self._cond:
            s = self._states.get(uuid)
            return 0.0 if s is None else s.last_bad

    def mark(self, uuids: Iterable[str], healthy: bool, reason: str) -> list[str]:
        """Set health; returns the UUIDs that changed. Bad marks always refresh ``last_bad``.

        Listeners (the transition metrics) run under the board's lock, before waiters are woken: no
        stream or reader can see a new health before it is recorded (kubelet seeing a device turn
        Healthy while ``/metrics`` does not count the transition yet was a race). They must be quick
        and never wait on another thread."""
        changed: list[str] = []
        now = self.clock()
        with self._cond:
            for u in uuids:
                s = self._states.setdefault(u, _State())
                if not healthy:
                    s.last_bad = now
                if s.healthy != healthy:
                    s.healthy = healthy
                    s.reason = reason
                    s.need = ""
                    changed.append(u)
            for u in changed:
                log.warning("event=health-transition device=%s healthy=%s reason=%s", u, healthy, reason)
                for fn in self._listeners:
                    fn(u, healthy, reason)
            if changed:
                self._version += 1
                self._cond.notify_all()
        return changed

    def wait_change(self, seen: int, timeout_s: float) -> int:
        """Block until the version differs from ``seen`` (or timeout); returns the current version."""
        with self._cond:
            wakes = self._wakes
            self._cond.wait_for(lambda: self._version != seen or self._wakes != wakes, timeout=timeout_s)
            return self._version

    def wake(self) -> None:
        """Wake every waiter without a change (used when stopping)."""
        with self._cond:
            self._wakes += 1
            self._cond.notify_all()


class HealthMonitor:
    """Reads events from :class:`NodeDevices` and keeps a :class:`HealthBoard` current."""

    def __init__(self, devices: NodeDevices, gpus: Sequence[Gpu], board: HealthBoard, policy: HealthPolicy,
                 clock: Callable[[], float] = time.monotonic):
        self._devices = devices
        self._gpus = {g.uuid: g for g in gpus}
        self.board = board
        self.policy = policy
        self._clock = clock
        self._next_recheck = clock() + policy.recheck_interval_s
        self._next_recovery_read = clock()  # the first re-check reads every GPU's
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _targets(self, ev: HealthEvent) -> list[str]:
        """The device UUIDs an event concerns: the GPU, or one MIG device when GI/CI name it."""
        if ev.gpu_uuid is None:
            return [*self._gpus, *(m.uuid for g in self._gpus.values() for m in g.migs)]
        gpu = self._gpus.get(ev.gpu_uuid)
        if gpu is None:
            # Not one of ours by UUID (NVML could not name the event's device, or the GPU was re-enumerated):
            # which GPU it hit is unknown, so every GPU is re-checked now, needs included, rather than the
            # event dropped.
            log.warning("event=health-event-unmatched gpu=%r kind=%s xid=%d", ev.gpu_uuid, ev.kind.value, ev.xid)
            self._next_recheck = self._next_recovery_read = self._clock()
            return []
        if ev.kind is HealthEventKind.XID and gpu.migs and ev.gi_id != WHOLE_GPU:
            return [m.uuid for m in gpu.migs
                    if m.gi_id == ev.gi_id and ev.ci_id in (WHOLE_GPU, m.ci_id)]
        return [gpu.uuid]

    def handle(self, ev: HealthEvent) -> list[str]:
        if ev.kind is HealthEventKind.XID:
            if not self.policy.is_critical(ev.xid):
                log.info("event=xid-ignored gpu=%s xid=%d", ev.gpu_uuid, ev.xid)
                return []
            reason = f"xid-{ev.xid}"
        else:
            reason = ev.kind.value
        return self.board.mark(self._targets(ev), False, reason)

    def recheck(self) -> list[str]:
        """Re-check devices: healthy GPUs that stopped answering are lost, and those NVML says must take no
        new work (a recovery action, a failed remap) are taken out; unhealthy devices that stayed quiet long
        enough, answer, and have nothing outstanding in NVML turn Healthy. Returns the recovered UUIDs."""
        now = self._clock()
        recovered: list[str] = []
        readings: dict[str, Recovery] = {}

        def reading(gpu_uuid: str) -> Recovery:
            if gpu_uuid not in readings:
                readings[gpu_uuid] = self._devices.recovery(gpu_uuid)
            return readings[gpu_uuid]

        read_needs = now >= self._next_recovery_read
        if read_needs:
            self._next_recovery_read = now + self.policy.recovery_read_interval_s
        bad = self.board.unhealthy()
        for uuid, gpu in self._gpus.items():
            if uuid in bad:
                continue
            if not self._devices.check(uuid):
                self.board.mark([uuid], False, HealthEventKind.GPU_LOST.value)
                continue
            if not read_needs:
                continue
            r = reading(uuid)
            if r.out_of_service and r.need:
                devices = [uuid, *(m.uuid for m in gpu.migs)]
                self.board.mark(devices, False, f"needs-{r.need}")
                for d in devices:
                    self.board.hold(d, r.need)
        for uuid in self.board.unhealthy():
            if now - self.board.last_bad(uuid) < self.policy.recovery_quiet_s:
                continue
            gpu_uuid = self._parent(uuid)
            if gpu_uuid is None or not self._devices.check(gpu_uuid):
                self.board.mark([uuid], False, "recheck-failed")
                continue
            r = reading(gpu_uuid)
            if r.need:
                self.board.hold(uuid, r.need)  # answers, but NVML says it is not fit yet (e.g. XID 95: reset)
                continue
            recovered += self.board.mark([uuid], True, "recovered")
        return recovered

    def _parent(self, uuid: str) -> str | None:
        for g in self._gpus.values():
            if g.uuid == uuid or any(m.uuid == uuid for m in g.migs):
                return g.uuid
        return None

    def step(self, timeout_s: float) -> None:
        """One wait for an event, then re-checks when due."""
        try:
            ev = self._devices.wait_event(timeout_s)
        except Exception as e:  # the watch itself broke: every device is suspect, keep going
            log.error("event=health-watch-failed error=%r", e)
            ev = HealthEvent(HealthEventKind.WATCH_FAILED, detail=str(e))
            self._stop.wait(min(timeout_s, 1.0))
        if ev is not None:
            self.handle(ev)
        if self._stop.is_set():
            return
        if self._clock() >= self._next_recheck:
            self.recheck()
            self._next_recheck = self._clock() + self.policy.recheck_interval_s

    def _run(self) -> None:
        # An event returns at once; a wait ends by the next re-check, and within a slice for stop(): a final
        # stop waits that long for the monitor, a restart does not wait.
        while not self._stop.is_set():
            due = max(0.0, self._next_recheck - self._clock())
            self.step(min(EVENT_WAIT_SLICE_S, self.policy.recheck_interval_s, due))

    def start(self) -> None:
        if not self.policy.checks_enabled:
            log.info("event=health-checks-disabled")
            return
        self._thread = threading.Thread(target=self._run, name="health-monitor", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """``wait``: until the thread has left its NVML wait (before NVML shuts down). A restart does not
        wait: the thread ends after its current wait, and whatever it reads meanwhile lands on the board
        the next monitor shares."""
        self._stop.set()
        if self._thread is not None:
            if wait:
                self._thread.join(timeout=EVENT_WAIT_SLICE_S + 5)
            self._thread = None
