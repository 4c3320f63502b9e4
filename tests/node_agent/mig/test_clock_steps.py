"""The MIG manager's waits against wall-clock steps (an NTP step, a ``date -s``, a VM resumed with a stale
clock): the drain and the GPU clients are timed on the monotonic clock, so a step of the wall clock neither
fails a node early nor holds a failure back, in one manager process, in a restarted one, and after a reboot
(where the journal's monotonic anchor belongs to another boot and the wait starts again)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from node_agent.mig.executor import MigManager
from node_agent.mig.journal import Journal, Phase
from node_agent.mig.machine import Act, Timeouts
from nvgpu import labels
from tests.node_agent.mig.fakes import FakeBackend, FakeNode
from tests.node_agent.mig.harness import Rig, clients_leave, deckhouse_approver, mig_node

DRAIN_S = 1800.0


def approve_only(node: FakeNode) -> None:
    """Deckhouse approves the disruption, and its drain never finishes (a budget holds a pod)."""
    if labels.DISRUPTION_REQUIRED in node.annotations and labels.DISRUPTION_APPROVED not in node.annotations:
        node.annotations[labels.DISRUPTION_APPROVED] = ""


def rounds(rig: Rig, m: MigManager, n: int) -> Act:
    """``n`` rounds of the manager's loop with no time passing, the fake cluster reacting in between."""
    act = Act.IDLE
    for _ in range(n):
        act = m.run_until_blocked().act
        m._node = None
        rig.node.wait_for_change("", 0)
    return act


def draining(timeouts: Timeouts | None = None) -> tuple[Rig, MigManager]:
    """A node whose drain has begun and waits (Deckhouse mode, approved, never drained)."""
    rig = mig_node(Rig(FakeBackend.of("H100-80GB", count=2, reset_needs=False),
                       timeouts=timeouts or Timeouts(drain=DRAIN_S)), "all-1g.10gb")
    rig.node.on_wait = [approve_only]
    m = rig.manager()
    assert rounds(rig, m, 3) is Act.WAIT
    j = rig.journal.load()
    assert j is not None and j.phase is Phase.DRAINING
    return rig, m


def still_draining(rig: Rig) -> None:
    j = rig.journal.load()
    assert j is not None and j.phase is Phase.DRAINING, j
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "pending"
    assert not [e for e in rig.node.events if e[0] == "MigReconfigureFailed"], rig.node.events


def failed_for_the_drain(rig: Rig) -> None:
    assert rig.journal.load() is None
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "failed"
    reason, message, warning = rig.node.events[-1]
    assert reason == "MigReconfigureFailed" and warning and "not drained within 1800s" in message, message


def test_a_wall_clock_step_forward_mid_drain_does_not_fail_the_node() -> None:
    rig, m = draining()
    rig.clock.t += 60
    rig.clock.step(DRAIN_S + 1)  # the wall clock says the drain has waited past its timeout; it has not
    assert rounds(rig, m, 3) is Act.WAIT
    still_draining(rig)
    # Deckhouse finishes the drain: the reconfiguration goes through.
    rig.node.on_wait = [deckhouse_approver, clients_leave]
    rig.converge(manager=m)
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "success"


def test_a_wall_clock_step_back_neither_fails_the_node_nor_delays_a_real_timeout() -> None:
    rig, m = draining()
    rig.clock.step(-3600)
    assert rounds(rig, m, 2) is Act.WAIT
    still_draining(rig)
    rig.clock.t += DRAIN_S - 10
    rounds(rig, m, 1)
    still_draining(rig)
    rig.clock.t += 11  # the drain has now waited its 1800 s, whatever the wall clock says
    rounds(rig, m, 2)
    failed_for_the_drain(rig)


def test_a_real_drain_timeout_still_fails_the_node() -> None:
    rig, m = draining()
    rig.clock.t += DRAIN_S + 1
    rounds(rig, m, 2)
    failed_for_the_drain(rig)


def test_a_restarted_manager_keeps_timing_the_drain_across_a_wall_clock_step() -> None:
    """A new manager process on the same boot reads the journal's monotonic anchor, not the wall clock."""
    rig, _ = draining()
    rig.clock.t += 1000
    rig.clock.step(DRAIN_S)
    restarted = rig.manager()
    assert rounds(rig, restarted, 2) is Act.WAIT
    still_draining(rig)
    rig.clock.t += DRAIN_S - 1000 + 1  # 1801 s of real waiting in all: the timeout holds across the restart
    rounds(rig, rig.manager(), 2)
    failed_for_the_drain(rig)


def test_after_a_reboot_mid_drain_the_wait_starts_again_whatever_the_wall_clock_says() -> None:
    """The journal's monotonic reading belongs to the boot that wrote it: after a reboot the manager cannot
    tell a long outage from a wall-clock step, so it restarts the wait rather than fail the node."""
    rig, _ = draining()
    rig.clock.t += 600
    rig.boot[0] = "boot-2"
    rig.clock.step(DRAIN_S + 1)
    m = rig.manager()
    assert rounds(rig, m, 2) is Act.WAIT
    still_draining(rig)
    j = rig.journal.load()
    assert j is not None and j.phase_boot_id == "boot-2", "the wait is anchored to the new boot"
    rig.clock.t += DRAIN_S + 1
    rounds(rig, rig.manager(), 2)
    failed_for_the_drain(rig)


def test_a_journal_without_a_monotonic_anchor_starts_its_wait_again() -> None:
    """A journal written before the manager anchored its waits (an agent upgraded mid-drain), its wall-clock
    start far behind: the wait starts again from now instead of failing at once."""
    rig, _ = draining()
    j = rig.journal.load()
    assert j is not None
    legacy = Journal.model_validate({k: v for k, v in j.model_dump(mode="json").items()
                                     if k not in ("phase_mono", "phase_boot_id")})
    rig.journal.save(legacy.model_copy(update={"phase_since": rig.clock() - 5 * DRAIN_S}))
    m = rig.manager()
    assert rounds(rig, m, 2) is Act.WAIT
    still_draining(rig)
    rig.clock.t += DRAIN_S + 1
    rounds(rig, m, 2)
    failed_for_the_drain(rig)


def test_the_gpu_clients_wait_ignores_a_wall_clock_step() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-80GB", count=2), timeouts=Timeouts(clients=300)), "all-2g.20gb")
    rig.backend.gpu(1).processes = [4242]
    m = rig.manager()
    rounds(rig, m, 4)
    j = rig.journal.load()
    assert j is not None and j.phase is Phase.CLIENTS
    rig.clock.step(301)
    assert rounds(rig, m, 2) is Act.WAIT
    assert rig.journal.load() is not None and rig.node.labels[labels.MIG_CONFIG_STATE] == "pending"
    rig.clock.t += 301
    rounds(rig, m, 2)
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "failed"
    assert "GPUs still in use after 300s" in rig.node.events[-1][1]


def test_the_phase_duration_metric_ignores_a_wall_clock_step() -> None:
    registry = CollectorRegistry()
    rig = mig_node(Rig(FakeBackend.of("H100-80GB", count=2, reset_needs=False)), "all-1g.10gb")
    rig.node.on_wait = [approve_only]
    m = rig.manager(registry)
    rounds(rig, m, 3)
    rig.clock.t += 120
    rig.clock.step(-3600)
    assert registry.get_sample_value("nvidia_gpu_mig_manager_phase_duration_seconds") == 120
