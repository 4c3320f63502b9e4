"""The pods on one Node: list, evict, delete (what the MIG manager drains before it repartitions a GPU, and the
driver upgrade before it replaces a driver), and whether a pod is Ready."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from node_agent.kube.errors import NotFound
from node_agent.kube.transport import Kube


def ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (every container passed its readiness probe)."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def pods_on_node(kube: Kube, node: str) -> list[dict[str, Any]]:
    """Pods with ``spec.nodeName`` ``node``, in every namespace; filtered again here, since a field
    selector is a request some emulators ignore."""
    items = kube.items("/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"}, what=f"list pods on {node}")
    return [p for p in items if (p.get("spec") or {}).get("nodeName") == node]


def evict(kube: Kube, namespace: str, name: str) -> None:
    """Ask for an eviction (PodDisruptionBudgets apply). A pod already gone is fine; a refusal raises
    :class:`~node_agent.kube.errors.TooManyRequests` (a budget says not now) or ``Conflict``."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    try:
        kube.create(f"{pod_path(namespace, name)}/eviction", body, what=f"evict pod {namespace}/{name}")
    except NotFound:
        return


def delete_pod(kube: Kube, namespace: str, name: str) -> None:
    """Delete, bypassing budgets (a drain's last resort); a pod already gone is fine."""
    try:
        kube.delete(pod_path(namespace, name), what=f"delete pod {namespace}/{name}")
    except NotFound:
        return
