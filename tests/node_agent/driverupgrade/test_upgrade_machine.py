"""The driver upgrade's decisions, node by node (``node_agent.driverupgrade.machine``): the states in order,
one node out of service at a time, drains by policy, timeouts that stop the rollout, Deckhouse's approval."""

from __future__ import annotations

import dataclasses

import pytest

from node_agent.driverupgrade.machine import (
    Act,
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


def node(state: UpgradeState | None, pod: DriverPod | None = OLD, *, since: float = 0.0, **kw: object) -> NodeFacts:
    return NodeFacts("n1", state, since, False, driver_pod=pod, **kw)  # type: ignore[arg-type]


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
    stuck = node(UpgradeState.DRAIN, since=0.0, workloads=(TRAIN,), gpu_workloads=(TRAIN,))
    assert step(stuck, now=599) == (Act.EVICT, None)
    s = decide(stuck, may_start=True, policy=POLICY, drain_mode=DrainMode.CORDON, now=601)
    assert (s.act, s.state) == (Act.FAIL, UpgradeState.FAILED) and "ml/train" in s.reason
    assert step(node(UpgradeState.VALIDATION, STARTING, since=0), now=301) == (Act.FAIL, UpgradeState.FAILED)
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


@pytest.mark.parametrize("approved", [False, True])
def test_deckhouse_approves_the_disruption_first(approved: bool) -> None:
    assert step(node(UpgradeState.REQUIRED), mode=DrainMode.DECKHOUSE) == (Act.REQUEST_APPROVAL, UpgradeState.CORDON)
    waiting = node(UpgradeState.CORDON, annotations={labels.DISRUPTION_APPROVED: ""} if approved else {})
    assert step(waiting, mode=DrainMode.DECKHOUSE) == ((Act.CORDON, UpgradeState.DRAIN) if approved
                                                       else (Act.NOTHING, None))


def test_the_policy_travels_on_the_daemonset_as_json() -> None:
    text = POLICY.to_annotation()
    assert UpgradePolicy.from_annotation(text) == POLICY
    assert UpgradePolicy.from_annotation("not json") == UpgradePolicy()
    assert UpgradePolicy.from_annotation(None) == UpgradePolicy()
