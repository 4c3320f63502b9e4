"""The MIG manager's decisions as a pure function: observation in, next action out.

Everything the manager looks at — the Node's labels and annotations, the journal, how the GPUs compare
with the target layout, the GPU client pods left, the boot ID, the clocks — is gathered into one frozen
:class:`Observation`; :func:`decide` returns the one :class:`Action` to take next. There is no I/O
here, so every path (approval waits, drains, crashes at each phase, reboots, rollbacks, bad input) is
tested from tables in ``tests/node_agent/mig/test_machine.py``; the executor only performs actions and records
phases. Each action is idempotent, so repeating one after a crash is harmless.

The approval, drain and clients timeouts are measured on the monotonic clock from the journal's reading
at the phase's start (the wall clock can be stepped: forward, it failed a drain that had waited a minute,
and the failed layout is not retried until its label changes); see :class:`~node_agent.mig.journal.Journal`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from node_agent.mig.journal import DESTRUCTIVE, Instant, Journal, Outcome, Phase
from nvgpu import labels
from nvgpu.migparted import ALL_DISABLED


class MigState(StrEnum):
    """Values of ``nvidia.com/mig.config.state`` (NVIDIA's mig-manager vocabulary)."""

    PENDING = "pending"
    REBOOTING = "rebooting"
    SUCCESS = "success"
    FAILED = "failed"


class DrainMode(StrEnum):
    DECKHOUSE = "deckhouse"  #: disruption-required → approved → draining → drained, by node-manager
    CORDON = "cordon"  #: no Deckhouse: cordon the node and evict GPU workloads ourselves


class TargetKind(StrEnum):
    """How the GPUs compare with the target config."""

    NONE = "none"  #: no target (no label and no journal)
    INVALID = "invalid"  #: the config cannot apply here (reason says why)
    APPLIED = "applied"
    MODE = "mode"  #: MIG mode must change (and then the layout)
    LAYOUT = "layout"  #: only instances must change


class Act(StrEnum):
    IDLE = "idle"  #: nothing to do until something changes
    WAIT = "wait"  #: an operation is waiting on someone else (reason says on what)
    EXIT = "exit"  #: stopping and nothing in flight
    MARK_SUCCESS = "mark-success"  #: already applied: just set state=success
    REJECT = "reject"  #: bad input before any change: state=failed, Event
    CLEAR_LABELS = "clear-labels"  #: node left MIG and GPUs are disabled: drop mig.config and state
    BEGIN = "begin"  #: write the journal (phase PAUSING)
    RETARGET = "retarget"  #: the label changed before any GPU change: follow it
    PAUSE = "pause"  #: state=pending, deploy labels paused, taint; then APPROVAL
    REQUEST_APPROVAL = "request-approval"  #: annotate disruption-required
    START_DRAIN = "start-drain"  #: annotate draining (Deckhouse) or cordon + evict; then DRAINING
    STOP_CLIENTS = "stop-clients"  #: delete GPU agent pods (the taint keeps their DaemonSets away)
    ADVANCE = "advance"  #: move the journal to ``phase`` (snapshotting GPUs when leaving CLIENTS)
    APPLY_MODE = "apply-mode"
    REBOOT = "reboot"
    APPLY_LAYOUT = "apply-layout"
    ROLLBACK = "rollback"  #: put the journaled previous layout back, then finish as failed
    FINISH = "finish"  #: record the outcome (phase RESTORE)
    RESTORE = "restore"  #: give the node back: labels, taint, annotations, cordon, state, Event


@dataclass(frozen=True)
class Action:
    act: Act
    reason: str = ""
    phase: Phase | None = None
    outcome: Outcome | None = None


@dataclass(frozen=True)
class Timeouts:
    """Seconds; ``None`` waits forever (Deckhouse approval is often manual)."""

    approval: float | None = None
    drain: float | None = 1800.0
    clients: float = 300.0  #: NVIDIA's manager waits 5 minutes for GPU client pods
    max_attempts: int = 2  #: destructive attempts of one phase before rolling back (crash loops)


@dataclass(frozen=True)
class Observation:
    #: The wall clock (Unix time): what the journal records for people. No timeout reads it: a wall
    #: clock stepped by NTP or by hand would fail a node early or hold a failure back.
    now: float
    desired: str | None  #: ``nvidia.com/mig.config``
    state: str | None  #: ``nvidia.com/mig.config.state``
    sharing: str | None  #: ``node.deckhouse.io/device-gpu.config``
    mig_capable: str | None  #: ``nvidia.com/mig.capable``
    target: TargetKind  #: for the journal's config when there is a journal, else for ``desired``
    target_reason: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    paused: bool = False  #: state pending/rebooting, every deploy label paused (or false), taint present
    journal: Journal | None = None
    workloads: tuple[str, ...] = ()  #: pods using GPUs on the node (the drain waits for these)
    clients: tuple[str, ...] = ()  #: GPU client pods (device plugin, GFD, DCGM...) still on the node
    busy_gpus: tuple[str, ...] = ()  #: "GPU 0 (pid 4242)" for GPUs held by processes
    boot_id: str = ""
    drain: DrainMode = DrainMode.DECKHOUSE
    stopping: bool = False
    #: The config whose last attempt failed (kept on the host): not retried until the label changes or
    #: an operator deletes the state label, so a bad layout cannot disrupt the node over and over.
    failed_config: str | None = None
    #: The failure reason on the Node (annotation): a rejection is reported once per reason, and retried
    #: by itself once the config becomes usable (a rejection disrupted nothing).
    failure_reason: str | None = None
    #: This node's MIG labels were already cleared after a rollback; if a node template puts
    #: ``all-disabled`` back, leave it (clearing again would fight the template forever).
    labels_cleared: bool = False
    timeouts: Timeouts = Timeouts()
    #: The monotonic clock, on boot ``boot_id``: the phase's wait is measured from the journal's reading
    #: on it (:meth:`~node_agent.mig.journal.Journal.waited`).
    monotonic: float = 0.0

    @property
    def at(self) -> Instant:
        """This observation's moment, as the journal records a phase's start."""
        return Instant(self.now, self.monotonic, self.boot_id)


def decide(o: Observation) -> Action:
    j = o.journal
    if j is None:
        return _without_journal(o)
    if j.phase is Phase.RESTORE:
        return Action(Act.RESTORE, j.reason or "giving the node back", outcome=j.outcome)
    if j.phase in DESTRUCTIVE:
        return _destructive(o, j)
    return _preparing(o, j)


def _without_journal(o: Observation) -> Action:
    if o.desired is None:
        return Action(Act.EXIT) if o.stopping else Action(Act.IDLE)
    if o.target is TargetKind.APPLIED:
        if o.desired == ALL_DISABLED and o.sharing != "MIG":
            if o.labels_cleared:
                return Action(Act.EXIT) if o.stopping else Action(Act.IDLE, "MIG is off and its labels were cleared")
            return Action(Act.CLEAR_LABELS, f"node left MIG ({labels.DEVICE_GPU_CONFIG}={o.sharing}) and MIG is off")
        if o.state != MigState.SUCCESS:
            return Action(Act.MARK_SUCCESS, f"MIG config {o.desired!r} is already applied")
        return Action(Act.EXIT) if o.stopping else Action(Act.IDLE)
    if o.stopping:
        return Action(Act.EXIT)
    if o.state == MigState.FAILED and o.failed_config == o.desired:
        return Action(Act.IDLE, f"MIG config {o.desired!r} failed; delete {labels.MIG_CONFIG_STATE} to retry")
    reason = _input_problem(o)
    if reason:
        if o.state == MigState.FAILED and o.failure_reason == reason:
            return Action(Act.IDLE, reason)
        return Action(Act.REJECT, reason)
    return Action(Act.BEGIN, f"MIG config {o.desired!r} differs from the GPUs' layout")


def _input_problem(o: Observation) -> str:
    if o.mig_capable == "false" and o.desired != ALL_DISABLED:
        return f"node is not MIG-capable ({labels.MIG_CAPABLE}=false); cannot apply {o.desired!r}"
    if o.target is TargetKind.INVALID:
        return o.target_reason or f"MIG config {o.desired!r} cannot be applied on this node"
    return ""


def _finish(outcome: Outcome, reason: str) -> Action:
    return Action(Act.FINISH, reason, outcome=outcome)


def _preparing(o: Observation, j: Journal) -> Action:
    """Phases before any GPU change: anything unexpected aborts cleanly."""
    if o.desired != j.config:
        if o.desired is None:
            return _finish(Outcome.ABORTED, f"{labels.MIG_CONFIG} was removed before the GPUs were changed")
        return Action(Act.RETARGET, f"{labels.MIG_CONFIG} changed to {o.desired!r} before the GPUs were changed")
    if o.stopping:
        return _finish(Outcome.ABORTED, "the MIG manager is stopping; no GPU was changed")
    problem = _input_problem(o)
    if problem:
        return _finish(Outcome.FAILED, problem)
    if o.target is TargetKind.APPLIED:
        return _finish(Outcome.SUCCESS, f"MIG config {j.config!r} is applied")
    waited = j.waited(o.monotonic, o.boot_id)
    if j.phase is Phase.PAUSING or not o.paused:
        return Action(Act.PAUSE, "pausing GPU clients", phase=Phase.APPROVAL if j.phase is Phase.PAUSING else j.phase)
    if j.phase is Phase.APPROVAL:
        if o.drain is DrainMode.CORDON:
            return Action(Act.START_DRAIN, "cordoning and evicting GPU workloads", phase=Phase.DRAINING)
        ann = o.annotations
        if labels.DISRUPTION_APPROVED in ann or labels.DRAINING in ann or labels.DRAINED in ann:
            return Action(Act.START_DRAIN, "disruption approved", phase=Phase.DRAINING)
        if o.timeouts.approval is not None and waited > o.timeouts.approval:
            return _finish(Outcome.FAILED, f"no disruption approval within {o.timeouts.approval:.0f}s")
        if labels.DISRUPTION_REQUIRED not in ann:
            return Action(Act.REQUEST_APPROVAL, "requesting disruption approval")
        return Action(Act.WAIT, f"waiting for {labels.DISRUPTION_APPROVED}")
    if j.phase is Phase.DRAINING:
        drained = (
            labels.DRAINED in o.annotations if o.drain is DrainMode.DECKHOUSE else not o.workloads
        )
        if drained:
            return Action(Act.ADVANCE, "node drained", phase=Phase.CLIENTS)
        if o.timeouts.drain is not None and waited > o.timeouts.drain:
            left = f": {', '.join(o.workloads)} still running" if o.workloads else ""
            return _finish(Outcome.FAILED, f"node not drained within {o.timeouts.drain:.0f}s{left}")
        return Action(Act.WAIT, "waiting for the drain")
    # CLIENTS
    if o.clients and not j.clients_stopped:
        return Action(Act.STOP_CLIENTS, f"stopping GPU clients: {', '.join(o.clients)}")
    if o.clients or o.busy_gpus:
        if waited > o.timeouts.clients:
            held = [*(f"pod {c}" for c in o.clients), *o.busy_gpus]
            return _finish(Outcome.FAILED, f"GPUs still in use after {o.timeouts.clients:.0f}s: {', '.join(held)}")
        return Action(Act.WAIT, "waiting for GPU clients to stop")
    first = Phase.MODE if o.target is TargetKind.MODE else Phase.LAYOUT
    return Action(Act.ADVANCE, "GPUs are free", phase=first)


def _destructive(o: Observation, j: Journal) -> Action:
    """Phases that change GPUs: finish the step (resume) or put the previous layout back."""
    if j.phase is Phase.ROLLBACK:
        if j.attempts >= o.timeouts.max_attempts:
            return _finish(Outcome.FAILED, f"{j.reason}; rollback was interrupted {j.attempts} times")
        return Action(Act.ROLLBACK, j.reason)
    if j.phase is Phase.REBOOTING:
        if o.boot_id == j.boot_id:
            return Action(Act.REBOOT, "waiting for the reboot the MIG mode change needs")
        if o.target is TargetKind.MODE:
            return Action(Act.ROLLBACK, "the MIG mode change did not take effect after rebooting")
        return Action(Act.ADVANCE, "rebooted; MIG mode changed", phase=Phase.LAYOUT)
    if j.attempts >= o.timeouts.max_attempts:
        return Action(Act.ROLLBACK, f"phase {j.phase.value} was interrupted {j.attempts} times")
    if o.target is TargetKind.INVALID:
        return Action(Act.ROLLBACK, o.target_reason)
    if j.phase is Phase.MODE:
        if o.target is not TargetKind.MODE:
            return Action(Act.ADVANCE, "MIG mode applied", phase=Phase.LAYOUT)
        return Action(Act.APPLY_MODE, "applying MIG mode")
    if j.phase is Phase.LAYOUT:
        if o.target is TargetKind.APPLIED:
            return Action(Act.ADVANCE, "layout applied", phase=Phase.VERIFY)
        return Action(Act.APPLY_LAYOUT, "applying MIG layout")
    # VERIFY
    if o.target is TargetKind.APPLIED:
        return _finish(Outcome.SUCCESS, f"MIG config {j.config!r} applied")
    return Action(Act.ROLLBACK, f"verification failed: the GPUs do not match {j.config!r} ({o.target.value} differs)")
