"""The labeller's Node read and patch for the node-group config, over the official client (``node_agent.kube``).

Separate from the pure planning in ``node_agent.nodeconfig`` so that one is tested without an API server.
The read keeps the raw JSON, so foreign taints (``timeAdded`` and any field this client does not model)
are re-sent byte for byte when the taint list is rewritten. The patch is one JSON merge patch of labels,
annotations and, when it changes, the whole taint list; with the Node's ``resourceVersion`` in it the
API server answers 409 if the Node changed since the read, instead of dropping a concurrent taint.
"""

from __future__ import annotations

from typing import Any

from node_agent.kube import NodeApi
from node_agent.nodeconfig import NodePlan, NodeSnapshot


def snapshot(api: NodeApi, node: str) -> NodeSnapshot:
    """Labels, annotations, taints (raw) and resourceVersion of ``node``."""
    obj = api.read_node(node)
    meta = obj.get("metadata") or {}
    return NodeSnapshot(
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        taints=tuple(dict(t) for t in (obj.get("spec") or {}).get("taints") or []),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def patch_body(plan: NodePlan, resource_version: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if plan.labels:
        meta["labels"] = dict(plan.labels)
    if plan.annotations:
        meta["annotations"] = dict(plan.annotations)
    if resource_version:
        meta["resourceVersion"] = resource_version
    body: dict[str, Any] = {"metadata": meta}
    if plan.taints is not None:
        body["spec"] = {"taints": [dict(t) for t in plan.taints]}
    return body


def apply_plan(api: NodeApi, node: str, plan: NodePlan, resource_version: str = "") -> None:
    """One merge patch; ``resource_version`` (when the API server reported one) guards the taint list."""
    api.patch_node(node, patch_body(plan, resource_version))
