"""Controllers the stack runs off its GPU nodes (the eviction guard, the driver upgrade controller): the
node affinity that keeps them there, the unprivileged security context, and their one-replica Deployment.

Off the GPU nodes, because their tokens may do what no GPU node's agent may (re-point a webhook, cordon
and evict across the cluster): a compromised GPU node never holds them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from nvgpu import labels
from nvgpu.stackconfig import NodeGroup
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import selector_labels
from nvidia_gpu.components.manifests.workloads import SKIP_AWAIT

#: Unprivileged, as Pod Security ``restricted`` asks (the image's default user).
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}


#: Beyond this many selector terms the negation is left to the GPU taint (a stack of many groups chosen by
#: many labels; every term is ANDed with the setup gate either way).
MAX_AFFINITY_TERMS = 32
_NEGATED = {"In": "NotIn", "NotIn": "In", "Exists": "DoesNotExist", "DoesNotExist": "Exists"}


def _negations(group: NodeGroup) -> list[dict[str, Any]]:
    """Requirements each of which alone keeps a node out of ``group`` (the group's selector ANDs its
    requirements, so a node that fails any one is not the group's). ``NotIn`` also matches a node without
    the key, and ``In`` needs it: each is the exact complement of the other."""
    out: list[dict[str, Any]] = [{"key": k, "operator": "NotIn", "values": [v]} for k, v in sorted(
        group.match_labels.items())]
    for r in group.match_expressions:
        req: dict[str, Any] = {"key": r.key, "operator": _NEGATED[r.operator]}
        if r.operator in ("In", "NotIn"):
            req["values"] = sorted(r.values)
        out.append(req)
    return out


def _term(choice: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One selector term: the setup gate and one negation per group (NotIns of one key merged)."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for req in choice:
        key = (req["key"], req["operator"])
        if key in merged and req["operator"] == "NotIn":
            merged[key] = {**req, "values": sorted({*merged[key]["values"], *req["values"]})}
        elif key not in merged or req["operator"] != "In":
            merged.setdefault(key, req)
        else:  # two Ins of one key: a node must carry a value in both lists
            merged[key] = {**req, "values": sorted(set(merged[key]["values"]) & set(req["values"]))}
    return [{"key": labels.GPU_SETUP_COMPLETE, "operator": "DoesNotExist"},
            *(merged[k] for k in sorted(merged))]


def off_gpu_nodes(groups: Sequence[NodeGroup]) -> dict[str, Any]:
    """Required node affinity away from GPU nodes: not set up for GPUs, and in none of the stack's groups.

    "In no group" is the AND over groups of "fails one of its requirements"; node affinity ORs its terms,
    so that is written out as one term per way of choosing a failed requirement in each group (a stack of
    groups chosen by one label each is one term). Where that would exceed :data:`MAX_AFFINITY_TERMS`, the
    groups' GPU taint keeps the guard off them (it tolerates none), and only the gate is required."""
    choices = [_negations(g) for g in groups if g.match_labels or g.match_expressions]
    count = 1
    for c in choices:
        count *= len(c)
    if count > MAX_AFFINITY_TERMS:
        choices = []
    terms: list[list[dict[str, Any]]] = []
    for choice in itertools.product(*choices):
        term = _term(choice)
        if term not in terms and not any(r["operator"] == "In" and not r["values"] for r in term):
            terms.append(term)
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}


def controller_deployment(name: str, namespace: str, meta: dict[str, str], groups: Sequence[NodeGroup],
                          container: dict[str, Any], *, volumes: Sequence[dict[str, Any]] = ()) -> Manifest:
    """One replica, replaced with ``Recreate`` (never two at once), unprivileged, off every group's nodes.
    Not awaited by ``pulumi up``: a new cluster may not have a node for it yet."""
    container = {**container, "securityContext": CONTAINER_SECURITY}
    spec: dict[str, Any] = {
        "serviceAccountName": name,
        "automountServiceAccountToken": True,
        # Not node-critical like the agents: any node but a GPU node can run it.
        "priorityClassName": "system-cluster-critical",
        "securityContext": POD_SECURITY,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": off_gpu_nodes(groups),
        "containers": [container],
    }
    if volumes:
        spec["volumes"] = [dict(v) for v in volumes]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": meta, "annotations": dict(SKIP_AWAIT)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(name, namespace)},
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": meta}, "spec": spec},
        },
    }
