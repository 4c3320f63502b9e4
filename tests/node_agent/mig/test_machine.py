"""The MIG manager's decision function, from tables: observation in, action out. No I/O anywhere."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from node_agent.mig.journal import Journal, Outcome, Phase
from node_agent.mig.machine import Act, DrainMode, Observation, TargetKind, Timeouts, decide
from nvgpu import labels

NOW = 10_000.0
#: The monotonic clock at NOW (seconds since boot b1): the waits are timed on it.
MONO = 500.0
APPROVED = {labels.DISRUPTION_REQUIRED: "", labels.DISRUPTION_APPROVED: ""}


def obs(**kw: Any) -> Observation:
    base = Observation(now=NOW, desired="all-1g.10gb", state=None, sharing="MIG", mig_capable="true",
                       target=TargetKind.LAYOUT, boot_id="b1", monotonic=MONO)
    return replace(base, **kw)


def journal(phase: Phase, config: str = "all-1g.10gb", **kw: Any) -> Journal:
    """A journal whose phase began ``since`` (default 10 s before NOW), by both clocks, on boot b1."""
    since = kw.pop("since", NOW - 10)
    return Journal(config=config, phase=phase, started_at=NOW - 100, phase_since=since,
                   phase_mono=MONO - (NOW - since), phase_boot_id="b1", boot_id=kw.pop("boot_id", "b1"), **kw)


# (id, observation, expected action, expected phase or outcome)
TABLE: list[tuple[str, Observation, Act, Phase | Outcome | None]] = [
    # --- no journal: what to start -----------------------------------------------------------------
    ("no label: idle", obs(desired=None, target=TargetKind.NONE), Act.IDLE, None),
    ("no label, stopping: exit", obs(desired=None, target=TargetKind.NONE, stopping=True), Act.EXIT, None),
    ("applied, state unset: success", obs(target=TargetKind.APPLIED), Act.MARK_SUCCESS, None),
    ("applied, success: idle", obs(target=TargetKind.APPLIED, state="success"), Act.IDLE, None),
    ("applied, stopping: exit", obs(target=TargetKind.APPLIED, state="success", stopping=True), Act.EXIT, None),
    ("layout differs: begin", obs(), Act.BEGIN, None),
    ("mode differs: begin", obs(target=TargetKind.MODE), Act.BEGIN, None),
    ("differs but stopping: exit", obs(stopping=True), Act.EXIT, None),
    ("unknown config: reject", obs(target=TargetKind.INVALID, target_reason="unknown MIG config"), Act.REJECT, None),
    ("already rejected for this reason: idle",
     obs(target=TargetKind.INVALID, target_reason="bad", state="failed", failure_reason="bad"), Act.IDLE, None),
    ("rejected, now another reason: reject again",
     obs(target=TargetKind.INVALID, target_reason="worse", state="failed", failure_reason="bad"), Act.REJECT, None),
    ("rejected config became usable: begin", obs(state="failed", failure_reason="bad"), Act.BEGIN, None),
    ("failed attempt is not retried", obs(state="failed", failed_config="all-1g.10gb"), Act.IDLE, None),
    ("operator cleared the state: retry", obs(state=None, failed_config="all-1g.10gb"), Act.BEGIN, None),
    ("failed, then a new layout: begin", obs(state="failed", failed_config="all-2g.20gb"), Act.BEGIN, None),
    ("not MIG-capable: reject", obs(mig_capable="false"), Act.REJECT, None),
    ("not MIG-capable, all-disabled applied: clear",
     obs(mig_capable="false", desired="all-disabled", sharing="Exclusive", target=TargetKind.APPLIED),
     Act.CLEAR_LABELS, None),
    ("left MIG, rollback done: clear labels",
     obs(desired="all-disabled", sharing="TimeSlicing", target=TargetKind.APPLIED, state="success"),
     Act.CLEAR_LABELS, None),
    ("labels cleared before, template put all-disabled back: idle",
     obs(desired="all-disabled", sharing="Exclusive", target=TargetKind.APPLIED, labels_cleared=True), Act.IDLE, None),
    ("still a MIG group, all-disabled applied: success",
     obs(desired="all-disabled", sharing="MIG", target=TargetKind.APPLIED), Act.MARK_SUCCESS, None),
    ("left MIG, rollback pending: begin", obs(desired="all-disabled", sharing=None, target=TargetKind.MODE),
     Act.BEGIN, None),
    # --- preparing: pause, approval, drain, clients -------------------------------------------------
    ("pausing", obs(journal=journal(Phase.PAUSING)), Act.PAUSE, Phase.APPROVAL),
    ("approval: request", obs(journal=journal(Phase.APPROVAL), paused=True), Act.REQUEST_APPROVAL, None),
    ("approval: wait", obs(journal=journal(Phase.APPROVAL), paused=True,
                           annotations={labels.DISRUPTION_REQUIRED: ""}), Act.WAIT, None),
    ("approval: approved", obs(journal=journal(Phase.APPROVAL), paused=True, annotations=APPROVED),
     Act.START_DRAIN, Phase.DRAINING),
    ("approval: drain already started", obs(journal=journal(Phase.APPROVAL), paused=True,
                                            annotations={labels.DRAINING: "bashible"}),
     Act.START_DRAIN, Phase.DRAINING),
    ("approval: already drained", obs(journal=journal(Phase.APPROVAL), paused=True,
                                      annotations={labels.DRAINED: "user"}), Act.START_DRAIN, Phase.DRAINING),
    ("approval: timed out", obs(journal=journal(Phase.APPROVAL, since=NOW - 700), paused=True,
                                annotations={labels.DISRUPTION_REQUIRED: ""}, timeouts=Timeouts(approval=600)),
     Act.FINISH, Outcome.FAILED),
    ("approval: no timeout by default", obs(journal=journal(Phase.APPROVAL, since=NOW - 99999), paused=True,
                                            annotations={labels.DISRUPTION_REQUIRED: ""}), Act.WAIT, None),
    ("cordon mode skips approval", obs(journal=journal(Phase.APPROVAL), paused=True, drain=DrainMode.CORDON),
     Act.START_DRAIN, Phase.DRAINING),
    ("labels tampered: pause again", obs(journal=journal(Phase.DRAINING), paused=False), Act.PAUSE, Phase.DRAINING),
    ("draining: wait", obs(journal=journal(Phase.DRAINING), paused=True, annotations={labels.DRAINING: "x"}),
     Act.WAIT, None),
    ("draining: drained", obs(journal=journal(Phase.DRAINING), paused=True, annotations={labels.DRAINED: "x"}),
     Act.ADVANCE, Phase.CLIENTS),
    ("draining: timeout", obs(journal=journal(Phase.DRAINING, since=NOW - 2000), paused=True),
     Act.FINISH, Outcome.FAILED),
    ("draining: the wall clock stepped ahead, the monotonic one says 10 s: wait",
     obs(journal=journal(Phase.DRAINING), now=NOW + 7200, paused=True), Act.WAIT, None),
    ("draining: the wall clock stepped back, the monotonic one says 2000 s: timeout",
     obs(journal=journal(Phase.DRAINING, since=NOW - 2000), now=NOW - 3600, paused=True),
     Act.FINISH, Outcome.FAILED),
    ("draining: a journal of another boot is not timed by its reading",
     obs(journal=journal(Phase.DRAINING, since=NOW - 2000), boot_id="b2", paused=True), Act.WAIT, None),
    ("cordon: workloads left", obs(journal=journal(Phase.DRAINING), paused=True, drain=DrainMode.CORDON,
                                   workloads=("ml/train",)), Act.WAIT, None),
    ("cordon: workloads gone", obs(journal=journal(Phase.DRAINING), paused=True, drain=DrainMode.CORDON),
     Act.ADVANCE, Phase.CLIENTS),
    ("clients left: stop them", obs(journal=journal(Phase.CLIENTS), paused=True, clients=("ns/dp",)),
     Act.STOP_CLIENTS, None),
    ("clients stopped, still going: wait", obs(journal=journal(Phase.CLIENTS, clients_stopped=True), paused=True,
                                                clients=("ns/dp",)), Act.WAIT, None),
    ("processes hold GPU: wait", obs(journal=journal(Phase.CLIENTS), paused=True, busy_gpus=("GPU 0 (pid 7)",)),
     Act.WAIT, None),
    ("processes hold GPU too long: fail", obs(journal=journal(Phase.CLIENTS, since=NOW - 301), paused=True,
                                              busy_gpus=("GPU 0 (pid 7)",)), Act.FINISH, Outcome.FAILED),
    ("clients gone, layout", obs(journal=journal(Phase.CLIENTS), paused=True), Act.ADVANCE, Phase.LAYOUT),
    ("clients gone, mode", obs(journal=journal(Phase.CLIENTS), paused=True, target=TargetKind.MODE),
     Act.ADVANCE, Phase.MODE),
    ("label removed: abort", obs(journal=journal(Phase.DRAINING), desired=None, paused=True),
     Act.FINISH, Outcome.ABORTED),
    ("label changed: retarget", obs(journal=journal(Phase.APPROVAL), desired="all-balanced", paused=True),
     Act.RETARGET, None),
    ("stopping while waiting: abort", obs(journal=journal(Phase.APPROVAL), paused=True, stopping=True),
     Act.FINISH, Outcome.ABORTED),
    ("applied meanwhile: success", obs(journal=journal(Phase.CLIENTS), paused=True, target=TargetKind.APPLIED),
     Act.FINISH, Outcome.SUCCESS),
    ("config became invalid: fail", obs(journal=journal(Phase.APPROVAL), paused=True, target=TargetKind.INVALID,
                                        target_reason="gone"), Act.FINISH, Outcome.FAILED),
    # --- destructive: resume or roll back -----------------------------------------------------------
    ("mode: apply", obs(journal=journal(Phase.MODE), target=TargetKind.MODE), Act.APPLY_MODE, None),
    ("mode done (crash after): advance", obs(journal=journal(Phase.MODE, attempts=1)), Act.ADVANCE, Phase.LAYOUT),
    ("mode: resume after one crash", obs(journal=journal(Phase.MODE, attempts=1), target=TargetKind.MODE),
     Act.APPLY_MODE, None),
    ("mode: crash loop rolls back", obs(journal=journal(Phase.MODE, attempts=2), target=TargetKind.MODE),
     Act.ROLLBACK, None),
    ("stopping does not interrupt a GPU change", obs(journal=journal(Phase.LAYOUT), stopping=True),
     Act.APPLY_LAYOUT, None),
    ("label removed mid-change: finish it", obs(journal=journal(Phase.LAYOUT), desired=None), Act.APPLY_LAYOUT, None),
    ("layout: apply", obs(journal=journal(Phase.LAYOUT)), Act.APPLY_LAYOUT, None),
    ("layout done (crash after): verify", obs(journal=journal(Phase.LAYOUT, attempts=1), target=TargetKind.APPLIED),
     Act.ADVANCE, Phase.VERIFY),
    ("layout: crash loop rolls back", obs(journal=journal(Phase.LAYOUT, attempts=2)), Act.ROLLBACK, None),
    ("layout: NVML unreadable rolls back", obs(journal=journal(Phase.LAYOUT), target=TargetKind.INVALID,
                                               target_reason="NVML: lost"), Act.ROLLBACK, None),
    ("verify ok", obs(journal=journal(Phase.VERIFY), target=TargetKind.APPLIED), Act.FINISH, Outcome.SUCCESS),
    ("verify mismatch", obs(journal=journal(Phase.VERIFY)), Act.ROLLBACK, None),
    ("rebooting, same boot", obs(journal=journal(Phase.REBOOTING), target=TargetKind.MODE), Act.REBOOT, None),
    ("rebooted, mode took effect", obs(journal=journal(Phase.REBOOTING), boot_id="b2"), Act.ADVANCE, Phase.LAYOUT),
    ("rebooted, mode did not take effect", obs(journal=journal(Phase.REBOOTING), boot_id="b2", target=TargetKind.MODE),
     Act.ROLLBACK, None),
    ("rollback", obs(journal=journal(Phase.ROLLBACK, reason="x")), Act.ROLLBACK, None),
    ("rollback crash loop: give up and restore", obs(journal=journal(Phase.ROLLBACK, attempts=2, reason="x")),
     Act.FINISH, Outcome.FAILED),
    ("restore", obs(journal=journal(Phase.RESTORE, outcome=Outcome.SUCCESS)), Act.RESTORE, Outcome.SUCCESS),
    ("restore even when stopping", obs(journal=journal(Phase.RESTORE, outcome=Outcome.FAILED), stopping=True),
     Act.RESTORE, Outcome.FAILED),
]


@pytest.mark.parametrize(("o", "act", "then"), [(o, a, t) for _, o, a, t in TABLE], ids=[t[0] for t in TABLE])
def test_decide(o: Observation, act: Act, then: Phase | Outcome | None) -> None:
    action = decide(o)
    assert action.act is act, action
    if isinstance(then, Phase):
        assert action.phase is then
    elif isinstance(then, Outcome):
        assert action.outcome is then
    assert action.reason or act in (Act.IDLE, Act.EXIT, Act.BEGIN), "every non-trivial action says why"


def test_reasons_name_the_problem() -> None:
    assert "nvidia.com/mig.capable=false" in decide(obs(mig_capable="false")).reason
    held = decide(obs(journal=journal(Phase.CLIENTS, since=NOW - 400, clients_stopped=True), paused=True,
                      clients=("gpu/dcgm",),
                      busy_gpus=("GPU 3 (pid 42)",))).reason
    assert "pod gpu/dcgm" in held and "GPU 3 (pid 42)" in held
    assert "did not take effect after rebooting" in decide(
        obs(journal=journal(Phase.REBOOTING), boot_id="b2", target=TargetKind.MODE)).reason
