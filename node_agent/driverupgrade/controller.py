"""The driver upgrade controller: one per stack, reading the driver DaemonSets, their pods and nodes, and
acting on :func:`node_agent.driverupgrade.machine.decide`'s steps.

Each round lists the stack's driver DaemonSets (``app.kubernetes.io/name=nvidia-driver`` in the stack's
namespace), their pods (current when their ``driver-spec`` hash is their template's), the nodes those run
on and the nodes that carry an upgrade state, and takes one step per node. The nodes of a node group share
its policy (carried by its DaemonSets' ``driver-upgrade-policy`` annotation, so the stack config is its one
source) and its ``maxUnavailable``. Every step is one API call or a few idempotent ones, each Node write
carries the resourceVersion the step was decided on (a node changed meanwhile is decided again next
round), and the state is on the node: a controller killed between two steps takes the next round from
there. One node's refused call is logged and reported; the other nodes go on.

The state on the node is trusted only where the controller wrote it (:mod:`node_agent.driverupgrade.nodestate`:
its Node writes name its field manager, ``managedFields`` says who last changed each key); another
client's value is logged, reported in a ``DriverUpgradeStateForged`` Event, not acted on, and written back
as the controller's record says. Every Node write is a :class:`~node_agent.kube.nodeowner.NodeChange` of
:data:`~node_agent.kube.nodeowner.DRIVER_UPGRADE` (its keys, its field manager), sent by
:func:`node_agent.kube.nodeowner.patch`. The timeouts are measured on the monotonic clock
(:meth:`UpgradeController.waited`), so a step of the wall clock fails no node.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from node_agent.driverupgrade.machine import (
    FAILURE_ANNOTATION,
    SINCE_ANNOTATION,
    STATE_LABEL,
    WAS_CORDONED_ANNOTATION,
    Act,
    Disruptions,
    DrainMode,
    DriverPod,
    NodeFacts,
    PodRef,
    Step,
    UpgradeState,
    decide,
    may_start,
    timeout_s,
)
from node_agent.driverupgrade.nodestate import RECORD_ANNOTATION, Record, Trusted, trusted
from node_agent.host.proc import BOOT_ID_PATH
from node_agent.kube import events, nodeowner, nodes, pods
from node_agent.kube.errors import Conflict, KubeError, NotFound, TooManyRequests
from node_agent.kube.nodeowner import DRIVER_UPGRADE, NodeChange, retaint
from node_agent.kube.transport import Kube
from node_agent.kube.watch import ListWatch
from nvgpu import labels
from nvgpu.driver import (
    CONTAINER_COMPONENT,
    DRIVER_SPEC_ANNOTATION,
    UPGRADE_POLICY_ANNOTATION,
    UPGRADE_TAINT_KEY,
    UpgradePolicy,
)

log = logging.getLogger(__name__)

COMPONENT = "nvidia-gpu-driver-upgrade"
DRIVER_SELECTOR = f"app.kubernetes.io/name={CONTAINER_COMPONENT}"
NODE_GROUP_LABEL = labels.NODE_GROUP
#: Resources whose holders a drain without ``drain`` still moves: the GPUs, their MIG devices and shares.
GPU_RESOURCE_PREFIX = "nvidia.com/"
UPGRADE_TAINT = {"key": UPGRADE_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
NODEGROUPS = "/apis/deckhouse.io/v1/nodegroups"


def host_boot_id() -> str:
    """The boot ID of the host the controller runs on ("" when unreadable: its waits are then never taken
    as this host's). ``/proc/sys/kernel/random/boot_id`` is the host's, in a container too."""
    try:
        return Path(BOOT_ID_PATH).read_text().strip()
    except OSError:
        return ""


def _owned_by_daemonset(pod: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in (pod.get("metadata") or {}).get("ownerReferences") or [])


def _holds_gpus(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):  # DRA: the claim's devices are this node's GPUs
        return True
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if any(str(k).startswith(GPU_RESOURCE_PREFIX) for k in (res.get(part) or {})):
                return True
    return False


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(str(meta.get("namespace")), str(meta.get("name")))


def _refusal(pod: Mapping[str, Any], policy: UpgradePolicy) -> str | None:
    """Why the policy keeps the drain from evicting ``pod``, as ``kubectl drain`` refuses without its flags."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if not policy.force and not any(o.get("controller") for o in owners):
        return "no controller recreates it: upgrade.force evicts it"
    if not policy.delete_empty_dir and any("emptyDir" in v for v in (pod.get("spec") or {}).get("volumes") or []):
        return "its emptyDir data would be lost: upgrade.deleteEmptyDir evicts it"
    return None


_DEFAULT_POLICY = UpgradePolicy()


def workloads(node_pods: list[dict[str, Any]], policy: UpgradePolicy = _DEFAULT_POLICY
              ) -> tuple[tuple[PodRef, ...], tuple[PodRef, ...], dict[PodRef, str]]:
    """What a drain of the node moves (every pod but DaemonSets', mirror and finished ones), of those the
    pods holding GPUs, and those the policy does not let it evict (with the reason)."""
    moved, gpus, refused = [], [], {}
    for p in node_pods:
        meta = p.get("metadata") or {}
        if _owned_by_daemonset(p) or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            continue
        if _finished(p):
            continue
        ref = _ref(p)
        moved.append(ref)
        if _holds_gpus(p):
            gpus.append(ref)
        if (why := _refusal(p, policy)) is not None:
            refused[ref] = why
    return tuple(moved), tuple(gpus), refused


def _selector_keys(pod: Mapping[str, Any]) -> set[str]:
    spec = pod.get("spec") or {}
    keys = set((spec.get("nodeSelector") or {}).keys())
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or []:
        keys |= {str(e.get("key")) for e in term.get("matchExpressions") or []}
    return keys


def gpu_agent(pod: Mapping[str, Any]) -> bool:
    """A DaemonSet pod that holds the node's GPUs open: it requests ``nvidia.com/*``, is a known GPU agent
    (``nvgpu.labels.GPU_AGENT_POD_LABELS``: ours and NVIDIA's), or is placed by NVIDIA's deploy labels. Not
    the driver's own pods."""
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    if not _owned_by_daemonset(pod) or pod_labels.get("app.kubernetes.io/name") == CONTAINER_COMPONENT:
        return False
    return (_holds_gpus(pod) or any(pod_labels.get(k) == v for k, v in labels.GPU_AGENT_POD_LABELS)
            or any(k.startswith(labels.GPU_DEPLOY_PREFIX) for k in _selector_keys(pod)))


def clients(node_pods: list[dict[str, Any]]) -> tuple[tuple[PodRef, ...], int]:
    """The node's GPU agent pods still running, and how many are stopping."""
    running, stopping = [], 0
    for p in node_pods:
        if _finished(p) or not gpu_agent(p):
            continue
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            stopping += 1
        else:
            running.append(_ref(p))
    return tuple(running), stopping


def _current(pod: Mapping[str, Any], ds: Mapping[str, Any]) -> bool:
    """Runs the DaemonSet's driver: the same ``driver-spec`` hash; where the template carries none (a
    DaemonSet from before it), the same template generation (the pod's ``pod-template-generation`` is the
    DaemonSet's ``deprecated.daemonset.template.generation``, which only a template change moves)."""
    template = ((ds.get("spec") or {}).get("template") or {}).get("metadata") or {}
    want = (template.get("annotations") or {}).get(DRIVER_SPEC_ANNOTATION)
    meta = pod.get("metadata") or {}
    if want is not None:
        return bool((meta.get("annotations") or {}).get(DRIVER_SPEC_ANNOTATION) == want)
    generation = ((ds.get("metadata") or {}).get("annotations") or {}).get("deprecated.daemonset.template.generation")
    return generation is not None and (meta.get("labels") or {}).get("pod-template-generation") == generation


class Watcher(Protocol):
    """What :meth:`UpgradeController.run` needs of a watch (:class:`~node_agent.kube.watch.ListWatch`)."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = 5.0) -> None: ...


#: The states in which a node waits for nothing of the controller's: it has no timeout running and no step
#: is due until something changes (a driver pod, a DaemonSet, the node's state label).
AT_REST = frozenset({None, UpgradeState.DONE, UpgradeState.FAILED})


@dataclass
class Round:
    """What one round saw and did, per node (the tests and the log read it)."""

    steps: dict[str, Step] = field(default_factory=dict)
    #: Every node at rest, no step taken and no call refused: nothing is due until something changes, so
    #: :meth:`UpgradeController.run` waits on its watches instead of running the next round on a timer.
    settled: bool = True


@dataclass(frozen=True)
class _Read:
    """A node as a round read it: its facts, the resourceVersion they are of, what of its state is trusted."""

    facts: NodeFacts
    version: str
    seen: Trusted


@dataclass(frozen=True)
class Retaint:
    """A node's new taint list and the list it was computed from (the ownership check's base)."""

    new: tuple[dict[str, Any], ...]
    read: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class _Wait:
    """A wait this process took over without a monotonic reading of this host to time it from."""

    key: tuple[str, str, str]  #: the state, its since annotation and record it was taken over at
    started: float  #: this process's monotonic clock then
    carried: float  #: seconds the wait had run by then, by the wall clock (0: it starts again)


class UpgradeController:
    def __init__(self, kube: Kube, namespace: str, *, drain_mode: DrainMode = DrainMode.CORDON,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 boot_id: Callable[[], str] = host_boot_id, dry_run: bool = False) -> None:
        #: Decide each node's step and change nothing (``driver-upgrade --once``).
        self.dry_run = dry_run
        self.kube = kube
        self.namespace = namespace
        self.drain_mode = drain_mode
        #: The wall clock: the NodeGroups' disruption windows (times of day) and the since annotation
        #: people read. No timeout is measured on it.
        self.clock = clock
        #: What the timeouts are measured on (:meth:`waited`), with the boot of the host it counts on
        #: (read once: a process does not outlive its host's boot).
        self.monotonic = monotonic
        self.boot_id = boot_id()
        self._waits: dict[str, _Wait] = {}

    # -- reading ---------------------------------------------------------------------------------------
    def _daemonsets(self) -> list[dict[str, Any]]:
        path = f"/apis/apps/v1/namespaces/{quote(self.namespace, safe='')}/daemonsets"
        return self.kube.items(path, query={"labelSelector": DRIVER_SELECTOR}, what="list driver DaemonSets")

    def _driver_pods(self, ds: Mapping[str, Any]) -> list[dict[str, Any]]:
        instance = ds["metadata"]["name"]
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods"
        selector = f"{DRIVER_SELECTOR},app.kubernetes.io/instance={instance}"
        return self.kube.items(path, query={"labelSelector": selector}, what=f"list pods of {instance}")

    def _group_nodes(self) -> dict[str, dict[str, Any]]:
        """Every node of a node group, by name: one list a round rather than a read per node (a round
        runs every few seconds for as long as the stack has container drivers)."""
        found = self.kube.items(nodes.NODES, query={"labelSelector": NODE_GROUP_LABEL},
                                what="list the node groups' nodes")
        return {n["metadata"]["name"]: n for n in found}

    def _disruptions(self, node: Mapping[str, Any], cache: dict[str, Disruptions]) -> Disruptions | None:
        group = nodes.label_of(node, labels.DECKHOUSE_NODE_GROUP)
        if self.drain_mode is not DrainMode.DECKHOUSE or not group:
            return None
        if group not in cache:
            try:
                obj = self.kube.get_object(f"{NODEGROUPS}/{quote(group, safe='')}", what=f"read NodeGroup {group}")
            except NotFound:
                obj = None
            cache[group] = Disruptions.of_nodegroup(obj)
        return cache[group]

    def _facts(self, node_name: str, pod: DriverPod | None, policy: UpgradePolicy,
               nodegroups: dict[str, Disruptions], listed: Mapping[str, dict[str, Any]]) -> _Read | None:
        """The node's facts, the resourceVersion they were read at and what of its state is trusted; None
        for a node that is gone. The round's node list serves a node of the stack's groups; a node without
        the group label is read. The state and the controller's annotations are as the controller wrote
        them (:func:`~node_agent.driverupgrade.nodestate.trusted`)."""
        node = listed.get(node_name)
        if node is None:
            try:
                node = nodes.get_node(self.kube, node_name)
            except NotFound:
                return None
        seen = trusted(node)
        annotations, state = dict(seen.annotations), seen.state
        on_node = pods.pods_on_node(self.kube, node_name) if state in (UpgradeState.DRAIN, UpgradeState.RESTART) else []
        moved, gpus, refused = workloads(on_node, policy) if state is UpgradeState.DRAIN else ((), (), {})
        running, stopping = clients(on_node) if state is UpgradeState.RESTART else ((), 0)
        disruptions = self._disruptions(node, nodegroups) if state in (UpgradeState.REQUIRED, UpgradeState.CORDON) \
            else None
        facts = NodeFacts(name=node_name, state=state, waited=self.waited(node_name, state, seen, policy),
                          unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
                          annotations=annotations, driver_pod=pod, workloads=moved, gpu_workloads=gpus,
                          refused=refused,
                          tainted=any(t.get("key") == UPGRADE_TAINT_KEY for t in nodes.taints_of(node)),
                          clients=running, clients_stopping=stopping, disruptions=disruptions)
        return _Read(facts, str((node.get("metadata") or {}).get("resourceVersion", "")), seen)

    # -- timing ----------------------------------------------------------------------------------------
    def waited(self, name: str, state: UpgradeState | None, seen: Trusted, policy: UpgradePolicy) -> float:
        """Seconds node ``name`` has been in ``state``, for its timeout; 0 for a state without one.

        Measured on the monotonic clock, never as the wall clock's now minus the node's since annotation: a
        wall clock stepped forward (NTP, ``date -s``) failed a drain that had waited a minute, and one
        stepped back held a real timeout back by as much. With each state the controller records the boot
        ID of its host and that host's ``CLOCK_MONOTONIC`` (:class:`~node_agent.driverupgrade.nodestate.Record`);
        a controller on the same boot, this process or a restarted one, measures the wait from that reading.

        A controller on another host (the Deployment's pod moved) or after a reboot cannot read the writer's
        monotonic clock: the wall clock is all that links the two. It takes the wait over once: the wall
        clock's reading of it if that lies within the state's timeout, or else a wait that starts again now
        (logged ``event=upgrade-wait-restarted``), since a start in the future or already past the timeout is
        as likely a step as a real wait, and starting again holds a node one timeout longer where trusting
        it would fail the node. From then on this process measures it on its own monotonic clock; its next
        state write records this host's reading.
        """
        limit = timeout_s(state, policy)
        if state is None or limit is None:
            self._waits.pop(name, None)
            return 0.0
        now = self.monotonic()
        r = seen.record
        if r is not None and r.state is state and self.boot_id and r.boot_id == self.boot_id and now >= r.monotonic:
            return now - r.monotonic
        since = seen.annotations.get(SINCE_ANNOTATION, "")
        key = (state.value, since, r.encode() if r is not None else "")
        w = self._waits.get(name)
        if w is None or w.key != key:
            carried, why = self._placed(since, limit)
            if why:
                log.info("event=upgrade-wait-restarted node=%s state=%s reason=%s", name, state.value, why)
            w = self._waits[name] = _Wait(key, now, carried)
        return w.carried + now - w.started

    def _placed(self, since: str, limit: float) -> tuple[float, str]:
        """How long a wait begun at ``since`` (wall clock) has run, and why it starts again ("" if not)."""
        try:
            elapsed = self.clock() - float(since)
        except ValueError:
            return 0.0, "no-start-recorded"
        if not math.isfinite(elapsed):
            return 0.0, "no-start-recorded"
        if elapsed < 0:
            return 0.0, "start-in-the-future"
        if elapsed > limit:
            return 0.0, "start-past-the-timeout"
        return elapsed, ""

    # -- one round -------------------------------------------------------------------------------------
    def run_round(self) -> Round:
        out = Round()
        groups: dict[str, tuple[UpgradePolicy, dict[str, DriverPod | None]]] = {}
        for ds in self._daemonsets():
            meta = ds["metadata"]
            group = (meta.get("labels") or {}).get(NODE_GROUP_LABEL, meta["name"])
            policy = UpgradePolicy.from_annotation((meta.get("annotations") or {}).get(UPGRADE_POLICY_ANNOTATION))
            _, members = groups.setdefault(group, (policy, {}))
            for p in self._driver_pods(ds):
                node_name = (p.get("spec") or {}).get("nodeName")
                if not node_name:
                    continue
                pmeta = p["metadata"]
                members[node_name] = DriverPod(
                    PodRef(self.namespace, pmeta["name"]),
                    current=_current(p, ds),
                    ready=pods.ready(p), terminating=bool(pmeta.get("deletionTimestamp")))
        nodegroups: dict[str, Disruptions] = {}
        listed = self._group_nodes() if groups else {}
        seen_nodes: set[str] = set()
        for group, (policy, members) in groups.items():
            # Nodes mid-upgrade whose driver pod is gone (being replaced) are still the group's.
            for name, node in listed.items():
                if nodes.label_of(node, NODE_GROUP_LABEL) == group and nodes.label_of(node, STATE_LABEL):
                    members.setdefault(name, None)
            read = [r for name, pod in sorted(members.items())
                    if (r := self._facts(name, pod, policy, nodegroups, listed)) is not None]
            seen_nodes.update(r.facts.name for r in read)
            facts = [r.facts for r in read]
            for i, r in enumerate(read):
                f, version = r.facts, r.version
                for x in r.seen.forged:
                    log.warning("event=upgrade-state-forged node=%s key=%s manager=%s value=%r", f.name, x.key,
                                ",".join(x.managers) or "-", x.value)
                step = decide(f, may_start=may_start(facts, policy), policy=policy, drain_mode=self.drain_mode,
                              now=self.clock())
                out.steps[f.name] = step
                if step.act is not Act.NOTHING or f.state not in AT_REST or r.seen.forged:
                    out.settled = False
                if self.dry_run:
                    continue
                if step.act is not Act.NOTHING:
                    log.info("event=driver-upgrade-step node=%s act=%s state=%s reason=%r", f.name, step.act.value,
                             step.state.value if step.state else "-", step.reason)
                try:
                    if r.seen.restore_labels or r.seen.restore_annotations:
                        version = self._restore(f, r.seen, version)
                    self._perform(f, step, version)
                except Conflict:
                    log.info("event=node-changed-meanwhile node=%s", f.name)
                    out.settled = False
                    continue
                except KubeError as e:  # this node's call refused: report it, and go on with the others
                    out.settled = False
                    log.warning("event=driver-upgrade-step-failed node=%s act=%s error=%s", f.name, step.act.value, e)
                    self._event(f, "DriverUpgradeStepFailed", f"{step.act.value}: {e}", warning=True)
                    continue
                # What this step changed counts for the next node's slot in this round.
                if step.state is not None:
                    facts[i] = dataclasses.replace(f, state=step.state, waited=0.0)
        self._waits = {n: w for n, w in self._waits.items() if n in seen_nodes}
        return out

    # -- acting ----------------------------------------------------------------------------------------
    def _patch(self, name: str, change: NodeChange, what: str) -> dict[str, Any]:
        """One merge patch of the Node, signed with the controller's field manager, which ``managedFields``
        then names for every key it changed: how the controller later tells its own state from another
        client's."""
        return nodeowner.patch(self.kube, name, change, what=what)

    def _state(self, f: NodeFacts, state: UpgradeState, version: str, *,
               annotations: Mapping[str, str | None] | None = None, unschedulable: bool | None = None,
               taints: Retaint | None = None) -> None:
        """Record ``state`` on the node: the label, when it began (the since annotation, for people) and the
        controller's record of it (what times its wait, and what it puts back if another client rewrites
        its keys), in one patch, so label and record share one managedFields entry."""
        since = f"{self.clock():.0f}"
        extra = dict(annotations or {})
        was = extra[WAS_CORDONED_ANNOTATION] if WAS_CORDONED_ANNOTATION in extra else \
            f.annotations.get(WAS_CORDONED_ANNOTATION)
        record = Record(state, float(since), self.boot_id, self.monotonic(), was)
        change = NodeChange(DRIVER_UPGRADE, labels={STATE_LABEL: state.value},
                            annotations={SINCE_ANNOTATION: since, RECORD_ANNOTATION: record.encode(), **extra},
                            unschedulable=unschedulable, taints=None if taints is None else taints.new,
                            taints_read=() if taints is None else taints.read, resource_version=version)
        self._patch(f.name, change, what=f"driver upgrade: {state.value}")

    def _restore(self, f: NodeFacts, seen: Trusted, version: str) -> str:
        """Write the controller's view of the node's state back over what another client wrote (a forged
        key as the controller's record says, or gone), at the resourceVersion the step was decided on, and
        report a forgery in an Event. Answers the node's new resourceVersion, at which the step then goes:
        the restore changed nothing the step was decided on, since the step read the restored view."""
        change = NodeChange(DRIVER_UPGRADE, labels=seen.restore_labels, annotations=seen.restore_annotations,
                            resource_version=version)
        obj = self._patch(f.name, change, what="driver upgrade: restore its state")
        if seen.forged:
            named = "; ".join(f"{x.key}={x.value!r} by {', '.join(x.managers) or 'an unrecorded manager'}"
                              for x in seen.forged)
            self._event(f, "DriverUpgradeStateForged", f"the driver upgrade's state on this node was written by "
                        f"another client and is ignored: {named}; put back as the controller recorded it",
                        warning=True)
        return str((obj.get("metadata") or {}).get("resourceVersion", ""))

    def _taints(self, f: NodeFacts, version: str, *, tainted: bool) -> Retaint | None:
        """The node's taints with the upgrade's added or removed (None: no change). Read again at
        ``version``: a taint list is replaced whole, so a Node changed since is a conflict, not a loss."""
        if f.tainted == tainted:
            return None
        node = nodes.get_node(self.kube, f.name)
        if str((node.get("metadata") or {}).get("resourceVersion", "")) != version:
            raise Conflict(f"node {f.name} changed since this step was decided")
        read = nodes.taints_of(node)
        return Retaint(retaint(read, UPGRADE_TAINT_KEY, UPGRADE_TAINT if tainted else None), read)

    def _event(self, f: NodeFacts, reason: str, message: str, warning: bool) -> None:
        try:
            node = nodes.get_node(self.kube, f.name)
            events.post_node_event(self.kube, f.name, str(node["metadata"].get("uid", "")), component=COMPONENT,
                                   reason=reason, message=message, warning=warning)
        except KubeError as e:  # an Event is a courtesy
            log.warning("event=event-failed node=%s reason=%s error=%s", f.name, reason, e)

    def _perform(self, f: NodeFacts, step: Step, version: str) -> None:
        # Whether the node was cordoned before is recorded once, from the Node the step was decided on
        # (the write carries its resourceVersion): a retried request never takes its own cordon for one.
        was = {} if WAS_CORDONED_ANNOTATION in f.annotations else {
            WAS_CORDONED_ANNOTATION: "true" if f.unschedulable else "false"}
        if step.act is Act.NOTHING:
            return
        if step.act is Act.SET_STATE:
            assert step.state is not None
            self._state(f, step.state, version)
        elif step.act is Act.REQUEST_APPROVAL:
            self._state(f, UpgradeState.CORDON, version, annotations={**was, labels.DISRUPTION_REQUIRED: ""})
            self._event(f, "DriverUpgradeAwaitsApproval", f"the NVIDIA driver upgrade waits for approval: kubectl "
                        f"annotate node {f.name} {labels.DISRUPTION_APPROVED}=", warning=False)
        elif step.act is Act.CORDON:
            self._state(f, UpgradeState.DRAIN, version, annotations=was, unschedulable=True)
        elif step.act is Act.EVICT:
            for ref in step.pods:
                try:
                    pods.evict(self.kube, ref.namespace, ref.name)
                except (TooManyRequests, Conflict):  # a PodDisruptionBudget says not yet: the drain waits
                    log.info("event=evict-refused pod=%s", ref)
        elif step.act is Act.STOP_CLIENTS:
            # The taint first (one write, at the step's resourceVersion), so the DaemonSets place no new
            # agent here; then the agents go through the Eviction API (their budgets apply).
            if (taints := self._taints(f, version, tainted=True)) is not None:
                self._patch(f.name, NodeChange(DRIVER_UPGRADE, taints=taints.new, taints_read=taints.read,
                                               resource_version=version), what="driver upgrade: taint")
            for ref in step.pods:
                try:
                    pods.evict(self.kube, ref.namespace, ref.name)
                except (TooManyRequests, Conflict):
                    log.info("event=evict-refused pod=%s", ref)
        elif step.act is Act.DELETE_DRIVER_POD:
            for ref in step.pods:
                pods.delete_pod(self.kube, ref.namespace, ref.name)
        elif step.act is Act.UNCORDON:
            stays = f.annotations.get(WAS_CORDONED_ANNOTATION) == "true"
            cleared: dict[str, str | None] = dict.fromkeys((WAS_CORDONED_ANNOTATION, FAILURE_ANNOTATION,
                                                            labels.DISRUPTION_REQUIRED, labels.DISRUPTION_APPROVED))
            upgraded = f.state is UpgradeState.UNCORDON
            self._state(f, UpgradeState.DONE, version, annotations=cleared, unschedulable=None if stays else False,
                        taints=self._taints(f, version, tainted=False))
            if upgraded:
                self._event(f, "DriverUpgraded", "the NVIDIA driver was replaced and its new pod is ready",
                            warning=False)
        elif step.act is Act.FAIL:
            self._state(f, UpgradeState.FAILED, version, annotations={FAILURE_ANNOTATION: step.reason[:1024]})
            self._event(f, "DriverUpgradeFailed", f"{step.reason}; the rollout stops until the "
                        f"{STATE_LABEL} label is removed", warning=True)

    # -- the loop --------------------------------------------------------------------------------------
    def watches(self, wake: Callable[[], None]) -> list[Watcher]:
        """What wakes a settled controller, each a watch resumed from its version (:class:`ListWatch`):
        the driver DaemonSets (a version or policy change), their pods (a new node's driver, a pod that
        turns outdated or unready) and the nodes whose state label says anything but done (an operator
        removing ``upgrade-failed``, or a forged state appearing). The node watch is selected by label,
        so a fleet's status heartbeats never reach it."""
        ns = quote(self.namespace, safe="")

        def poke(*_: object) -> None:
            wake()

        def watch(path: str, selector: str, name: str) -> ListWatch:
            return ListWatch(self.kube, path, label_selector=selector, on_list=poke, on_event=poke,
                             name=f"driver-upgrade-{name}", log_as=f"driver-upgrade-{name}-watch")

        return [watch(f"/apis/apps/v1/namespaces/{ns}/daemonsets", DRIVER_SELECTOR, "daemonsets"),
                watch(f"/api/v1/namespaces/{ns}/pods", DRIVER_SELECTOR, "pods"),
                watch(nodes.NODES, f"{STATE_LABEL},{STATE_LABEL}!={UpgradeState.DONE.value}", "nodes")]

    def run(self, stop: threading.Event, interval_s: float = 5.0, resync_s: float = 600.0) -> None:
        """Rounds until ``stop``. While a rollout runs (a node mid-upgrade, a step taken, a call refused)
        one every ``interval_s``: its waits, timeouts and evictions are looked at then. Once a round is
        settled (:attr:`Round.settled`), the next comes when one of :meth:`watches` sees a change, or
        after ``resync_s`` at the latest. A settled stack, which is almost always, then costs the API
        server three open watches instead of three lists (one of them every node of the groups) every
        ``interval_s``: at 1,000 nodes the list alone was a few MB every 5 s."""
        wake = threading.Event()
        watches = self.watches(wake.set)

        def relay() -> None:  # so one wait serves both: a change, or the end
            stop.wait()
            wake.set()

        threading.Thread(target=relay, name="driver-upgrade-stop", daemon=True).start()
        for w in watches:
            w.start()
        try:
            while not stop.is_set():
                wake.clear()  # a change from here on, during the round included, means another round
                try:
                    settled = self.run_round().settled
                except KubeError as e:  # the API server away: the state is on the nodes, try again
                    log.warning("event=driver-upgrade-round-failed error=%s", e)
                    settled = False
                if settled:
                    wake.wait(resync_s)
                else:
                    stop.wait(interval_s)
        finally:
            for w in watches:
                w.stop()
