"""The MIG manager's Kubernetes side: its own Node, the pods on it, and Events, over the official client.

Only this module imports ``kubernetes``. It exposes the few calls the manager makes as
:class:`NodeApi`, returning plain frozen values, so the executor is tested against an in-memory fake
and this wrapper against a fake HTTP API server (kmock). Every call is counted (``calls``) for the
benchmark's API-calls-per-reconfiguration figure.

Node changes are JSON merge patches of ``metadata.labels``/``annotations`` (``None`` deletes a key),
``spec.taints`` (the whole list, as merge patch replaces lists) and ``spec.unschedulable``: one PATCH
per step, no read-modify-write of labels, so a concurrent labeller's keys are never overwritten. The
taint list is the one read-modify-write: a patch carrying it also carries the ``resourceVersion`` it
was computed from, so the API server refuses it (409) instead of dropping a taint someone else added
meanwhile; the executor then re-reads the Node and decides again.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from node_agent.kubeclient import MERGE_PATCH, KubeError

log = logging.getLogger(__name__)

EVENT_NAMESPACE = "default"  #: Node events live in ``default``, as kubelet's do
COMPONENT = "nvidia-gpu-mig-manager"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str
    #: RFC 3339, as read (the node lifecycle controller stamps its NoExecute taints). Kept so that
    #: rewriting the whole list gives other controllers' taints back unchanged; not part of equality.
    time_added: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "value": self.value, "effect": self.effect}
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: tuple[Taint, ...]
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
    taints: tuple[Taint, ...] | None = None
    unschedulable: bool | None = None
    #: A precondition: apply only to this version of the Node (409 Conflict otherwise). Set with
    #: ``taints``, which replace the whole list computed from that version.
    resource_version: str = ""

    @property
    def empty(self) -> bool:
        return not self.labels and not self.annotations and self.taints is None and self.unschedulable is None

    def body(self) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        spec: dict[str, Any] = {}
        if self.taints is not None:
            spec["taints"] = [t.to_dict() for t in self.taints]
        if self.unschedulable is not None:
            spec["unschedulable"] = self.unschedulable
        out: dict[str, Any] = {}
        if meta:
            out["metadata"] = meta
        if spec:
            out["spec"] = spec
        return out


class NodeApi(Protocol):
    """The calls the MIG manager makes; all raise :class:`KubeError`."""

    calls: int

    def read_node(self) -> NodeView: ...

    def patch_node(self, patch: NodePatch) -> NodeView: ...

    def pods_on_node(self) -> tuple[PodView, ...]: ...

    def evict(self, namespace: str, name: str) -> None: ...

    def delete_pod(self, namespace: str, name: str) -> None: ...

    def event(self, node: NodeView, reason: str, message: str, warning: bool) -> None: ...

    def wait_for_change(self, resource_version: str, timeout_s: float) -> None:
        """Block until the Node changes or ``timeout_s`` passes (a watch, or a sleep in fakes)."""
        ...

    def cancel_waits(self) -> None:
        """End the wait in progress now, and make later ones return at once: the manager is stopping.

        Safe from a signal handler and from another thread. Without it a SIGTERM while idle sat out
        the rest of a 60 s watch, past the pod's grace period, and the kubelet killed the manager.
        """
        ...


def _node_view(obj: Any) -> NodeView:
    meta = obj.metadata
    spec = obj.spec
    taints = tuple(
        Taint(t.key, t.value or "", t.effect, _rfc3339(t.time_added))
        for t in ((spec.taints if spec is not None else None) or [])
    )
    return NodeView(
        name=meta.name,
        uid=meta.uid or "",
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        taints=taints,
        unschedulable=bool(spec.unschedulable) if spec is not None else False,
        resource_version=meta.resource_version or "",
    )


def _rfc3339(value: Any) -> str:
    """The client's ``datetime`` (or a string some fakes send) back in the API's ``Time`` format."""
    if not value:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def _pod_view(pod: Any) -> PodView:
    spec = pod.spec
    requests: set[str] = set()
    for c in [*(spec.containers or []), *(spec.init_containers or [])]:
        res = c.resources
        for block in (res.requests, res.limits) if res is not None else ():
            requests.update(k for k in (block or {}) if k.startswith("nvidia.com/"))
    keys = set((spec.node_selector or {}).keys())
    affinity = spec.affinity.node_affinity if spec.affinity is not None else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity is not None else None
    for term in (required.node_selector_terms or []) if required is not None else []:
        keys.update(e.key for e in term.match_expressions or [])
    owners = pod.metadata.owner_references or []
    return PodView(
        namespace=pod.metadata.namespace or "",
        name=pod.metadata.name,
        phase=(pod.status.phase if pod.status is not None else None) or "Pending",
        gpu_requests=tuple(sorted(requests)),
        selector_keys=tuple(sorted(keys)),
        daemonset=any(o.kind == "DaemonSet" for o in owners),
        labels=dict(pod.metadata.labels or {}),
    )


class KubeNodeApi:
    """:class:`NodeApi` over ``kubernetes.client`` for one Node."""

    def __init__(self, api_client: client.ApiClient, node_name: str, request_timeout_s: float = 30.0) -> None:
        self.core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.timeout = request_timeout_s
        self.calls = 0
        self._cancelled = False
        self._watch_response: Any = None  #: the open watch's urllib3 response, for :meth:`cancel_waits`

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        try:
            return fn(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as e:
            raise KubeError(f"{what}: HTTP {e.status} {e.reason}", e.status) from e
        except Exception as e:  # urllib3 connection errors and timeouts
            raise KubeError(f"{what}: {e}") from e

    def read_node(self) -> NodeView:
        return _node_view(self._call(f"read node {self.node_name}", self.core.read_node, self.node_name))

    def patch_node(self, patch: NodePatch) -> NodeView:
        if patch.empty:
            return self.read_node()
        # Say so: for a dict body the client picks JSON Patch and its REST layer quietly swaps that for
        # a strategic merge patch; the deletions by ``None`` and the whole-list taints are merge patch's.
        obj = self._call(f"patch node {self.node_name}", self.core.patch_node, self.node_name, patch.body(),
                         _content_type=MERGE_PATCH)
        return _node_view(obj)

    def pods_on_node(self) -> tuple[PodView, ...]:
        result = self._call(
            f"list pods on {self.node_name}",
            self.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={self.node_name}",
        )
        # Filter again: a field selector is a request, and some fakes ignore it.
        mine = [p for p in result.items or [] if p.spec is not None and p.spec.node_name == self.node_name]
        return tuple(_pod_view(p) for p in mine)

    def evict(self, namespace: str, name: str) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            self._call(f"evict pod {namespace}/{name}", self.core.create_namespaced_pod_eviction, name, namespace, body)
        except KubeError as e:
            if e.status == 404:  # already gone
                return
            # 429: a PodDisruptionBudget refuses for now; 409: the budget changed under the eviction.
            # Both are "not yet": the executor's drain wait retries.
            if e.status in (429, 409):
                log.info("event=evict-refused pod=%s/%s reason=%s", namespace, name,
                         "pdb" if e.status == 429 else "conflict")
                return
            raise

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            self._call(f"delete pod {namespace}/{name}", self.core.delete_namespaced_pod, name, namespace)
        except KubeError as e:
            if e.status != 404:
                raise

    def event(self, node: NodeView, reason: str, message: str, warning: bool) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "metadata": {"generateName": f"{node.name}.mig-", "namespace": EVENT_NAMESPACE},
            "involvedObject": {"kind": "Node", "name": node.name, "uid": node.uid, "apiVersion": "v1"},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": node.name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call(f"create event for {node.name}", self.core.create_namespaced_event, EVENT_NAMESPACE, body)

    def wait_for_change(self, resource_version: str, timeout_s: float) -> None:
        if self._cancelled:
            return
        self.calls += 1
        w = watch.Watch()  # type: ignore[no-untyped-call]
        kwargs: dict[str, Any] = {
            "field_selector": f"metadata.name={self.node_name}",
            "timeout_seconds": max(1, int(timeout_s)),
            "_request_timeout": timeout_s + 5,
        }
        if resource_version:
            kwargs["resource_version"] = resource_version

        @functools.wraps(self.core.list_node)  # the watch reads the event type from the docstring
        def list_node(*args: Any, **kw: Any) -> Any:
            response = self.core.list_node(*args, **kw)
            self._watch_response = response
            log.debug("event=watch-open node=%s resource_version=%s", self.node_name, resource_version or "-")
            # A cancel that came while the request was being sent found no response to shut down.
            # Set-then-check here against cancel_waits' set-then-read: one of the two always sees the other.
            if self._cancelled:
                _shut_down(response)
            return response

        try:
            for event in _stream(w, list_node, **kwargs):
                obj = event.get("object")
                rv = getattr(getattr(obj, "metadata", None), "resource_version", "") or ""
                if not resource_version or rv != resource_version:
                    return
        except ApiException as e:
            if e.status == 410 or self._cancelled:  # 410: resourceVersion too old; the caller re-reads anyway
                return
            raise KubeError(f"watch node {self.node_name}: HTTP {e.status} {e.reason}", e.status) from e
        except Exception as e:
            if self._cancelled:  # the read broken off by cancel_waits: a stop, not a failure
                return
            raise KubeError(f"watch node {self.node_name}: {e}") from e
        finally:
            self._watch_response = None
            w.stop()  # type: ignore[no-untyped-call]

    def cancel_waits(self) -> None:
        # Shut the socket's read side (urllib3's ``HTTPResponse.shutdown``, made to stop a read from
        # elsewhere): a read blocked in this thread (a signal handler runs between its retries) or in
        # another one sees end-of-stream at once. Closing the response instead would race the reader.
        self._cancelled = True
        response = self._watch_response
        if response is not None:
            _shut_down(response)


def _shut_down(response: Any) -> None:
    """Break off a streaming response's reads; never raises (the caller may be a signal handler)."""
    try:
        response.shutdown()
    except (OSError, ValueError, RuntimeError) as e:  # already closed or released: nothing left to stop
        log.debug("event=watch-shutdown-skipped error=%s", e)


def _stream(w: watch.Watch, fn: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    yield from w.stream(fn, **kwargs)  # type: ignore[no-untyped-call]
