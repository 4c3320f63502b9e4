"""The MIG manager end to end over fakes: node flow, approval, drain modes, failures, crashes, preStop."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import NoReturn

import pytest
from prometheus_client import CollectorRegistry

from node_agent.host import statefile
from node_agent.host.atomic import content_checksum
from node_agent.kube.errors import Unreachable
from node_agent.mig.executor import DEPLOY_LABELS, RECONFIGURE_TAINT, STOP_MARKER, NotSettling
from node_agent.mig.hardware import InstanceInfo
from node_agent.mig.journal import JOURNAL_VERSION, Journal, Outcome, Phase
from node_agent.mig.kube import NodePatch, NodeView
from node_agent.mig.machine import DrainMode, Timeouts
from nvgpu import labels
from nvgpu.migparted import MigConfigSpec, build_config
from tests.node_agent.mig.fakes import Crash, FakeBackend, FakeNode, pod
from tests.node_agent.mig.harness import Rig, clients_leave, deckhouse_approver, mig_node

MACHINES = [("A100-40GB", "all-1g.5gb", {"1g.5gb": 7}), ("A100-80GB", "all-1g.10gb", {"1g.10gb": 7}),
            ("H100-80GB", "all-balanced", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
            ("H200-141GB", "all-3g.71gb", {"3g.71gb": 2}), ("A30-24GB", "all-2g.12gb", {"2g.12gb": 2})]


def assert_returned_to_service(node: FakeNode, state: str) -> None:
    """Nothing the manager set is left behind: the known failure of NVIDIA's manager."""
    assert node.labels.get(labels.MIG_CONFIG_STATE) == state
    for key in DEPLOY_LABELS:
        assert node.labels.get(key) != labels.PAUSED_FOR_MIG_CHANGE
    assert RECONFIGURE_TAINT.key not in {t.key for t in node.taints}
    for key in (labels.DISRUPTION_REQUIRED, labels.DISRUPTION_APPROVED, labels.DRAINING, labels.DRAINED):
        assert key not in node.annotations
    assert not node.unschedulable


@pytest.mark.parametrize(("model", "config", "layout"), MACHINES, ids=[m[0] for m in MACHINES])
def test_reconfigures_each_machine(model: str, config: str, layout: dict[str, int]) -> None:
    rig = mig_node(Rig(FakeBackend.of(model, count=4)), config)
    rig.node.labels[labels.GPU_DEPLOY_PREFIX + "dcgm"] = "false"
    rig.node.labels[labels.GPU_DEPLOY_PREFIX + "device-plugin"] = "true"
    rig.node.pods = [pod("dp", client="device-plugin", daemonset=True, namespace="nvidia-gpu"),
                     pod("plugin", app="device-plugin", daemonset=True, namespace="nvidia-gpu"),
                     pod("web", daemonset=True, namespace="web"),
                     pod("train", gpu=True, namespace="ml")]
    acts = rig.converge()
    assert rig.node.deleted == ["nvidia-gpu/plugin"]  # our own agent, kept away by the taint
    assert [p.name for p in rig.node.pods] == ["web"]
    assert acts[:3] == ["begin", "pause", "request-approval"]
    assert all(rig.backend.layout(i) == layout for i in range(4))
    assert_returned_to_service(rig.node, "success")
    assert rig.node.labels[labels.GPU_DEPLOY_PREFIX + "dcgm"] == "false"  # left alone, as NVIDIA does
    assert rig.node.labels[labels.GPU_DEPLOY_PREFIX + "device-plugin"] == "true"
    assert rig.node.events == [("MigReconfigured", f"MIG config {config!r} applied", False)]
    assert rig.journal.load() is None
    # A second manager finds nothing to do.
    assert rig.converge() == ["idle"]


def test_waits_for_approval_with_clients_paused_and_taint_set() -> None:
    rig = mig_node(Rig(FakeBackend.of("H100-80GB", count=2, reset_needs=False)), "all-1g.10gb")
    rig.node.on_wait = []
    m = rig.manager()
    assert m.run_until_blocked().reason.startswith("waiting for update.node.deckhouse.io/disruption-approved")
    assert m.run_until_blocked().act.value == "wait"  # still waiting, nothing else happens
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "pending"
    assert all(rig.node.labels[k] == labels.PAUSED_FOR_MIG_CHANGE for k in DEPLOY_LABELS)
    assert RECONFIGURE_TAINT in rig.node.taints
    assert rig.backend.calls == {}  # no GPU touched before approval
    rig.node.on_wait = [deckhouse_approver, clients_leave]
    rig.converge()
    assert_returned_to_service(rig.node, "success")


def test_cordon_mode_evicts_gpu_workloads_and_uncordons() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=2), drain=DrainMode.CORDON), "all-3g.20gb")
    rig.node.on_wait = [clients_leave]
    rig.node.pods = [pod("train", gpu=True, namespace="ml"), pod("web", namespace="web"),
                     pod("exporter", daemonset=True, namespace="mon")]
    rig.converge()
    assert rig.node.evicted == ["ml/train"]
    assert_returned_to_service(rig.node, "success")
    assert labels.DISRUPTION_REQUIRED not in rig.node.annotations


def test_cordon_mode_keeps_an_operator_cordon() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1), drain=DrainMode.CORDON), "all-7g.40gb")
    rig.node.unschedulable = True
    rig.converge()
    assert rig.node.unschedulable


def test_gpu_held_by_process_fails_and_returns_node() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-80GB", count=2), timeouts=Timeouts(clients=30)), "all-2g.20gb")
    rig.backend.gpu(1).processes = [4242]
    rig.converge(rounds=60)
    assert_returned_to_service(rig.node, "failed")
    reason, message, warning = rig.node.events[-1]
    assert reason == "MigReconfigureFailed" and warning
    assert "GPU 1 (pid 4242)" in message
    assert rig.backend.calls == {}  # nothing half-applied


def test_nvml_error_mid_apply_rolls_back_to_previous_layout() -> None:
    backend = FakeBackend.of("A100-40GB", count=2)
    for g in backend.gpus_:  # the node starts on all-balanced
        g.current = g.pending = True
        g.instances = [InstanceInfo(1, 9, 4, 4), InstanceInfo(2, 14, 2, 2), InstanceInfo(3, 19, 0, 1),
                       InstanceInfo(4, 19, 1, 1)]
    backend.fail_on = {"create_instance": 10}
    rig = mig_node(Rig(backend), "all-1g.5gb")
    rig.converge()
    assert_returned_to_service(rig.node, "failed")
    balanced = {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}
    assert [backend.layout(i) for i in range(2)] == [balanced, balanced]
    reason, message, _ = rig.node.events[-1]
    assert reason == "MigReconfigureFailed"
    assert "Insufficient Resources" in message and "previous layout restored" in message
    assert "Insufficient Resources" in rig.node.annotations[labels.MIG_FAILURE_REASON]
    # The operator fixes the cause and asks for a retry: success clears the reason.
    backend.fail_on = {}
    del rig.node.labels[labels.MIG_CONFIG_STATE]
    rig.converge()
    assert labels.MIG_FAILURE_REASON not in rig.node.annotations
    assert [backend.layout(i) for i in range(2)] == [{"1g.5gb": 7}] * 2


def test_reset_impossible_without_reboot_fails_and_restores_mode() -> None:
    backend = FakeBackend.of("A100-40GB", count=2, reset_blocked=True)
    rig = mig_node(Rig(backend), "all-1g.5gb")
    rig.converge()
    assert_returned_to_service(rig.node, "failed")
    assert "rebooting is not allowed" in rig.node.events[-1][1]
    assert all(backend.mig_mode(i) == (False, False) for i in range(2))  # pending change reverted


def test_reboot_when_needed_then_resumes_after_boot() -> None:
    backend = FakeBackend.of("A100-40GB", count=2, reset_blocked=True)
    rig = mig_node(Rig(backend, allow_reboot=True), "all-2g.10gb")
    rig.run_until_reboot()
    assert rig.rebooter.count == 1
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "rebooting"
    assert RECONFIGURE_TAINT in rig.node.taints  # stays tainted across the reboot
    # The machine reboots: the pending mode takes effect, a new boot ID, a new manager process.
    for g in backend.gpus_:
        g.current = g.pending
    backend.reset_blocked = False
    rig.boot[0] = "boot-2"
    rig.converge()
    assert [backend.layout(i) for i in range(2)] == [{"2g.10gb": 3}] * 2
    assert_returned_to_service(rig.node, "success")
    assert rig.rebooter.count == 1


def test_bad_inputs_fail_with_event_and_touch_nothing() -> None:
    cases = {
        "all-9g.99gb": "unknown MIG config 'all-9g.99gb'",
        "all-1g.5gb": "selects none of this node's GPUs",  # an A100-40GB layout on an H100
    }
    for config, why in cases.items():
        rig = mig_node(Rig(FakeBackend.of("H100-80GB", count=2)), config)
        assert rig.converge() == ["reject", "idle"]
        assert rig.node.labels[labels.MIG_CONFIG_STATE] == "failed"
        assert why in rig.node.events[0][1] and rig.node.events[0][0] == "MigConfigRejected"
        assert why in rig.node.annotations[labels.MIG_FAILURE_REASON]
        assert rig.node.taints == [] and rig.backend.calls == {} and rig.journal.load() is None
        assert rig.converge() == ["idle"]  # a restarted manager does not report it again
    # A rejection disrupted nothing: once the operator ships the missing layout, the node converges by itself.
    rig = mig_node(Rig(FakeBackend.of("H100-80GB", count=2)), "big-one")
    assert rig.converge() == ["reject", "idle"]
    rig.config = build_config(None, {"big-one": [MigConfigSpec(devices="all", mig_enabled=True,
                                                               mig_devices={"7g.80gb": 1})]})
    rig.converge()
    assert_returned_to_service(rig.node, "success")
    assert labels.MIG_FAILURE_REASON not in rig.node.annotations


def test_not_mig_capable_node_is_refused() -> None:
    rig = mig_node(Rig(FakeBackend.of("L4", count=2)), "all-balanced", **{labels.MIG_CAPABLE: "false"})
    assert rig.converge() == ["reject", "idle"]
    assert "nvidia.com/mig.capable=false" in rig.node.events[0][1]


def test_custom_layout_that_does_not_fit_this_gpu_is_refused() -> None:
    cfg = build_config(None, {"custom-x": [MigConfigSpec(devices=[1], mig_enabled=True,
                                                         mig_devices={"3g.40gb": 2, "1g.10gb": 1})]})
    rig = mig_node(Rig(FakeBackend.of("H100-80GB", count=2), config=cfg), "custom-x")
    rig.converge()
    assert "GPU 1 (NVIDIA H100 80GB HBM3, PCI 0x2330)" in rig.node.events[0][1]
    assert "needs 9 memory slices" in rig.node.events[0][1]


def test_rollback_to_all_disabled_then_labels_cleared() -> None:
    backend = FakeBackend.of("H100-80GB", count=2, reset_needs=False)
    rig = mig_node(Rig(backend), "all-7g.80gb")
    rig.converge()
    assert all(backend.mig_mode(i) == (True, True) for i in range(2))
    # The node group leaves MIG: the components relabel the node.
    rig.node.labels.update({labels.MIG_CONFIG: "all-disabled", labels.DEVICE_GPU_CONFIG: "Exclusive"})
    acts = rig.converge()
    assert acts[-2:] == ["clear-labels", "idle"]
    assert all(backend.mig_mode(i) == (False, False) for i in range(2))
    assert labels.MIG_CONFIG not in rig.node.labels and labels.MIG_CONFIG_STATE not in rig.node.labels
    assert_returned_to_service(rig.node, None)  # type: ignore[arg-type]
    # A Deckhouse node template still carrying all-disabled puts the label back: no tug of war.
    rig.node.labels[labels.MIG_CONFIG] = "all-disabled"
    calls = rig.node.calls
    assert rig.converge() == ["idle"]
    assert rig.node.calls == calls + 1  # one read, no patch
    # MIG again later: the marker goes, the cycle works again.
    rig.node.labels.update({labels.MIG_CONFIG: "all-1g.10gb", labels.DEVICE_GPU_CONFIG: "MIG"})
    rig.converge()
    assert backend.layout(0) == {"1g.10gb": 7}


def test_leftover_paused_labels_from_a_wedged_manager_are_cleared() -> None:
    rig = mig_node(Rig(FakeBackend.of("A30-24GB", count=1)), "all-4g.24gb", **{labels.MIG_CONFIG_STATE: "pending"})
    for key in DEPLOY_LABELS:
        rig.node.labels[key] = labels.PAUSED_FOR_MIG_CHANGE
    rig.node.on_wait = []
    rig.manager().run_until_blocked()
    del rig.node.labels[labels.MIG_CONFIG]  # abort: nothing stale is put back
    rig.converge()
    assert not any(k in rig.node.labels for k in DEPLOY_LABELS)
    assert labels.MIG_CONFIG_STATE not in rig.node.labels


def test_label_removed_while_waiting_aborts_and_restores() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-1g.5gb", **{labels.MIG_CONFIG_STATE: "success"})
    rig.node.on_wait = []
    m = rig.manager()
    m.run_until_blocked()
    del rig.node.labels[labels.MIG_CONFIG]
    rig.node.on_wait = []
    assert rig.converge()[-1] == "idle"
    assert_returned_to_service(rig.node, "success")  # the state it had before
    assert rig.node.events[-1][0] == "MigReconfigureAborted"


def test_label_changed_while_waiting_follows_the_new_layout() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-1g.5gb")
    rig.node.on_wait = []
    rig.manager().run_until_blocked()
    rig.node.labels[labels.MIG_CONFIG] = "all-2g.10gb"
    rig.node.on_wait = [deckhouse_approver]
    rig.converge()
    assert rig.backend.layout(0) == {"2g.10gb": 3}
    assert rig.node.events == [("MigReconfigured", "MIG config 'all-2g.10gb' applied", False)]


def test_pre_stop_while_waiting_aborts_and_the_manager_exits() -> None:
    rig = mig_node(Rig(FakeBackend.of("H200-141GB", count=2)), "all-1g.18gb")
    rig.node.on_wait = []
    main = rig.manager()
    main.run_until_blocked()
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "pending"
    outcome = rig.manager().pre_stop(timeout_s=5, poll_s=0)
    assert outcome is Outcome.ABORTED
    assert_returned_to_service(rig.node, None)  # type: ignore[arg-type]
    assert rig.files.read_bytes_or_none(STOP_MARKER) is not None
    main._node = None
    assert main.run_until_blocked().act.value == "exit"


def test_pre_stop_waits_for_a_gpu_change_in_flight_then_finishes_it() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-80GB", count=2)), "all-4g.40gb")
    rig.backend.crash_on = {"create_instance": 1}  # the manager dies in the middle of the layout
    with pytest.raises(Crash):
        rig.converge()
    rig.backend.crash_on = {}
    journal = rig.journal.load()
    assert journal is not None and journal.phase is Phase.LAYOUT
    outcome = rig.manager().pre_stop(timeout_s=0, poll_s=0)
    assert outcome is Outcome.SUCCESS
    assert [rig.backend.layout(i) for i in range(2)] == [{"4g.40gb": 1}] * 2
    assert_returned_to_service(rig.node, "success")


def test_unreadable_journal_returns_the_node_and_reports() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-7g.40gb")
    rig.node.on_wait = []
    rig.manager().run_until_blocked()
    rig.files.data[rig.journal.path] = b"{not json"
    m = rig.manager()
    m.run_until_blocked()
    assert [a.act.value for a in m.history] == ["restore", "idle"]  # node given back, no blind retry
    assert_returned_to_service(rig.node, "failed")
    assert any(e[0] == "MigReconfigureFailed" and "not JSON" in e[1] for e in rig.node.events)
    del rig.node.labels[labels.MIG_CONFIG_STATE]  # the operator asks for a retry
    rig.node.on_wait = [deckhouse_approver]
    rig.converge()
    assert_returned_to_service(rig.node, "success")


def test_edited_journal_fails_its_checksum() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-7g.40gb")
    rig.node.on_wait = []
    rig.manager().run_until_blocked()
    path = rig.journal.path
    rig.files.data[path] = rig.files.data[path].replace(b'"approval"', b'"layout"')
    rig.converge()
    assert "checksum mismatch (edited or damaged)" in rig.node.events[-1][1]
    assert_returned_to_service(rig.node, "failed")
    assert rig.backend.calls == {}  # the edited phase was not acted on


def test_the_journal_is_in_the_common_state_file_format() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-7g.40gb")
    rig.node.on_wait = []
    rig.manager().run_until_blocked()
    doc = json.loads(rig.files.data[rig.journal.path])
    assert sorted(doc) == ["checksum", "data", "version"] and doc["version"] == JOURNAL_VERSION
    assert doc["checksum"] == content_checksum(doc["data"]) and doc["data"]["phase"] == "approval"


def test_a_journal_written_before_the_common_format_is_still_resumed() -> None:
    """An agent upgraded in the middle of a reconfiguration finds the old flat journal and uses it."""
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-7g.40gb")
    rig.node.on_wait = []
    rig.manager().run_until_blocked()
    path = rig.journal.path
    data = json.loads(rig.files.data[path])["data"]
    flat = {**data, "version": 1}
    rig.files.data[path] = json.dumps({"checksum": content_checksum(flat), **flat}).encode()
    assert rig.journal.load() == Journal.model_validate(data)
    rig.node.on_wait = [deckhouse_approver, clients_leave]
    rig.converge()
    assert_returned_to_service(rig.node, "success")


def test_journal_from_a_newer_agent_is_not_guessed_at() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-7g.40gb")
    rig.node.on_wait = []
    rig.manager().run_until_blocked()
    rig.files.data[rig.journal.path] = b'{"version": 9, "config": "x", "phase": "teleport"}'
    rig.converge()
    assert "format version 9 was written by a newer agent; this agent reads up to 1" in rig.node.events[-1][1]
    assert_returned_to_service(rig.node, "failed")
    rig.files.data[rig.journal.path] = statefile.encode({"config": "x", "phase": "teleport"}, 2)
    rig.converge()
    assert "format version 2 was written by a newer agent" in rig.node.events[-1][1]


def test_a_controller_undoing_the_taint_does_not_spin_forever() -> None:
    class Stubborn(FakeNode):
        def patch_node(self, patch: NodePatch) -> NodeView:
            view = super().patch_node(patch)
            self.taints = []  # another controller strips every taint at once
            return replace(view, taints=())

    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-7g.40gb")
    rig.node = Stubborn(labels=dict(rig.node.labels))
    with pytest.raises(NotSettling, match="pause"):
        rig.manager().run_until_blocked()


def test_api_errors_are_retried_from_the_journal() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=1)), "all-7g.40gb")
    rig.node.fail_patches = 1
    m = rig.manager()
    m.stop.set()  # run() returns once the work is done and the manager is stopping
    m.settings = type(m.settings)(busy_wait_s=0, idle_wait_s=0)
    rig.files.data.clear()
    m.stop.clear()
    steps = 0

    def stop_when_done(node: FakeNode) -> None:
        nonlocal steps
        steps += 1
        deckhouse_approver(node)
        if node.labels.get(labels.MIG_CONFIG_STATE) == "success" or steps > 50:
            m.stop.set()

    rig.node.on_wait = [stop_when_done]
    m.run()
    assert rig.backend.layout(0) == {"7g.40gb": 1}
    assert_returned_to_service(rig.node, "success")


def test_stop_while_the_api_server_fails_exits_instead_of_spinning() -> None:
    """SIGTERM while every API call fails: with no GPU change in flight the manager exits at once (the
    journal resumes the work in the next pod); before, a set stop event made every error pause return
    at once and the loop spun at full CPU, logging a warning per turn, and never exited."""
    rig = Rig(FakeBackend.of("H100-80GB"))
    calls = 0

    def failing() -> NoReturn:
        nonlocal calls
        calls += 1
        raise Unreachable("read node gpu-node-0: connection refused")

    rig.node.read_node = failing  # type: ignore[method-assign]
    m = rig.manager()
    m.settings = replace(m.settings, busy_wait_s=0.2)
    m.stop.set()
    done = threading.Thread(target=m.run, daemon=True)
    done.start()
    done.join(2)
    assert not done.is_alive(), "the manager did not exit after stop"
    assert calls <= 2


def test_request_stop_breaks_off_the_watch() -> None:
    """The SIGTERM path sets the stop flag and cancels the Node watch, so an idle manager leaves at once."""
    rig = Rig(FakeBackend.of("A100-40GB", count=1))
    m = rig.manager()
    m.request_stop()
    assert m.stop.is_set() and rig.node.waits_cancelled
    m.run()  # idle and stopping: returns without waiting


def test_metrics_follow_the_journal_and_count_outcomes() -> None:
    """The phase in flight and its age come from the journal at scrape time; a finished reconfiguration is
    counted by outcome with its duration; a failed one too."""
    registry = CollectorRegistry()
    rig = mig_node(Rig(FakeBackend.of("H100-80GB", count=2, reset_needs=False), timeouts=Timeouts(clients=30)),
                   "all-1g.10gb")
    rig.node.on_wait = []
    m = rig.manager(registry)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"nvidia_gpu_mig_manager_{name}", labels)

    assert sample("phase", phase="approval") == 0 and sample("phase_duration_seconds") == 0
    m.run_until_blocked()  # waiting for Deckhouse's approval
    assert sample("phase", phase="approval") == 1 and sample("phase", phase="layout") == 0
    rig.clock.t += 600
    assert sample("phase_duration_seconds") == 600
    assert sample("actions_total", action="request-approval") == 1
    rig.node.on_wait = [deckhouse_approver, clients_leave]
    rig.converge(manager=m)
    assert_returned_to_service(rig.node, "success")
    assert sample("reconfigurations_total", outcome="success") == 1
    assert sample("reconfigurations_total", outcome="failed") == 0
    duration = sample("last_reconfiguration_duration_seconds", outcome="success")
    assert duration is not None and duration >= 600
    assert all(sample("phase", phase=p.value) == 0 for p in Phase) and sample("phase_duration_seconds") == 0

    rig.backend.gpu(1).processes = [4242]
    rig.node.labels[labels.MIG_CONFIG] = "all-2g.20gb"
    m._node = None  # the label change, as the manager's Node watch delivers it
    rig.converge(rounds=60, manager=m)
    assert_returned_to_service(rig.node, "failed")
    assert sample("reconfigurations_total", outcome="failed") == 1


def test_an_idle_manager_resumes_its_watch_without_reading_the_node() -> None:
    """At rest the manager costs one watch request per ``idle_resume_s``: a watch that ends with the Node
    unchanged is resumed from the version it ended at, with no read of the Node in between (a read and a
    20 s watch cost six requests a minute on every MIG node); the first watch after a read stays short."""
    rig = Rig(FakeBackend.of("A100-40GB", count=1))  # no MIG config asked for: nothing to do
    m = rig.manager()
    assert m.run_until_blocked().act.value == "idle"
    waits: list[tuple[str, float]] = []
    reads_at_wait: list[int] = []
    reads = 0
    node = rig.node
    real_read = node.read_node

    def read() -> NodeView:
        nonlocal reads
        reads += 1
        return real_read()

    def wait(resource_version: str, timeout_s: float) -> str | None:
        waits.append((resource_version, timeout_s))
        reads_at_wait.append(reads)
        if len(waits) == 4:
            m.stop.set()
        return str(100 + len(waits))  # each watch ran its course; bookmarks moved the version on

    node.read_node = read  # type: ignore[method-assign]
    node.wait_for_change = wait  # type: ignore[method-assign]
    m.run()
    assert len(set(reads_at_wait)) == 1  # no read of the Node between the watches
    assert [t for _, t in waits] == [m.settings.idle_wait_s] + [m.settings.idle_resume_s] * 3
    assert [rv for rv, _ in waits][1:] == ["101", "102", "103"]
