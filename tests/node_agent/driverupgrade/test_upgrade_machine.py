"""The driver upgrade's decisions, node by node (``node_agent.driverupgrade.machine``): the states in order,
one node out of service at a time, drains by policy, the GPU agents stopped before the driver, timeouts that
stop the rollout, a node given back after an operator stopped its upgrade, Deckhouse's disruption settings."""

from __future__ import annotations

import calendar
import dataclasses

import pytest

from node_agent.driverupgrade.machine import (
    WAS_CORDONED_ANNOTATION,
    Act,
    Disruptions,
    DisruptionWindow,
    DrainMode,
    DriverPod,
    NodeFacts,
    PodRef,
    UpgradeState,
    decide,
    may_start,
)
from nvgpu import labels
from nvgpu.driver import UpgradePolicy

OLD = DriverPod(PodRef("gpu", "drv-old"), current=False, ready=True)
NEW = DriverPod(PodRef("gpu", "drv-new"), current=True, ready=True)
STARTING = DriverPod(PodRef("gpu", "drv-new"), current=True, ready=False)
POLICY = UpgradePolicy(max_unavailable=1, drain=True, drain_timeout_s=600, validation_timeout_s=300)
TRAIN = PodRef("ml", "train")
WEB = PodRef("web", "srv")


def node(state: UpgradeState | None, pod: DriverPod | None = OLD, *, waited: float = 10.0, **kw: object) -> NodeFacts:
    """A node ``waited`` seconds in its state (as the controller measures it: see test_upgrade_controller)."""
    return NodeFacts("n1", state, waited, False, driver_pod=pod, **kw)  # type: ignore[arg-type]


def step(n: NodeFacts, *, free: bool = True, policy: UpgradePolicy = POLICY, now: float = 10.0,
         mode: DrainMode = DrainMode.CORDON) -> tuple[Act, UpgradeState | None]:
    s = decide(n, may_start=free, policy=policy, drain_mode=mode, now=now)
    return s.act, s.state


def test_a_node_walks_the_states_in_order() -> None:
    assert step(node(None)) == (Act.SET_STATE, UpgradeState.REQUIRED)
    assert step(node(UpgradeState.REQUIRED)) == (Act.CORDON, UpgradeState.DRAIN)
    drained = node(UpgradeState.DRAIN, workloads=(TRAIN, WEB), gpu_workloads=(TRAIN,))
    s = decide(drained, may_start=True, policy=POLICY, drain_mode=DrainMode.CORDON, now=10)
    assert (s.act, s.pods) == (Act.EVICT, (TRAIN, WEB))
    assert step(node(UpgradeState.DRAIN)) == (Act.SET_STATE, UpgradeState.RESTART)
    agent = PodRef("gpu", "device-plugin-x")
    s = decide(node(UpgradeState.RESTART, clients=(agent,)), may_start=True, policy=POLICY,
               drain_mode=DrainMode.CORDON, now=10)
    assert (s.act, s.pods) == (Act.STOP_CLIENTS, (agent,)), "the agents go before the driver pod"
    assert step(node(UpgradeState.RESTART, clients_stopping=1)) == (Act.NOTHING, None)
    assert step(node(UpgradeState.RESTART)) == (Act.DELETE_DRIVER_POD, None)
    assert step(node(UpgradeState.RESTART, dataclasses.replace(OLD, terminating=True))) == (Act.NOTHING, None)
    assert step(node(UpgradeState.RESTART, None)) == (Act.SET_STATE, UpgradeState.VALIDATION)
    assert step(node(UpgradeState.VALIDATION, STARTING)) == (Act.NOTHING, None)
    assert step(node(UpgradeState.VALIDATION, NEW)) == (Act.SET_STATE, UpgradeState.UNCORDON)
    assert step(node(UpgradeState.UNCORDON, NEW)) == (Act.UNCORDON, UpgradeState.DONE)
    assert step(node(UpgradeState.DONE, NEW)) == (Act.NOTHING, None)


def test_without_drain_only_the_pods_holding_gpus_are_moved() -> None:
    policy = dataclasses.replace(POLICY, drain=False)
    s = decide(node(UpgradeState.DRAIN, workloads=(TRAIN, WEB), gpu_workloads=(TRAIN,)), may_start=True,
               policy=policy, drain_mode=DrainMode.CORDON, now=10)
    assert (s.act, s.pods) == (Act.EVICT, (TRAIN,))
    assert step(node(UpgradeState.DRAIN, workloads=(WEB,)), policy=policy) == (Act.SET_STATE, UpgradeState.RESTART)


def test_waits_that_outlast_their_timeout_fail_the_node() -> None:
    stuck = node(UpgradeState.DRAIN, waited=599, workloads=(TRAIN,), gpu_workloads=(TRAIN,))
    assert step(stuck) == (Act.EVICT, None)
    s = decide(dataclasses.replace(stuck, waited=601), may_start=True, policy=POLICY, drain_mode=DrainMode.CORDON,
               now=10)
    assert (s.act, s.state) == (Act.FAIL, UpgradeState.FAILED) and "ml/train" in s.reason
    assert step(node(UpgradeState.VALIDATION, STARTING, waited=301)) == (Act.FAIL, UpgradeState.FAILED)
    assert step(node(UpgradeState.FAILED)) == (Act.NOTHING, None)


def test_one_node_at_a_time_and_a_failed_node_stops_the_rollout() -> None:
    waiting = node(UpgradeState.REQUIRED)
    assert step(waiting, free=False) == (Act.NOTHING, None)
    group = [node(UpgradeState.DRAIN), node(UpgradeState.REQUIRED)]
    assert not may_start(group, POLICY)
    assert may_start(group, dataclasses.replace(POLICY, max_unavailable=2))
    assert not may_start([node(UpgradeState.FAILED), node(UpgradeState.REQUIRED)],
                         dataclasses.replace(POLICY, max_unavailable=5))
    assert may_start([node(UpgradeState.DONE), node(UpgradeState.REQUIRED)], POLICY)


def test_a_pod_replaced_meanwhile_needs_no_upgrade() -> None:
    assert step(node(UpgradeState.REQUIRED, NEW)) == (Act.SET_STATE, UpgradeState.DONE)
    assert step(node(None, NEW)) == (Act.NOTHING, None)


#: Tuesday 2026-12-01, 07:00 UTC.
TUESDAY_7 = float(calendar.timegm((2026, 12, 1, 7, 0, 0)))


@pytest.mark.parametrize("approved", [False, True])
def test_deckhouse_manual_approval_waits_for_a_person(approved: bool) -> None:
    manual = Disruptions("Manual")
    assert step(node(UpgradeState.REQUIRED, disruptions=manual), mode=DrainMode.DECKHOUSE) == (
        Act.REQUEST_APPROVAL, UpgradeState.CORDON)
    waiting = node(UpgradeState.CORDON, disruptions=manual,
                   annotations={labels.DISRUPTION_APPROVED: ""} if approved else {})
    # No timeout: a person approves (an hour later, still waiting).
    assert step(waiting, mode=DrainMode.DECKHOUSE, now=3600.0) == ((Act.CORDON, UpgradeState.DRAIN) if approved
                                                                  else (Act.NOTHING, None))


def test_deckhouse_automatic_approval_keeps_to_the_nodegroups_windows() -> None:
    group = {"spec": {"disruptions": {"approvalMode": "Automatic", "automatic": {
        "windows": [{"from": "06:00", "to": "08:00", "days": ["Tue", "Sun"]}]}}}}
    d = Disruptions.of_nodegroup(group)
    assert d == Disruptions("Automatic", (DisruptionWindow(360, 480, frozenset({1, 6})),))
    required = node(UpgradeState.REQUIRED, disruptions=d)
    assert step(required, mode=DrainMode.DECKHOUSE, now=TUESDAY_7) == (Act.CORDON, UpgradeState.DRAIN)
    assert step(required, mode=DrainMode.DECKHOUSE, now=TUESDAY_7 + 2 * 3600) == (Act.NOTHING, None)
    assert step(required, mode=DrainMode.DECKHOUSE, now=TUESDAY_7 + 86400) == (Act.NOTHING, None), "Wednesday"
    # Deckhouse's defaults: Automatic, always; a window across midnight; an unreadable window closes.
    assert Disruptions.of_nodegroup(None).allows(TUESDAY_7)
    assert DisruptionWindow(22 * 60, 8 * 60).contains(TUESDAY_7)
    assert not Disruptions.of_nodegroup({"spec": {"disruptions": {"automatic": {"windows": [{"from": "x"}]}}}}
                                        ).allows(TUESDAY_7)
    rolling = Disruptions.of_nodegroup({"spec": {"disruptions": {"approvalMode": "RollingUpdate", "rollingUpdate": {
        "windows": [{"from": "10:00", "to": "11:00"}]}}}})
    assert not rolling.manual and not rolling.allows(TUESDAY_7)


def test_the_drain_leaves_what_the_policy_does_not_evict_and_names_it() -> None:
    bare = PodRef("ml", "notebook")
    stuck = node(UpgradeState.DRAIN, workloads=(bare, WEB), refused={bare: "no controller recreates it"})
    s = decide(stuck, may_start=True, policy=POLICY, drain_mode=DrainMode.CORDON, now=10)
    assert (s.act, s.pods) == (Act.EVICT, (WEB,))
    alone = node(UpgradeState.DRAIN, workloads=(bare,), refused={bare: "no controller recreates it"})
    assert step(alone) == (Act.NOTHING, None)
    s = decide(dataclasses.replace(alone, waited=601), may_start=True, policy=POLICY, drain_mode=DrainMode.CORDON,
               now=10)
    assert s.act is Act.FAIL and "ml/notebook (no controller recreates it)" in s.reason


def test_stopping_agents_and_the_old_pod_have_a_timeout() -> None:
    assert step(node(UpgradeState.RESTART, clients_stopping=1, waited=301)) == (Act.FAIL, UpgradeState.FAILED)
    assert step(node(UpgradeState.RESTART, dataclasses.replace(OLD, terminating=True), waited=301)) == (
        Act.FAIL, UpgradeState.FAILED)
    assert step(node(UpgradeState.RESTART, None, waited=301)) == (Act.SET_STATE, UpgradeState.VALIDATION)


def test_no_timeout_reads_the_wall_clock() -> None:
    """``now`` is for the disruption windows only: a wall clock far ahead fails no node that has waited 10 s."""
    stuck = node(UpgradeState.DRAIN, workloads=(TRAIN,), gpu_workloads=(TRAIN,))
    assert step(stuck, now=10 + 7 * 86400) == (Act.EVICT, None)
    assert step(node(UpgradeState.VALIDATION, STARTING), now=1e12) == (Act.NOTHING, None)


def test_a_node_whose_upgrade_an_operator_stopped_is_given_back() -> None:
    # The failed state label removed, the driver now current: taint and cordon record go, nothing restarts.
    assert step(node(None, NEW, tainted=True)) == (Act.UNCORDON, UpgradeState.DONE)
    assert step(node(None, NEW, annotations={WAS_CORDONED_ANNOTATION: "false"})) == (Act.UNCORDON, UpgradeState.DONE)
    assert step(node(UpgradeState.REQUIRED, NEW, tainted=True)) == (Act.UNCORDON, UpgradeState.DONE)
    # Still outdated: the upgrade starts over.
    assert step(node(None, OLD, tainted=True)) == (Act.SET_STATE, UpgradeState.REQUIRED)


def test_the_policy_travels_on_the_daemonset_as_json() -> None:
    text = POLICY.to_annotation()
    assert UpgradePolicy.from_annotation(text) == POLICY
    assert UpgradePolicy.from_annotation("not json") == UpgradePolicy()
    assert UpgradePolicy.from_annotation(None) == UpgradePolicy()
