"""The MIG manager's Kubernetes side: its own Node, the pods on it, and Events.

The few calls the manager makes are :class:`NodeApi`, returning plain frozen values, so the executor is
tested against an in-memory fake; :class:`KubeNodeApi` implements it over the agent's one Kubernetes layer
(:mod:`node_agent.kube`, raw JSON: no typed models, which cost 20 MiB and drop fields such as a taint's
``timeAdded``), tested against a fake HTTP API server (kmock) and a real one. Every call is counted
(``calls``) for the benchmark's API-calls-per-reconfiguration figure.

Node changes are :class:`NodePatch` values, sent as the MIG manager's
:class:`~node_agent.kube.nodeowner.NodeChange` by :func:`node_agent.kube.nodeowner.patch`, which owns the
rules: JSON merge patches of ``metadata.labels``/``annotations`` (``None`` deletes a key), ``spec.taints``
(the whole list, as merge patch replaces lists) and ``spec.unschedulable``, only of keys the MIG manager
owns: one PATCH per step, no read-modify-write of labels, so a concurrent labeller's keys are never
overwritten. The taint list is the one read-modify-write: a patch carrying it also carries the
``resourceVersion`` it was computed from, so the API server refuses it (409) instead of dropping a taint
someone else added meanwhile; the executor then re-reads the Node and decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from node_agent.kube import events, nodeowner, nodes, pods
from node_agent.kube.errors import Conflict, Gone, KubeError, TooManyRequests
from node_agent.kube.nodeowner import MIG_MANAGER, NodeChange
from node_agent.kube.transport import Kube, Stream
from node_agent.kube.watch import watch_once
from nvgpu.taints import NodeTaint

log = logging.getLogger(__name__)

COMPONENT = "nvidia-gpu-mig-manager"


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: tuple[NodeTaint, ...]
    unschedulable: bool
    resource_version: str = ""


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    phase: str
    gpu_requests: tuple[str, ...]  #: extended resources ``nvidia.com/*`` the pod's containers ask for
    selector_keys: tuple[str, ...]  #: nodeSelector and node-affinity keys
    daemonset: bool
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodePatch:
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    taints: tuple[NodeTaint, ...] | None = None
    unschedulable: bool | None = None
    #: A precondition: apply only to this version of the Node (409 Conflict otherwise). Set with
    #: ``taints``, which replace the whole list computed from that version.
    resource_version: str = ""
    #: The taint list ``taints`` was computed from (the Node's, as read): what tells the changed taints.
    taints_read: tuple[NodeTaint, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.labels and not self.annotations and self.taints is None and self.unschedulable is None

    def change(self) -> NodeChange:
        """The MIG manager's change of its Node."""
        return NodeChange(MIG_MANAGER, labels=self.labels, annotations=self.annotations,
                          taints=None if self.taints is None else tuple(t.as_dict() for t in self.taints),
                          taints_read=tuple(t.as_dict() for t in self.taints_read),
                          unschedulable=self.unschedulable, resource_version=self.resource_version)


class NodeApi(Protocol):
    """The calls the MIG manager makes; all raise ``node_agent.kube.errors.KubeError`` subclasses."""

    @property
    def calls(self) -> int:
        """API calls made so far."""
        ...

    def read_node(self) -> NodeView: ...

    def patch_node(self, patch: NodePatch) -> NodeView: ...

    def pods_on_node(self) -> tuple[PodView, ...]: ...

    def evict(self, namespace: str, name: str) -> None: ...

    def delete_pod(self, namespace: str, name: str) -> None: ...

    def event(self, node: NodeView, reason: str, message: str, warning: bool) -> None: ...

    def wait_for_change(self, resource_version: str, timeout_s: float) -> str | None:
        """Block until the Node changes or ``timeout_s`` passes (a watch, or a sleep in fakes).

        Answers None when the Node changed (or may have: the caller reads it again), else the version
        the wait ended at (bookmarks move it on), to resume from without reading the Node."""
        ...

    def cancel_waits(self) -> None:
        """End the wait in progress now, and make later ones return at once: the manager is stopping.

        Safe from a signal handler and from another thread. Without it a SIGTERM while idle sat out
        the rest of its watch (up to a minute then), past the pod's grace period, and the kubelet killed the manager.
        """
        ...


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """The manager's view of a Node as raw JSON."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return NodeView(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        labels=nodes.labels_of(obj),
        annotations=nodes.annotations_of(obj),
        taints=tuple(NodeTaint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""),
                           str(t.get("timeAdded") or "")) for t in nodes.taints_of(obj)),
        unschedulable=bool(spec.get("unschedulable")),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """What the drain needs of a pod as raw JSON."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    requests: set[str] = set()
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for block in (res.get("requests"), res.get("limits")):
            requests.update(k for k in (block or {}) if k.startswith("nvidia.com/"))
    keys = set((spec.get("nodeSelector") or {}).keys())
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        keys.update(str(e.get("key")) for e in term.get("matchExpressions") or [])
    return PodView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        gpu_requests=tuple(sorted(requests)),
        selector_keys=tuple(sorted(keys)),
        daemonset=any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
    )


class KubeNodeApi:
    """:class:`NodeApi` over :class:`node_agent.kube.transport.Kube` for one Node."""

    def __init__(self, kube: Kube, node_name: str) -> None:
        self.kube = kube
        self.node_name = node_name
        self._cancelled = False
        self._stream: Stream | None = None  #: the open watch, for :meth:`cancel_waits`

    @property
    def calls(self) -> int:
        return self.kube.calls

    def read_node(self) -> NodeView:
        return node_view(nodes.get_node(self.kube, self.node_name))

    def patch_node(self, patch: NodePatch) -> NodeView:
        if patch.empty:
            return self.read_node()
        return node_view(nodeowner.patch(self.kube, self.node_name, patch.change()))

    def pods_on_node(self) -> tuple[PodView, ...]:
        return tuple(pod_view(p) for p in pods.pods_on_node(self.kube, self.node_name))

    def evict(self, namespace: str, name: str) -> None:
        try:
            pods.evict(self.kube, namespace, name)
        except (TooManyRequests, Conflict) as e:
            # 429: a PodDisruptionBudget refuses for now; 409: the budget changed under the eviction.
            # Both are "not yet": the executor's drain wait retries.
            log.info("event=evict-refused pod=%s/%s reason=%s", namespace, name,
                     "pdb" if isinstance(e, TooManyRequests) else "conflict")

    def delete_pod(self, namespace: str, name: str) -> None:
        pods.delete_pod(self.kube, namespace, name)

    def event(self, node: NodeView, reason: str, message: str, warning: bool) -> None:
        events.post_node_event(self.kube, node.name, node.uid, component=COMPONENT, reason=reason, message=message,
                               warning=warning)

    def wait_for_change(self, resource_version: str, timeout_s: float) -> str | None:
        if self._cancelled:
            return None
        latest = resource_version
        try:
            for kind, obj in watch_once(self.kube, nodes.NODES, resource_version=resource_version,
                                        query={"fieldSelector": f"metadata.name={self.node_name}"},
                                        timeout_s=timeout_s, read_slack_s=5.0, on_open=self._opened):
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if kind == "BOOKMARK":
                    latest = rv or latest
                    continue
                if not resource_version or rv != resource_version:
                    return None
        except Gone:  # resourceVersion too old: the caller re-reads anyway
            return None
        except KubeError:
            if self._cancelled:  # the read broken off by cancel_waits: a stop, not a failure
                return None
            raise
        finally:
            self._stream = None
        return None if self._cancelled else latest

    def _opened(self, stream: Stream) -> None:
        self._stream = stream
        log.debug("event=watch-open node=%s", self.node_name)
        # A cancel that came while the request was being sent found no stream to shut down.
        # Set-then-check here against cancel_waits' set-then-read: one of the two always sees the other.
        if self._cancelled:
            stream.shutdown()

    def cancel_waits(self) -> None:
        self._cancelled = True
        stream = self._stream
        if stream is not None:
            stream.shutdown()
