"""Node reads and patches: the primitives under the agent's one way of changing a Node.

The services never patch a Node through these directly: each says what it changes as a
:class:`node_agent.kube.nodeowner.NodeChange`, and :mod:`node_agent.kube.nodeowner` checks that the keys
are the writer's and sends it here. Changes are JSON merge patches (:func:`patch_body`): a label or
annotation set to ``None`` is deleted, keys not mentioned are left alone, so labels owned by others (NFD,
the MIG manager, an operator) are never overwritten by a read-modify-write. The taint list is the one
read-modify-write, as merge patch replaces lists whole: a patch carrying it also carries the
``resourceVersion`` it was computed from, so the API server refuses it
(:class:`~node_agent.kube.errors.Conflict`) instead of dropping a taint someone else added meanwhile; the
caller re-reads and decides again. Taints are kept as the raw JSON read (``timeAdded`` and any field this
agent does not model), so other controllers' taints are given back byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from node_agent.kube.transport import Kube

NODES = "/api/v1/nodes"


def node_path(name: str) -> str:
    return f"{NODES}/{quote(name, safe='')}"


def get_node(kube: Kube, name: str) -> dict[str, Any]:
    """The Node as raw JSON."""
    return kube.get_object(node_path(name), what=f"read node {name}")


def patch_node(kube: Kube, name: str, body: Mapping[str, Any], what: str = "patch", *,
               field_manager: str = "") -> dict[str, Any]:
    """One merge patch of the Node, as ``field_manager`` when given (``?fieldManager=``, which
    ``managedFields`` then names for every key it changed); answers the Node afterwards."""
    if field_manager:
        obj = kube.request("PATCH", node_path(name), dict(body), query={"fieldManager": field_manager},
                           what=f"{what} node {name}")
    else:
        obj = kube.merge_patch(node_path(name), body, what=f"{what} node {name}")
    return obj if isinstance(obj, dict) else {}


def patch_body(*, labels: Mapping[str, str | None] | None = None,
               annotations: Mapping[str, str | None] | None = None,
               taints: Iterable[Mapping[str, Any]] | None = None, unschedulable: bool | None = None,
               resource_version: str = "") -> dict[str, Any]:
    """The merge patch for these changes (``None`` leaves a part alone; ``taints`` replaces the list)."""
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    if resource_version:
        meta["resourceVersion"] = resource_version
    spec: dict[str, Any] = {}
    if taints is not None:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    body: dict[str, Any] = {}
    if meta:
        body["metadata"] = meta
    if spec:
        body["spec"] = spec
    return body


def labels_of(node: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()}


def annotations_of(node: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("annotations") or {}).items()}


def taints_of(node: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """The taints as read (raw: fields this agent does not model are kept)."""
    return tuple(dict(t) for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict))


def label_of(node: Mapping[str, Any], key: str) -> str | None:
    value = ((node.get("metadata") or {}).get("labels") or {}).get(key)
    return str(value) if value is not None else None
