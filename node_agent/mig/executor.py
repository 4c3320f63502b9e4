"""The MIG manager's executor: observe, ask :func:`~node_agent.mig.machine.decide`, perform, journal.

The executor holds no decision logic. Each :meth:`MigManager.step` gathers one
:class:`~node_agent.mig.machine.Observation` (Node, journal, GPUs compared with the plan, pods on the
node when a phase needs them, boot ID, clock), performs the chosen action and records the journal
phase. Before a destructive step the journal is written first (with the attempt count, so a step that
keeps crashing the process is rolled back instead of retried forever); after a non-destructive step
the phase is advanced only once the step is done, so a crash repeats it harmlessly.

Every way out of a reconfiguration — success, failure, rollback, abort on stop — ends in RESTORE,
which puts the deploy labels back to their journaled values, removes the ``mig-reconfigure`` taint,
uncordons a node the manager cordoned, clears the drain annotations, sets the state label and emits an
Event, in one Node patch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

from node_agent.host import HostError, statefile
from node_agent.kube.errors import Conflict, KubeError
from node_agent.mig import apply
from node_agent.mig.hardware import GpuInfo, MigBackend, MigHardwareError, ResetUnavailable, snapshot
from node_agent.mig.journal import (
    JOURNAL_PATH,
    TIMED,
    Journal,
    JournalError,
    JournalFiles,
    JournalGpu,
    JournalStore,
    Outcome,
    Phase,
)
from node_agent.mig.kube import NodeApi, NodePatch, NodeView, PodView
from node_agent.mig.machine import Act, Action, DrainMode, MigState, Observation, TargetKind, Timeouts, decide
from node_agent.mig.metrics import MigMetrics
from node_agent.mig.plan import NodePlan, PlanError, diff, plan
from nvgpu import labels
from nvgpu.migparted import MigPartedConfig, MigPartedError
from nvgpu.nodescripts import facts
from nvgpu.taints import NodeTaint

log = logging.getLogger(__name__)

DEPLOY_LABELS = tuple(labels.GPU_DEPLOY_PREFIX + c for c in labels.GPU_DEPLOY_COMPONENTS)
RECONFIGURE_TAINT = NodeTaint(labels.MIG_RECONFIGURE_TAINT_KEY, "true", "NoSchedule")
DRAIN_ANNOTATIONS = (labels.DISRUPTION_REQUIRED, labels.DISRUPTION_APPROVED, labels.DRAINING, labels.DRAINED)
#: The value of Deckhouse's ``draining`` annotation names who asked for the drain.
DRAIN_SOURCE = "nvidia-gpu-mig-manager"
MIG_STATE_DIR = f"{facts.STATE_DIR}/mig"
STOP_MARKER = f"{MIG_STATE_DIR}/stopping"
FAILED_MARKER = f"{MIG_STATE_DIR}/failed-config"
CLEARED_MARKER = f"{MIG_STATE_DIR}/labels-cleared"
#: NVIDIA's GPU operator apps and this project's agents (``nvgpu.labels.GPU_AGENT_POD_LABELS``).
DEFAULT_CLIENT_LABELS: tuple[tuple[str, str], ...] = labels.GPU_AGENT_POD_LABELS
#: Actions after which the loop blocks until something changes.
BLOCKING = frozenset({Act.IDLE, Act.WAIT, Act.EXIT, Act.REBOOT})


class NotSettling(RuntimeError):
    """Too many actions in a row without blocking: something keeps undoing what the manager does."""


class Rebooter(Protocol):
    def reboot(self) -> None: ...


class StateFiles(JournalFiles, Protocol):
    """Host files the manager uses besides the journal (the stop, failed-config and labels-cleared
    markers), with the journal's operations; ``node_agent.host.HostRoot`` is the production one."""


class StepLock(Protocol):
    """Called for an exclusive lock held for one step, so the manager and its own ``preStop`` hook never
    act at once (:class:`node_agent.mig.hostfiles.HostStepLock`; a lock not acquired in time raises
    :class:`~node_agent.mig.journal.JournalError`)."""

    def __call__(self) -> contextlib.AbstractContextManager[None]: ...


@dataclass(frozen=True)
class Settings:
    drain: DrainMode = DrainMode.DECKHOUSE
    allow_reboot: bool = False
    timeouts: Timeouts = field(default_factory=Timeouts)
    #: Watch timeout while idle. It also bounds how long the manager can be deaf to its Node: a watch
    #: opened across an API-server restart can stay silent (no event, no bookmark) until it times out,
    #: which at 60 s left a reconfiguration begun just after a restart waiting past a minute.
    idle_wait_s: float = 20.0
    #: Watch timeout once an idle watch has run its course: the server's watches work, so the manager
    #: resumes from the version the last one ended at, without reading the Node again. At rest it costs
    #: one request per this many seconds (a read and a 20 s watch cost six a minute on every MIG node).
    idle_resume_s: float = 300.0
    busy_wait_s: float = 5.0  #: re-check interval while waiting for approval, drain or clients
    max_steps: int = 64  #: actions per :meth:`MigManager.run_until_blocked`, a guard against loops
    #: Pod labels (``key``, ``value``) marking GPU agents (device plugin, feature discovery, DCGM) whose
    #: pods the manager deletes once the node is tainted; any pod requesting ``nvidia.com/*`` counts too.
    client_labels: tuple[tuple[str, str], ...] = DEFAULT_CLIENT_LABELS


@dataclass
class Target:
    kind: TargetKind
    reason: str = ""
    node_plan: NodePlan | None = None


@dataclass
class MigManager:
    node: NodeApi
    backend: MigBackend
    load_config: Callable[[], MigPartedConfig]
    files: StateFiles
    step_lock: StepLock
    boot_id: Callable[[], str]
    clock: Callable[[], float]
    rebooter: Rebooter
    settings: Settings = Settings()
    #: Times the waits (approval, drain, clients, preStop): unlike ``clock``, the wall clock the journal
    #: records for people, no NTP step or ``date -s`` moves it (see :class:`~node_agent.mig.journal.Journal`).
    monotonic: Callable[[], float] = time.monotonic
    journal_path: str = JOURNAL_PATH
    stop: threading.Event = field(default_factory=threading.Event)
    _node: NodeView | None = None
    #: The resourceVersion of the Node as last read or patched. The loop watches from it: ``_node`` is
    #: dropped after a WAIT (to re-read), and a watch without a version answers at once with the
    #: current Node, which turned every wait for approval, drain or clients into a busy loop.
    _seen_rv: str = ""
    _rebooted: bool = False
    _gpus: tuple[GpuInfo, ...] | None = None
    #: The GPUs compared with a config, kept between the steps of one round: within a round only the
    #: manager's own GPU actions change the hardware, and those drop it (every round starts afresh).
    _target: tuple[str | None, Target] | None = None
    #: The latest actions (bounded: the DaemonSet loop runs for months).
    history: deque[Action] = field(default_factory=lambda: deque(maxlen=256))
    #: Where :attr:`metrics` registers (the status endpoint's registry; tests pass their own).
    registry: CollectorRegistry | None = None
    #: Makes the device nodes of the instances there are now (``/dev/nvidia-caps/nvidia-cap<N>``), run after
    #: every layout change and rollback, as NVIDIA's MIG manager runs ``nvidia-ctk system create-device-nodes``
    #: and ``nvidia-smi`` after its changes (mig-parted ``Reconfigure.handleCDI`` / ``runNvidiaSMI``): the
    #: driver makes no node for a new instance, and a container given a MIG device without them cannot use it.
    device_nodes: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.store = JournalStore(self.files, self.journal_path)
        self.metrics = MigMetrics(self.registry, clock=self.clock)
        self.metrics.watch_journal(self._peek_journal, self._phase_age)

    # --- observing --------------------------------------------------------------------------------

    def gpus(self) -> tuple[GpuInfo, ...]:
        if self._gpus is None:
            self._gpus = tuple(self.backend.gpus())
        return self._gpus

    def _read_node(self) -> NodeView:
        if self._node is None:
            self._node = self.node.read_node()
            self._seen_rv = self._node.resource_version
        return self._node

    def _load_journal(self, node: NodeView) -> Journal | None:
        try:
            return self.store.load()
        except JournalError as e:
            # Never guess at GPU state from a broken record: give the node back and report it.
            log.error("event=journal-unreadable error=%s", e)
            now = self.clock()
            return Journal(
                config=node.labels.get(labels.MIG_CONFIG, ""),
                phase=Phase.RESTORE,
                started_at=now,
                phase_since=now,
                outcome=Outcome.FAILED,
                reason=str(e),
            )

    def _anchored(self, journal: Journal, monotonic: float, boot: str) -> Journal:
        """The journal with its wait timed on this boot's monotonic clock.

        A phase entered by this boot carries its monotonic reading. One entered before a reboot, or by an
        agent that did not record the reading, cannot be timed from it, and its wall-clock start may be
        a step away from the truth (forward, it failed a drain that had just begun, not to be retried
        until the label changed). Its wait starts again now, recorded so that a restarted manager goes
        on from the same point.
        """
        if journal.phase not in TIMED or journal.anchored(monotonic, boot):
            return journal
        reason = "no-monotonic-reading" if journal.phase_mono is None else "another-boot"
        log.info("event=mig-wait-restarted phase=%s reason=%s", journal.phase.value, reason)
        anchored = journal.reanchored(monotonic, boot)
        self._save(anchored)
        return anchored

    def _phase_age(self, journal: Journal) -> float:
        """The phase's age for the metric: its monotonic wait on this boot; the wall clock's reading (never
        below 0) for a phase not timed on this boot yet."""
        monotonic, boot = self.monotonic(), self.boot_id()
        if journal.anchored(monotonic, boot):
            return journal.waited(monotonic, boot)
        return max(self.clock() - journal.phase_since, 0.0)

    def target(self, name: str | None) -> Target:
        if not name:
            return Target(TargetKind.NONE)
        try:
            node_plan = plan(self.load_config(), name, self.gpus())
            d = diff(node_plan, snapshot(self.backend, self.gpus()))
        except (PlanError, MigPartedError) as e:
            return Target(TargetKind.INVALID, str(e))
        except MigHardwareError as e:
            return Target(TargetKind.INVALID, f"NVML: {e}")
        if d.applied:
            return Target(TargetKind.APPLIED, node_plan=node_plan)
        return Target(TargetKind.MODE if d.mode else TargetKind.LAYOUT, node_plan=node_plan)

    # Marker files: a host error is a journal error, which the loop reports and retries like the journal's.
    def _read(self, path: str) -> bytes | None:
        try:
            return self.files.read_bytes_or_none(path)
        except HostError as e:
            raise JournalError(str(e)) from e

    def _write(self, path: str, data: bytes) -> None:
        try:
            self.files.write_atomic(path, data, mode=statefile.STATE_FILE_MODE)
        except HostError as e:
            raise JournalError(str(e)) from e

    def _remove(self, path: str) -> None:
        try:
            self.files.remove(path)
        except HostError as e:
            raise JournalError(str(e)) from e

    def _stopping(self) -> bool:
        return self.stop.is_set() or self._read(STOP_MARKER) is not None

    def observe(self) -> tuple[Observation, Target]:
        node = self._read_node()
        journal = self._load_journal(node)
        monotonic, boot = self.monotonic(), self.boot_id()
        if journal is not None:
            journal = self._anchored(journal, monotonic, boot)
        desired = node.labels.get(labels.MIG_CONFIG) or None
        name = journal.config if journal is not None else desired
        if self._target is None or self._target[0] != name:
            self._target = (name, self.target(name))
        target = self._target[1]
        pods: tuple[PodView, ...] = ()
        busy: tuple[str, ...] = ()
        if journal is not None and journal.phase in (Phase.DRAINING, Phase.CLIENTS):
            pods = tuple(p for p in self.node.pods_on_node() if not p.finished)
        if journal is not None and journal.phase is Phase.CLIENTS and target.node_plan is not None:
            busy = self._busy(target.node_plan)
        state = node.labels.get(labels.MIG_CONFIG_STATE)
        paused = (
            state in (MigState.PENDING, MigState.REBOOTING)
            and all(node.labels.get(k) in (labels.PAUSED_FOR_MIG_CHANGE, "false") for k in DEPLOY_LABELS)
            and RECONFIGURE_TAINT in node.taints
        )
        obs = Observation(
            now=self.clock(),
            desired=desired,
            state=state,
            sharing=node.labels.get(labels.DEVICE_GPU_CONFIG),
            mig_capable=node.labels.get(labels.MIG_CAPABLE),
            target=target.kind,
            target_reason=target.reason,
            annotations={k: v for k, v in node.annotations.items() if k in DRAIN_ANNOTATIONS},
            paused=paused,
            journal=journal,
            workloads=tuple(p.ref for p in pods if p.gpu_requests and not p.daemonset),
            clients=tuple(p.ref for p in pods if self._is_client(p)),
            busy_gpus=busy,
            boot_id=boot,
            drain=self.settings.drain,
            stopping=self._stopping(),
            failed_config=self._failed_config(),
            failure_reason=node.annotations.get(labels.MIG_FAILURE_REASON),
            labels_cleared=self._read(CLEARED_MARKER) is not None,
            timeouts=self.settings.timeouts,
            monotonic=monotonic,
        )
        return obs, target

    def _is_client(self, p: PodView) -> bool:
        """A pod holding GPUs: it requests ``nvidia.com/*``, is a known GPU agent, or uses deploy labels."""
        return (
            bool(p.gpu_requests)
            or any(p.labels.get(k) == v for k, v in self.settings.client_labels)
            or any(k.startswith(labels.GPU_DEPLOY_PREFIX) for k in p.selector_keys)
        )

    def _failed_config(self) -> str | None:
        raw = self._read(FAILED_MARKER)
        return raw.decode(errors="replace").strip() if raw is not None else None

    def _busy(self, node_plan: NodePlan) -> tuple[str, ...]:
        out = []
        for t in node_plan.targets:
            try:
                pids = self.backend.gpu_processes(t.index)
            except MigHardwareError as e:
                out.append(f"GPU {t.index} (cannot list processes: {e})")
                continue
            if pids:
                out.append(f"GPU {t.index} (pid {', '.join(map(str, pids))})")
        return tuple(out)

    # --- the loop ---------------------------------------------------------------------------------

    def step(self) -> Action:
        with self.step_lock():
            obs, target = self.observe()
            action = decide(obs)
            log.debug("event=mig-decision act=%s reason=%r", action.act.value, action.reason)
            self.history.append(action)
            self.metrics.action(action.act)
            if action.act in _CHANGES_GPUS:
                self._target = None
            try:
                self._perform(action, obs, target)
            except Conflict:
                # The Node changed since it was read (a taint patch is conditional on the version it
                # was computed from): nothing of the step happened; read again and decide again.
                log.info("event=node-changed-meanwhile act=%s", action.act.value)
                self._node = None
            return action

    def run_until_blocked(self) -> Action:
        """Take actions until one blocks (idle, waiting, rebooting) or the manager may exit."""
        self._target = None
        for _ in range(self.settings.max_steps):
            action = self.step()
            if action.act in BLOCKING:
                return action
        last = [a.act.value for a in list(self.history)[-5:]]
        raise NotSettling(f"MIG manager took {self.settings.max_steps} actions without settling: {last}")

    def request_stop(self) -> None:
        """Stop the DaemonSet loop: set :attr:`stop` and break off the Node watch it may be idle in.

        The SIGTERM path (safe from a signal handler). Setting the event alone left an idle manager
        in its watch until the watch timed out (60 s), past the pod's 30 s grace period.
        """
        self.stop.set()
        self.node.cancel_waits()

    def run(self) -> None:
        """The DaemonSet loop: converge, then wait for the Node to change; returns when stopped."""
        self._remove(STOP_MARKER)  # a marker from a previous pod must not stop this one
        while True:
            try:
                action = self.run_until_blocked()
            except (KubeError, MigHardwareError, JournalError, NotSettling) as e:
                # Transient (or someone fighting over the Node): the journal still says where we are;
                # the next round resumes from it after a pause.
                log.warning("event=mig-step-failed error=%s", e)
                self.metrics.step_failed()
                self._node = None
                if self.stop.is_set():
                    journal = self._peek_journal()
                    if journal is None or journal.phase not in _IN_FLIGHT:
                        # Stopping, and no GPU change is half done: leave now; the journal lets the next
                        # pod resume whatever was started.
                        log.info("event=mig-manager-stopped reason=step-failed-while-stopping")
                        return
                    # A GPU change is half done: keep at it, paced (a set stop event no longer makes
                    # the pause return at once, which spun this loop at full CPU).
                    threading.Event().wait(self.settings.busy_wait_s)
                else:
                    self.stop.wait(self.settings.busy_wait_s)
                continue
            self.metrics.round()
            if action.act is Act.EXIT:
                return
            rv = self._seen_rv
            self._node = None
            if self.stop.is_set():
                continue
            try:
                if action.act is Act.IDLE:
                    self._wait_idle(rv)
                else:
                    self.node.wait_for_change(rv, self.settings.busy_wait_s)
            except KubeError as e:
                log.warning("event=watch-failed error=%s", e)
                self.stop.wait(self.settings.busy_wait_s)

    def _wait_idle(self, rv: str) -> None:
        """Wait for the Node to change, resuming the watch from where the last one ended while nothing
        did. The first watch after a read is short (``idle_wait_s``: it bounds the deafness of a watch
        opened across an API-server restart); once one has run its course, ``idle_resume_s``."""
        timeout = self.settings.idle_wait_s
        while not self.stop.is_set():
            latest = self.node.wait_for_change(rv, timeout)
            if latest is None:
                return
            rv, timeout = latest, self.settings.idle_resume_s

    # --- actions ----------------------------------------------------------------------------------

    def _patch(self, patch: NodePatch) -> NodeView:
        self._node = self.node.patch_node(patch)
        self._seen_rv = self._node.resource_version
        return self._node

    def _save(self, journal: Journal) -> None:
        self.store.save(journal)

    def _perform(self, a: Action, o: Observation, target: Target) -> None:
        j = o.journal
        act = a.act
        if act in (Act.IDLE, Act.WAIT, Act.EXIT):
            if act is Act.WAIT:
                self._node = None  # someone else must act: re-read next time
                if j is not None and j.phase is Phase.DRAINING and o.drain is DrainMode.CORDON and o.workloads:
                    # The manager is the drainer here: retry what a PodDisruptionBudget refused (429),
                    # as ``kubectl drain`` does, until the budget allows it or the drain times out.
                    self._evict_workloads()
            return
        node = self._read_node()
        if act is Act.MARK_SUCCESS:
            self._patch(NodePatch(labels={labels.MIG_CONFIG_STATE: MigState.SUCCESS.value}))
        elif act is Act.REJECT:
            self._patch(NodePatch(labels={labels.MIG_CONFIG_STATE: MigState.FAILED.value},
                                  annotations={labels.MIG_FAILURE_REASON: a.reason}))
            self._event(node, "MigConfigRejected", a.reason, warning=True)
        elif act is Act.CLEAR_LABELS:
            self._patch(NodePatch(labels={labels.MIG_CONFIG: None, labels.MIG_CONFIG_STATE: None}))
            self._write(CLEARED_MARKER, b"all-disabled\n")
        elif act is Act.BEGIN:
            assert o.desired is not None
            originals: dict[str, str | None] = {}
            # Values left behind by a wedged or journal-less manager are not worth restoring.
            stale = {labels.PAUSED_FOR_MIG_CHANGE, MigState.PENDING.value, MigState.REBOOTING.value}
            for key in (*DEPLOY_LABELS, labels.MIG_CONFIG_STATE):
                value = node.labels.get(key)
                originals[key] = None if value in stale else value
            self._save(
                Journal(
                    config=o.desired,
                    phase=Phase.PAUSING,
                    started_at=o.now,
                    phase_since=o.now,
                    phase_mono=o.monotonic,
                    phase_boot_id=o.boot_id,
                    boot_id=o.boot_id,
                    original_labels=originals,
                    was_unschedulable=node.unschedulable,
                )
            )
            self._remove(CLEARED_MARKER)
            log.info("event=mig-reconfigure-begin config=%s", o.desired)
        elif j is None:
            raise AssertionError(f"action {act} needs a journal")
        else:
            self._perform_journaled(a, o, j, node, target)

    def _perform_journaled(self, a: Action, o: Observation, j: Journal, node: NodeView, target: Target) -> None:
        act = a.act
        if act is Act.RETARGET:
            assert o.desired is not None
            self._save(j.model_copy(update={"config": o.desired}))
        elif act is Act.PAUSE:
            state = MigState.REBOOTING if j.phase is Phase.REBOOTING else MigState.PENDING
            new_labels: dict[str, str | None] = {labels.MIG_CONFIG_STATE: state.value}
            for key in DEPLOY_LABELS:
                if node.labels.get(key) != "false":
                    new_labels[key] = labels.PAUSED_FOR_MIG_CHANGE
            taints = node.taints if RECONFIGURE_TAINT in node.taints else (*node.taints, RECONFIGURE_TAINT)
            self._patch(NodePatch(labels=new_labels, taints=tuple(taints), resource_version=node.resource_version,
                                  taints_read=node.taints))
            if a.phase is not None and a.phase is not j.phase:
                self._save(j.advance(a.phase, o.at))
        elif act is Act.REQUEST_APPROVAL:
            self._patch(NodePatch(annotations={labels.DISRUPTION_REQUIRED: ""}))
        elif act is Act.START_DRAIN:
            self._start_drain(o, node)
            self._save(j.advance(Phase.DRAINING, o.at))
        elif act is Act.STOP_CLIENTS:
            for p in self.node.pods_on_node():
                if p.daemonset and not p.finished and self._is_client(p):
                    self.node.delete_pod(p.namespace, p.name)
            self._save(j.model_copy(update={"clients_stopped": True}))
        elif act is Act.ADVANCE:
            assert a.phase is not None
            changes: dict[str, object] = {}
            if j.phase is Phase.CLIENTS:
                changes["previous"] = [JournalGpu.of(s) for s in snapshot(self.backend, self.gpus())]
            self._save(j.advance(a.phase, o.at, **changes))
        elif act is Act.APPLY_MODE:
            self._apply_mode(o, j, target)
        elif act is Act.REBOOT:
            self._reboot(node)
        elif act is Act.APPLY_LAYOUT:
            self._apply_layout(o, j, target)
        elif act is Act.ROLLBACK:
            self._rollback(a, o, j)
        elif act is Act.FINISH:
            assert a.outcome is not None
            self._save(j.advance(Phase.RESTORE, o.at, outcome=a.outcome, reason=a.reason))
        elif act is Act.RESTORE:
            self._restore(j, node)
        else:
            raise AssertionError(f"unhandled action {act}")

    def _start_drain(self, o: Observation, node: NodeView) -> None:
        if self.settings.drain is DrainMode.DECKHOUSE:
            if labels.DRAINING not in node.annotations and labels.DRAINED not in node.annotations:
                self._patch(NodePatch(annotations={labels.DRAINING: DRAIN_SOURCE}))
            return
        if not node.unschedulable:
            self._patch(NodePatch(unschedulable=True))
        self._evict_workloads()

    def _evict_workloads(self) -> None:
        """Evict the GPU workloads on the node; one a PodDisruptionBudget protects stays for now."""
        for pod in self.node.pods_on_node():
            if pod.gpu_requests and not pod.daemonset and not pod.finished:
                self.node.evict(pod.namespace, pod.name)

    def _destructive_start(self, j: Journal) -> Journal:
        started = j.model_copy(update={"attempts": j.attempts + 1})
        self._save(started)
        return started

    def _apply_mode(self, o: Observation, j: Journal, target: Target) -> None:
        assert target.node_plan is not None
        j = self._destructive_start(j)
        try:
            apply.apply_modes(self.backend, target.node_plan)  # a mode still pending after the reset raises
        except ResetUnavailable as e:
            if self.settings.allow_reboot:
                self._save(j.advance(Phase.REBOOTING, o.at, boot_id=o.boot_id, reason=str(e)))
                return
            self._save(
                j.advance(
                    Phase.ROLLBACK, o.at,
                    reason=f"the MIG mode change needs a GPU reset, which failed ({e}); rebooting is not allowed",
                )
            )
            return
        except MigHardwareError as e:
            self._save(j.advance(Phase.ROLLBACK, o.at, reason=f"applying MIG mode failed: {e}"))
            return
        self._save(j.advance(Phase.LAYOUT, o.at))

    def _reboot(self, node: NodeView) -> None:
        if node.labels.get(labels.MIG_CONFIG_STATE) != MigState.REBOOTING:
            self._patch(NodePatch(labels={labels.MIG_CONFIG_STATE: MigState.REBOOTING.value}))
        if not self._rebooted:
            self._rebooted = True
            log.info("event=reboot-requested reason=mig-mode-change")
            self.rebooter.reboot()

    def _apply_layout(self, o: Observation, j: Journal, target: Target) -> None:
        assert target.node_plan is not None
        j = self._destructive_start(j)
        try:
            apply.apply_layouts(self.backend, target.node_plan, self.gpus())
        except MigHardwareError as e:
            self._save(j.advance(Phase.ROLLBACK, o.at, reason=f"applying MIG layout failed: {e}"))
            return
        self._make_device_nodes()
        self._save(j.advance(Phase.VERIFY, o.at))

    def _make_device_nodes(self) -> None:
        """:attr:`device_nodes`; a failure is logged, not fatal: the layout is right, and the device plugin
        reports the missing node by name when it builds the device (NVIDIA's manager logs and goes on too)."""
        if self.device_nodes is None:
            return
        try:
            self.device_nodes()
        except (HostError, MigHardwareError) as e:
            log.warning("event=device-nodes-failed error=%s", e)

    def _rollback(self, a: Action, o: Observation, j: Journal) -> None:
        reason = a.reason or j.reason
        if j.phase is not Phase.ROLLBACK:
            j = j.advance(Phase.ROLLBACK, o.at, reason=reason)
        j = self._destructive_start(j)
        problems = apply.restore(self.backend, j.previous_states())
        self._make_device_nodes()
        if problems:
            reason = f"{reason}; rollback incomplete: {'; '.join(problems)}"
        else:
            reason = f"{reason}; previous layout restored"
        self._save(j.advance(Phase.RESTORE, o.at, outcome=Outcome.FAILED, reason=reason))

    def _restore(self, j: Journal, node: NodeView) -> None:
        new_labels: dict[str, str | None] = {}
        for key in DEPLOY_LABELS:
            current = node.labels.get(key)
            original = j.original_labels.get(key) if key in j.original_labels else (
                None if current == labels.PAUSED_FOR_MIG_CHANGE else current
            )
            if current != original:
                new_labels[key] = original
        if j.outcome is Outcome.ABORTED:
            state: str | None = j.original_labels.get(labels.MIG_CONFIG_STATE)
        else:
            state = (MigState.SUCCESS if j.outcome is Outcome.SUCCESS else MigState.FAILED).value
        if node.labels.get(labels.MIG_CONFIG_STATE) != state:
            new_labels[labels.MIG_CONFIG_STATE] = state
        taints = None
        if RECONFIGURE_TAINT.key in {t.key for t in node.taints}:
            taints = tuple(t for t in node.taints if t.key != RECONFIGURE_TAINT.key)
        annotations: dict[str, str | None] = {k: None for k in DRAIN_ANNOTATIONS if k in node.annotations}
        if j.outcome is Outcome.FAILED:
            annotations[labels.MIG_FAILURE_REASON] = f"MIG config {j.config!r}: {j.reason}"
        elif labels.MIG_FAILURE_REASON in node.annotations:
            annotations[labels.MIG_FAILURE_REASON] = None
        uncordon = False if node.unschedulable and not j.was_unschedulable else None
        self._patch(NodePatch(labels=new_labels, annotations=annotations, taints=taints, unschedulable=uncordon,
                              resource_version=node.resource_version if taints is not None else "",
                              taints_read=node.taints))
        if j.outcome is Outcome.SUCCESS:
            self._remove(FAILED_MARKER)
            self._event(node, "MigReconfigured", f"MIG config {j.config!r} applied", warning=False)
        elif j.outcome is Outcome.FAILED:
            self._write(FAILED_MARKER, j.config.encode())
            self._event(node, "MigReconfigureFailed", f"MIG config {j.config!r}: {j.reason}", warning=True)
        else:
            self._event(node, "MigReconfigureAborted", j.reason, warning=False)
        self.store.clear()
        self._gpus = None
        self.metrics.finished(j)
        log.info("event=mig-reconfigure-end config=%s outcome=%s reason=%r", j.config, j.outcome, j.reason)

    def _event(self, node: NodeView, reason: str, message: str, warning: bool) -> None:
        try:
            self.node.event(node, reason, message, warning)
        except KubeError as e:  # an Event is a courtesy; never fail the restore over it
            log.warning("event=event-failed reason=%s error=%s", reason, e)

    # --- preStop ------------------------------------------------------------------------------------

    def pre_stop(self, timeout_s: float, poll_s: float = 1.0) -> Outcome | None:
        """Ask the running manager to stop, wait for any GPU change in flight, and give the node back.

        Returns the outcome of the operation that was in flight, or None when there was none.
        """
        self._write(STOP_MARKER, b"stop\n")
        deadline = self.monotonic() + timeout_s
        while True:
            journal = self._peek_journal()
            if journal is None or journal.phase not in _IN_FLIGHT or self.monotonic() >= deadline:
                break
            self.stop.wait(poll_s)
        outcome: Outcome | None = None
        for _ in range(self.settings.max_steps):
            self._node = None
            with self.step_lock():
                obs, target = self.observe()
                if obs.journal is None:
                    return outcome
                action = decide(obs)
                outcome = action.outcome or obs.journal.outcome or outcome
                self.history.append(action)
                if action.act in BLOCKING:
                    return outcome
                self._target = None
                self._perform(action, obs, target)
        return outcome

    def _peek_journal(self) -> Journal | None:
        try:
            return self.store.load()
        except JournalError:
            return None


#: Actions after which the GPUs must be read again.
_CHANGES_GPUS = frozenset({Act.APPLY_MODE, Act.APPLY_LAYOUT, Act.ROLLBACK, Act.REBOOT, Act.RESTORE})

#: Phases the preStop path lets the running manager finish (GPU changes and their rollback).
_IN_FLIGHT = frozenset({Phase.MODE, Phase.LAYOUT, Phase.VERIFY, Phase.ROLLBACK})


