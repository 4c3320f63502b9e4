"""Where the agent pods may run: only on a node group's nodes, only once node setup finished, through its taints.

The node group's selector becomes a required node affinity term (``matchLabels`` entries become ``In``
expressions), and the gate ``node.deckhouse.io/gpu-setup-complete Exists`` is added for every pod that
needs a prepared node. The setup agent itself is the one pod that must run before the gate opens.
"""

from __future__ import annotations

from typing import Any

from nvgpu import labels
from nvgpu.nodelabels import desired_node_taints
from nvgpu.stackconfig import NodeGroup


def node_selector_terms(group: NodeGroup, *, require_setup_complete: bool) -> list[dict[str, Any]]:
    expressions: list[dict[str, Any]] = [
        {"key": key, "operator": "In", "values": [value]} for key, value in sorted(group.match_labels.items())
    ]
    for req in group.match_expressions:
        expr: dict[str, Any] = {"key": req.key, "operator": req.operator}
        if req.values:
            expr["values"] = list(req.values)
        expressions.append(expr)
    if require_setup_complete:
        expressions.append({"key": labels.GPU_SETUP_COMPLETE, "operator": "Exists"})
    return [{"matchExpressions": expressions}]


def node_affinity(group: NodeGroup, *, require_setup_complete: bool) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": node_selector_terms(group, require_setup_complete=require_setup_complete)
            }
        }
    }


def tolerations(group: NodeGroup) -> list[dict[str, Any]]:
    """Tolerate the GPU taint always (nodes may carry it even if this stack does not set it) and the group's taints."""
    out: list[dict[str, Any]] = [
        {"key": labels.GPU_TAINT_KEY, "operator": "Exists", "effect": labels.GPU_TAINT_EFFECT}
    ]
    for taint in desired_node_taints(group):
        if taint.key == labels.GPU_TAINT_KEY and taint.effect == labels.GPU_TAINT_EFFECT:
            continue
        if taint.value:
            out.append({"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect})
        else:
            out.append({"key": taint.key, "operator": "Exists", "effect": taint.effect})
    return out
