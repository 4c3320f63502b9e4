"""The driver upgrade's state machine: what to do next for one node, from what the cluster shows.

A driver DaemonSet is ``OnDelete``: changing its template (a new version or image) leaves every node's
driver pod as it is, outdated. The controller walks each such node through NVIDIA's GPU Operator's
upgrade states, kept on the node's ``nvidia.com/gpu-driver-upgrade-state`` label (so ``kubectl get nodes
-L`` shows the rollout, and a restarted controller resumes where the last one was):

``upgrade-required`` -> (a free slot: fewer than ``maxUnavailable`` nodes in flight, none failed) cordon
-> ``drain-required`` (evict the node's pods, or only those holding GPUs without ``drain``; on Deckhouse
after its disruption approval) -> ``pod-restart-required`` (delete the outdated driver pod; the DaemonSet
starts the new one) -> ``validation-required`` (the new pod Ready: NVIDIA's startup probe ran ``nvidia-smi``,
and the agent's check beside it found the node usable with the driver the pod's template declares)
-> ``uncordon-required`` -> ``upgrade-done``. A wait that outlasts its timeout sets ``upgrade-failed``,
which stops the rollout (no further node starts) until an operator removes the label.

Pure: :func:`decide` takes a :class:`NodeFacts` snapshot and answers one :class:`Step`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from nvgpu import labels
from nvgpu.driver import UpgradePolicy

STATE_LABEL = labels.DRIVER_UPGRADE_STATE
#: Unix time the node entered its state (the timeouts survive a controller restart).
SINCE_ANNOTATION = "gpu.nvidia-gpu.io/driver-upgrade-since"
#: "true" when the node was cordoned before the upgrade (it stays cordoned after).
WAS_CORDONED_ANNOTATION = "gpu.nvidia-gpu.io/driver-upgrade-was-cordoned"
#: Why the node's upgrade failed.
FAILURE_ANNOTATION = labels.DRIVER_UPGRADE_FAILURE


class UpgradeState(StrEnum):
    REQUIRED = "upgrade-required"
    CORDON = "cordon-required"
    DRAIN = "drain-required"
    RESTART = "pod-restart-required"
    VALIDATION = "validation-required"
    UNCORDON = "uncordon-required"
    DONE = "upgrade-done"
    FAILED = "upgrade-failed"


#: The states in which a node is out of service for the upgrade (they count against maxUnavailable).
IN_FLIGHT = frozenset({UpgradeState.CORDON, UpgradeState.DRAIN, UpgradeState.RESTART, UpgradeState.VALIDATION,
                       UpgradeState.UNCORDON})


class DrainMode(StrEnum):
    #: Cordon and evict through the Eviction API (PodDisruptionBudgets apply).
    CORDON = "cordon"
    #: Ask Deckhouse's node-manager for the disruption first (``update.node.deckhouse.io/disruption-*``).
    DECKHOUSE = "deckhouse"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DriverPod:
    ref: PodRef
    #: Made from the DaemonSet's current template (its ``pod-template-generation`` is the DaemonSet's).
    current: bool
    ready: bool
    terminating: bool = False


@dataclass(frozen=True)
class NodeFacts:
    name: str
    state: UpgradeState | None
    since: float
    unschedulable: bool
    annotations: Mapping[str, str] = field(default_factory=dict)
    driver_pod: DriverPod | None = None
    #: The pods a drain moves (the node's pods but DaemonSets', mirror and finished ones), and of
    #: them those holding GPUs.
    workloads: tuple[PodRef, ...] = ()
    gpu_workloads: tuple[PodRef, ...] = ()


class Act(StrEnum):
    NOTHING = "nothing"
    SET_STATE = "set-state"
    REQUEST_APPROVAL = "request-approval"
    CORDON = "cordon"
    EVICT = "evict"
    DELETE_DRIVER_POD = "delete-driver-pod"
    UNCORDON = "uncordon"
    FAIL = "fail"


@dataclass(frozen=True)
class Step:
    act: Act
    state: UpgradeState | None = None  #: the state to record after the act (None: keep)
    reason: str = ""
    pods: tuple[PodRef, ...] = ()


def outdated(node: NodeFacts) -> bool:
    return node.driver_pod is not None and not node.driver_pod.current


def decide(node: NodeFacts, *, may_start: bool, policy: UpgradePolicy, drain_mode: DrainMode, now: float) -> Step:
    """The next step for ``node``; ``may_start``: a slot is free for one more node to leave service."""
    state, waited = node.state, now - node.since
    if state in (None, UpgradeState.DONE):
        if outdated(node):
            return Step(Act.SET_STATE, UpgradeState.REQUIRED, "the driver pod is older than its DaemonSet")
        return Step(Act.NOTHING)
    if state is UpgradeState.FAILED:
        return Step(Act.NOTHING, reason="failed: waiting for an operator to remove the state label")
    if state is UpgradeState.REQUIRED:
        if not outdated(node):  # replaced meanwhile (by hand, or the pod went and came back current)
            return Step(Act.SET_STATE, UpgradeState.DONE, "the driver pod is current")
        if not may_start:
            return Step(Act.NOTHING, reason="waiting for a free slot (maxUnavailable) or a failed node")
        if drain_mode is DrainMode.DECKHOUSE:
            return Step(Act.REQUEST_APPROVAL, UpgradeState.CORDON, "asking Deckhouse for the disruption")
        return Step(Act.CORDON, UpgradeState.DRAIN, "cordoned for the driver upgrade")
    if state is UpgradeState.CORDON:  # Deckhouse: waiting for its approval
        if labels.DISRUPTION_APPROVED in node.annotations:
            return Step(Act.CORDON, UpgradeState.DRAIN, "disruption approved: cordoned")
        if waited > policy.drain_timeout_s:
            return Step(Act.FAIL, UpgradeState.FAILED, f"no disruption approval within {policy.drain_timeout_s:.0f} s")
        return Step(Act.NOTHING, reason="waiting for Deckhouse's disruption approval")
    if state is UpgradeState.DRAIN:
        left = node.workloads if policy.drain else node.gpu_workloads
        if not left:
            return Step(Act.SET_STATE, UpgradeState.RESTART, "drained")
        if waited > policy.drain_timeout_s:
            return Step(Act.FAIL, UpgradeState.FAILED, f"drain did not finish within {policy.drain_timeout_s:.0f} s; "
                        f"left: {', '.join(map(str, left[:5]))}")
        return Step(Act.EVICT, reason=f"{len(left)} pod(s) to move", pods=left)
    if state is UpgradeState.RESTART:
        pod = node.driver_pod
        if pod is not None and not pod.current:
            if pod.terminating:
                return Step(Act.NOTHING, reason=f"driver pod {pod.ref} is stopping")
            return Step(Act.DELETE_DRIVER_POD, reason=f"replacing driver pod {pod.ref}", pods=(pod.ref,))
        return Step(Act.SET_STATE, UpgradeState.VALIDATION, "the new driver pod is starting")
    if state is UpgradeState.VALIDATION:
        pod = node.driver_pod
        if pod is not None and pod.current and pod.ready:
            return Step(Act.SET_STATE, UpgradeState.UNCORDON, "the new driver is loaded and the node's check passes")
        if waited > policy.validation_timeout_s:
            return Step(Act.FAIL, UpgradeState.FAILED,
                        f"the new driver pod was not ready within {policy.validation_timeout_s:.0f} s")
        return Step(Act.NOTHING, reason="waiting for the new driver pod to be ready")
    # UNCORDON
    return Step(Act.UNCORDON, UpgradeState.DONE, "upgraded")


def may_start(nodes: list[NodeFacts], policy: UpgradePolicy) -> bool:
    """A node of this group may leave service: fewer than maxUnavailable in flight, and none failed."""
    if any(n.state is UpgradeState.FAILED for n in nodes):
        return False
    return sum(n.state in IN_FLIGHT for n in nodes) < policy.max_unavailable
