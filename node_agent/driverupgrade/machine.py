"""The driver upgrade's state machine: what to do next for one node, from what the cluster shows.

A driver DaemonSet is ``OnDelete``: changing its driver (a new version or image) leaves every node's
driver pod as it is, outdated (its ``driver-spec`` hash is not its DaemonSet's). The controller walks each
such node through NVIDIA's GPU Operator's upgrade states, kept on the node's
``nvidia.com/gpu-driver-upgrade-state`` label (so ``kubectl get nodes -L`` shows the rollout, and a
restarted controller resumes where the last one was):

``upgrade-required`` -> (a free slot: fewer than ``maxUnavailable`` nodes in flight, none failed; on
Deckhouse within the NodeGroup's disruption windows, or once a person approved it where its approval mode
is ``Manual``) cordon -> ``drain-required`` (evict the node's pods, or only those holding GPUs without
``drain``; pods no controller owns and ``emptyDir`` pods only where the policy allows) ->
``pod-restart-required`` (taint the node and stop its GPU agents, which hold the driver open, then delete
the outdated driver pod; the DaemonSet starts the new one) -> ``validation-required`` (the new pod Ready:
NVIDIA's startup probe ran ``nvidia-smi``, and the agent's check beside it found the node usable with the
driver the pod's template declares) -> ``uncordon-required`` (the taint goes, the agents come back) ->
``upgrade-done``. A wait that outlasts its timeout sets ``upgrade-failed``, which stops the rollout (no
further node starts) until an operator removes the label; the node then gets its taint and cordon back
off, or the upgrade starts over if its driver is still outdated.

Pure: :func:`decide` takes a :class:`NodeFacts` snapshot and answers one :class:`Step`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from nvgpu import labels
from nvgpu.driver import UpgradePolicy

STATE_LABEL = labels.DRIVER_UPGRADE_STATE
#: Unix time the node entered its state: for people, and for a controller on another host, which cannot
#: read the writer's monotonic clock, to place a wait it did not time (see ``UpgradeController.waited``).
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
    #: The same, within the Deckhouse NodeGroup's disruption settings (``spec.disruptions``: its windows,
    #: or a person's ``update.node.deckhouse.io/disruption-approved`` where the approval mode is Manual).
    DECKHOUSE = "deckhouse"


@dataclass(frozen=True)
class DisruptionWindow:
    """One of a Deckhouse NodeGroup's disruption windows: minutes after midnight UTC, weekdays (0 = Monday)."""

    start_min: int
    end_min: int
    days: frozenset[int] = frozenset()

    def contains(self, now: float) -> bool:
        t = time.gmtime(now)
        if self.days and t.tm_wday not in self.days:
            return False
        minute = t.tm_hour * 60 + t.tm_min
        if self.start_min <= self.end_min:
            return self.start_min <= minute < self.end_min
        return minute >= self.start_min or minute < self.end_min  # across midnight


@dataclass(frozen=True)
class Disruptions:
    """A Deckhouse NodeGroup's ``spec.disruptions`` as the driver upgrade honours it. Deckhouse's own
    approval handshake (``waiting-for-approval``, ``approved``) belongs to bashible's configuration updates:
    node-manager clears it on any node whose configuration is current, so the upgrade reads the policy and
    applies it itself. ``RollingUpdate`` (replace the node) is honoured as its windows: a driver change
    needs no new node."""

    approval_mode: str = "Automatic"
    windows: tuple[DisruptionWindow, ...] = ()

    @property
    def manual(self) -> bool:
        return self.approval_mode == "Manual"

    def allows(self, now: float) -> bool:
        return not self.windows or any(w.contains(now) for w in self.windows)

    @classmethod
    def of_nodegroup(cls, obj: Mapping[str, Any] | None) -> Disruptions:
        """From a NodeGroup object (``deckhouse.io/v1``); Deckhouse's defaults where it says nothing. A window
        the CRD's patterns would refuse is skipped, never read as "always"."""
        spec = (obj or {}).get("spec") or {}
        d = spec.get("disruptions") or {}
        mode = str(d.get("approvalMode") or "Automatic")
        section = d.get("rollingUpdate" if mode == "RollingUpdate" else "automatic") or {}
        windows: list[DisruptionWindow] = []
        raw_windows = section.get("windows") or []
        for w in raw_windows:
            try:
                start, end = (_minutes(str(w[k])) for k in ("from", "to"))
                days = frozenset(_DAYS.index(str(day)[:3].capitalize()) for day in w.get("days") or [])
            except (KeyError, ValueError, TypeError):
                continue
            windows.append(DisruptionWindow(start, end, days))
        if raw_windows and not windows:  # every window unreadable: closed, not open
            windows.append(DisruptionWindow(0, 0, frozenset({-1})))
        return cls(mode, tuple(windows))


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    h, m = int(hours), int(minutes)
    if not (0 <= h < 24 and 0 <= m < 60):
        raise ValueError(hhmm)
    return h * 60 + m


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DriverPod:
    ref: PodRef
    #: Runs the DaemonSet's current driver (its ``driver-spec`` hash is the template's).
    current: bool
    ready: bool
    terminating: bool = False


@dataclass(frozen=True)
class NodeFacts:
    name: str
    state: UpgradeState | None
    #: Seconds the node has been in its state, as the controller measured them (the monotonic clock, not
    #: the wall clock, which a step would move: see ``UpgradeController.waited``); what its timeout reads.
    waited: float
    unschedulable: bool
    annotations: Mapping[str, str] = field(default_factory=dict)
    driver_pod: DriverPod | None = None
    #: The pods a drain moves (the node's pods but DaemonSets', mirror and finished ones), and of
    #: them those holding GPUs.
    workloads: tuple[PodRef, ...] = ()
    gpu_workloads: tuple[PodRef, ...] = ()
    #: Of the workloads, those the policy does not let the drain evict, and why.
    refused: Mapping[PodRef, str] = field(default_factory=dict)
    #: The node carries the upgrade's taint (``nvgpu.driver.UPGRADE_TAINT_KEY``).
    tainted: bool = False
    #: The node's GPU agents (DaemonSet pods holding the driver open), and how many are stopping.
    clients: tuple[PodRef, ...] = ()
    clients_stopping: int = 0
    #: Deckhouse: the node's NodeGroup's disruption settings (None: not read, Deckhouse's defaults).
    disruptions: Disruptions | None = None


class Act(StrEnum):
    NOTHING = "nothing"
    SET_STATE = "set-state"
    REQUEST_APPROVAL = "request-approval"
    CORDON = "cordon"
    EVICT = "evict"
    STOP_CLIENTS = "stop-clients"
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


def _left_over(node: NodeFacts) -> bool:
    """The node still carries what an upgrade stopped by an operator put there (taint, cordon record)."""
    return node.tainted or WAS_CORDONED_ANNOTATION in node.annotations


def timeout_s(state: UpgradeState | None, policy: UpgradePolicy) -> float | None:
    """How long ``state`` may last before the node fails (None: no timeout)."""
    if state is UpgradeState.DRAIN:
        return policy.drain_timeout_s
    if state in (UpgradeState.RESTART, UpgradeState.VALIDATION):
        return policy.validation_timeout_s
    return None


def decide(node: NodeFacts, *, may_start: bool, policy: UpgradePolicy, drain_mode: DrainMode, now: float) -> Step:
    """The next step for ``node``; ``may_start``: a slot is free for one more node to leave service. ``now``
    is the wall clock, for the NodeGroup's disruption windows (times of day); no timeout reads it."""
    state, waited = node.state, node.waited
    if state in (None, UpgradeState.DONE):
        if outdated(node):
            return Step(Act.SET_STATE, UpgradeState.REQUIRED, "the driver pod is older than its DaemonSet")
        if _left_over(node):
            return Step(Act.UNCORDON, UpgradeState.DONE, "the upgrade was stopped: the node is given back")
        return Step(Act.NOTHING)
    if state is UpgradeState.FAILED:
        return Step(Act.NOTHING, reason="failed: waiting for an operator to remove the state label")
    if state is UpgradeState.REQUIRED:
        if not outdated(node):  # replaced meanwhile (by hand, or the pod went and came back current)
            return Step(Act.UNCORDON if _left_over(node) else Act.SET_STATE, UpgradeState.DONE,
                        "the driver pod is current")
        if not may_start:
            return Step(Act.NOTHING, reason="waiting for a free slot (maxUnavailable) or a failed node")
        if drain_mode is DrainMode.DECKHOUSE:
            d = node.disruptions or Disruptions()
            if d.manual:
                return Step(Act.REQUEST_APPROVAL, UpgradeState.CORDON,
                            "the NodeGroup approves disruptions by hand: waiting for "
                            f"{labels.DISRUPTION_APPROVED} on the node")
            if not d.allows(now):
                return Step(Act.NOTHING, reason="outside the NodeGroup's disruption windows")
            return Step(Act.CORDON, UpgradeState.DRAIN, "within the NodeGroup's disruption windows: cordoned")
        return Step(Act.CORDON, UpgradeState.DRAIN, "cordoned for the driver upgrade")
    if state is UpgradeState.CORDON:  # Deckhouse, Manual: a person approves (no timeout)
        d = node.disruptions or Disruptions()
        if labels.DISRUPTION_APPROVED in node.annotations or (not d.manual and d.allows(now)):
            return Step(Act.CORDON, UpgradeState.DRAIN, "disruption approved: cordoned")
        return Step(Act.NOTHING, reason=f"waiting for {labels.DISRUPTION_APPROVED} on the node")
    if state is UpgradeState.DRAIN:
        left = node.workloads if policy.drain else node.gpu_workloads
        if not left:
            return Step(Act.SET_STATE, UpgradeState.RESTART, "drained")
        if waited > policy.drain_timeout_s:
            named = [f"{p} ({node.refused[p]})" if p in node.refused else str(p) for p in left[:5]]
            return Step(Act.FAIL, UpgradeState.FAILED, f"drain did not finish within {policy.drain_timeout_s:.0f} s; "
                        f"left: {', '.join(named)}")
        evictable = tuple(p for p in left if p not in node.refused)
        if not evictable:
            return Step(Act.NOTHING, reason=f"{len(left)} pod(s) the policy does not evict: "
                        f"{', '.join(f'{p} ({node.refused[p]})' for p in left[:5])}")
        return Step(Act.EVICT, reason=f"{len(evictable)} pod(s) to move", pods=evictable)
    if state is UpgradeState.RESTART:
        pod = node.driver_pod
        stopping = node.clients or node.clients_stopping or (pod is not None and not pod.current)
        if stopping and waited > policy.validation_timeout_s:
            return Step(Act.FAIL, UpgradeState.FAILED, f"the node's GPU agents and old driver pod did not stop "
                            f"within {policy.validation_timeout_s:.0f} s")
        if node.clients:  # they hold the driver open: the old one could not unload
            return Step(Act.STOP_CLIENTS, reason=f"stopping {len(node.clients)} GPU agent pod(s)", pods=node.clients)
        if node.clients_stopping:
            return Step(Act.NOTHING, reason=f"{node.clients_stopping} GPU agent pod(s) stopping")
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
