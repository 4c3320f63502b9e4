"""The driver upgrade controller: one per stack, reading the driver DaemonSets, their pods and nodes, and
acting on :func:`node_agent.driverupgrade.machine.decide`'s steps.

Each round lists the stack's driver DaemonSets (``app.kubernetes.io/name=nvidia-driver`` in the stack's
namespace), their pods (current when their ``pod-template-generation`` is the DaemonSet's generation), the
nodes those run on and the nodes that carry an upgrade state, and takes one step per node. The nodes of a
node group share its policy (carried by its DaemonSets' ``driver-upgrade-policy`` annotation, so the stack
config is its one source) and its ``maxUnavailable``. Every step is one API call or a few idempotent ones,
and the state is on the node: a controller killed between two steps takes the next round from there.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from node_agent.driverupgrade.machine import (
    FAILURE_ANNOTATION,
    SINCE_ANNOTATION,
    STATE_LABEL,
    WAS_CORDONED_ANNOTATION,
    Act,
    DrainMode,
    DriverPod,
    NodeFacts,
    PodRef,
    Step,
    UpgradeState,
    decide,
    may_start,
)
from node_agent.kube import events, nodes, pods
from node_agent.kube.errors import Conflict, KubeError, NotFound, TooManyRequests
from node_agent.kube.transport import Kube
from nvgpu import labels
from nvgpu.driver import CONTAINER_COMPONENT, UPGRADE_POLICY_ANNOTATION, UpgradePolicy

log = logging.getLogger(__name__)

COMPONENT = "nvidia-gpu-driver-upgrade"
DRIVER_SELECTOR = f"app.kubernetes.io/name={CONTAINER_COMPONENT}"
NODE_GROUP_LABEL = labels.NODE_GROUP
#: Resources whose holders a drain without ``drain`` still moves: the GPUs, their MIG devices and shares.
GPU_RESOURCE_PREFIX = "nvidia.com/"


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


def workloads(node_pods: list[dict[str, Any]]) -> tuple[tuple[PodRef, ...], tuple[PodRef, ...]]:
    """What a drain of the node moves (every pod but DaemonSets', mirror and finished ones) and, of those,
    the pods holding GPUs."""
    moved, gpus = [], []
    for p in node_pods:
        meta = p.get("metadata") or {}
        if _owned_by_daemonset(p) or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ref = PodRef(str(meta.get("namespace")), str(meta.get("name")))
        moved.append(ref)
        if _holds_gpus(p):
            gpus.append(ref)
    return tuple(moved), tuple(gpus)


@dataclass
class Round:
    """What one round saw and did, per node (the tests and the log read it)."""

    steps: dict[str, Step] = field(default_factory=dict)


class UpgradeController:
    def __init__(self, kube: Kube, namespace: str, *, drain_mode: DrainMode = DrainMode.CORDON,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.namespace = namespace
        self.drain_mode = drain_mode
        self.clock = clock

    # -- reading ---------------------------------------------------------------------------------------
    def _daemonsets(self) -> list[dict[str, Any]]:
        path = f"/apis/apps/v1/namespaces/{quote(self.namespace, safe='')}/daemonsets"
        return self.kube.items(path, query={"labelSelector": DRIVER_SELECTOR}, what="list driver DaemonSets")

    def _driver_pods(self, ds: Mapping[str, Any]) -> list[dict[str, Any]]:
        instance = ds["metadata"]["name"]
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods"
        selector = f"{DRIVER_SELECTOR},app.kubernetes.io/instance={instance}"
        return self.kube.items(path, query={"labelSelector": selector}, what=f"list pods of {instance}")

    def _facts(self, node_name: str, pod: DriverPod | None) -> NodeFacts | None:
        try:
            node = nodes.get_node(self.kube, node_name)
        except NotFound:
            return None
        annotations = nodes.annotations_of(node)
        state_text = nodes.label_of(node, STATE_LABEL)
        try:
            state = UpgradeState(state_text) if state_text else None
        except ValueError:
            state = UpgradeState.REQUIRED  # someone wrote a value of their own: start over, cleanly
        try:
            since = float(annotations.get(SINCE_ANNOTATION, ""))
        except ValueError:
            since = self.clock()
        moved, gpus = workloads(pods.pods_on_node(self.kube, node_name)) if state is UpgradeState.DRAIN else ((), ())
        return NodeFacts(name=node_name, state=state, since=since,
                         unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
                         annotations=annotations, driver_pod=pod, workloads=moved, gpu_workloads=gpus)

    # -- one round -------------------------------------------------------------------------------------
    def run_round(self) -> Round:
        out = Round()
        groups: dict[str, tuple[UpgradePolicy, dict[str, DriverPod | None]]] = {}
        for ds in self._daemonsets():
            meta = ds["metadata"]
            group = (meta.get("labels") or {}).get(NODE_GROUP_LABEL, meta["name"])
            policy = UpgradePolicy.from_annotation((meta.get("annotations") or {}).get(UPGRADE_POLICY_ANNOTATION))
            generation = str(meta.get("generation", ""))
            _, members = groups.setdefault(group, (policy, {}))
            for p in self._driver_pods(ds):
                node_name = (p.get("spec") or {}).get("nodeName")
                if not node_name:
                    continue
                pmeta = p["metadata"]
                members[node_name] = DriverPod(
                    PodRef(self.namespace, pmeta["name"]),
                    current=(pmeta.get("labels") or {}).get("pod-template-generation") == generation,
                    ready=pods.ready(p), terminating=bool(pmeta.get("deletionTimestamp")))
        for group, (policy, members) in groups.items():
            # Nodes mid-upgrade whose driver pod is gone (being replaced) are still the group's.
            for node in self._nodes_in_upgrade(group):
                members.setdefault(node, None)
            facts = [f for name, pod in sorted(members.items()) if (f := self._facts(name, pod)) is not None]
            for f in facts:
                step = decide(f, may_start=may_start(facts, policy), policy=policy, drain_mode=self.drain_mode,
                              now=self.clock())
                out.steps[f.name] = step
                if step.act is not Act.NOTHING:
                    log.info("event=driver-upgrade-step node=%s act=%s state=%s reason=%r", f.name, step.act.value,
                             step.state.value if step.state else "-", step.reason)
                try:
                    self._perform(f, step)
                except Conflict:
                    log.info("event=node-changed-meanwhile node=%s", f.name)
                # What this step changed counts for the next node's slot in this round.
                if step.state is not None:
                    facts[facts.index(f)] = dataclasses.replace(f, state=step.state, since=self.clock())
        return out

    def _nodes_in_upgrade(self, group: str) -> list[str]:
        selector = f"{STATE_LABEL},{NODE_GROUP_LABEL}={group}"
        return [n["metadata"]["name"] for n in self.kube.items(nodes.NODES, query={"labelSelector": selector},
                                                               what="list nodes in a driver upgrade")]

    # -- acting ----------------------------------------------------------------------------------------
    def _state(self, f: NodeFacts, state: UpgradeState, *, annotations: Mapping[str, str | None] | None = None,
               unschedulable: bool | None = None) -> None:
        body = nodes.patch_body(labels={STATE_LABEL: state.value},
                                annotations={SINCE_ANNOTATION: f"{self.clock():.0f}", **(annotations or {})},
                                unschedulable=unschedulable)
        nodes.patch_node(self.kube, f.name, body, what=f"driver upgrade: {state.value}")

    def _event(self, f: NodeFacts, reason: str, message: str, warning: bool) -> None:
        try:
            node = nodes.get_node(self.kube, f.name)
            events.post_node_event(self.kube, f.name, str(node["metadata"].get("uid", "")), component=COMPONENT,
                                   reason=reason, message=message, warning=warning)
        except KubeError as e:  # an Event is a courtesy
            log.warning("event=event-failed node=%s reason=%s error=%s", f.name, reason, e)

    def _perform(self, f: NodeFacts, step: Step) -> None:
        was = {WAS_CORDONED_ANNOTATION: "true" if f.unschedulable else "false"}
        if step.act is Act.NOTHING:
            return
        if step.act is Act.SET_STATE:
            assert step.state is not None
            self._state(f, step.state)
        elif step.act is Act.REQUEST_APPROVAL:
            self._state(f, UpgradeState.CORDON, annotations={**was, labels.DISRUPTION_REQUIRED: ""})
        elif step.act is Act.CORDON:
            keep = {} if WAS_CORDONED_ANNOTATION in f.annotations else was
            self._state(f, UpgradeState.DRAIN, annotations=keep, unschedulable=True)
        elif step.act is Act.EVICT:
            for ref in step.pods:
                try:
                    pods.evict(self.kube, ref.namespace, ref.name)
                except (TooManyRequests, Conflict):  # a PodDisruptionBudget says not yet: the drain waits
                    log.info("event=evict-refused pod=%s", ref)
        elif step.act is Act.DELETE_DRIVER_POD:
            for ref in step.pods:
                pods.delete_pod(self.kube, ref.namespace, ref.name)
        elif step.act is Act.UNCORDON:
            stays = f.annotations.get(WAS_CORDONED_ANNOTATION) == "true"
            cleared: dict[str, str | None] = dict.fromkeys((WAS_CORDONED_ANNOTATION, FAILURE_ANNOTATION,
                                                            labels.DISRUPTION_REQUIRED, labels.DISRUPTION_APPROVED))
            self._state(f, UpgradeState.DONE, annotations=cleared, unschedulable=None if stays else False)
            self._event(f, "DriverUpgraded", "the NVIDIA driver was replaced and its new pod is ready", warning=False)
        elif step.act is Act.FAIL:
            self._state(f, UpgradeState.FAILED, annotations={FAILURE_ANNOTATION: step.reason[:1024]})
            self._event(f, "DriverUpgradeFailed", f"{step.reason}; the rollout stops until the "
                        f"{STATE_LABEL} label is removed", warning=True)

    # -- the loop --------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, interval_s: float = 5.0) -> None:
        while not stop.is_set():
            try:
                self.run_round()
            except KubeError as e:  # the API server away: the state is on the nodes, try again
                log.warning("event=driver-upgrade-round-failed error=%s", e)
            stop.wait(interval_s)
