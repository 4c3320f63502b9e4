"""Deckhouse objects of one node group: the NodeGroup node template patch and the NodeGroupConfiguration scripts.

The node template is how Deckhouse keeps labels and taints on every node of a NodeGroup (including
nodes that join later), so the Deckhouse-flow labels and the GPU taint go there instead of being
patched onto Nodes. It is applied as a server-side-apply patch under a stable field manager that only
owns the ``spec.nodeTemplate`` fields this stack sets, and is removed with the group or the stack
(Deckhouse then takes the labels and taints off the nodes); ``taints`` is an atomic list in the CRD, so
every taint of the group is declared here (``extraTaints``). The scripts run through bashible in
``weight`` order on the group's nodes.
"""

from __future__ import annotations

from typing import Any

from nvgpu.nodelabels import desired_node_labels, desired_node_taints
from nvgpu.nodescripts import NodeScript
from nvgpu.stackconfig import GroupPlan, NodeGroup
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels

NODE_GROUP_API = "deckhouse.io/v1"
NGC_API = "deckhouse.io/v1alpha1"
def field_manager(namespace: str) -> str:
    """The server-side-apply field manager of this stack's NodeGroup patches: stable (the provider's
    default is random per resource) and per stack, so ownership reads as ours in ``managedFields`` and
    survives a state rebuild."""
    return f"nvidia-gpu.{namespace}"


def node_group_patch(group: NodeGroup, plan: GroupPlan, namespace: str) -> Manifest:
    """Our labels (a map: only our keys are ours) and the group's taints (an atomic list in the CRD: the
    whole list is ours, so the stack refuses at preview a NodeGroup whose taints it does not declare,
    see ``nvidia_gpu.components.node_group``). Not forced: a conflict with another manager fails, naming it.
    ``plan``: what the stack decided for the group (its ``nvidia.com/mig.config``)."""
    assert group.node_group is not None, "the deckhouse backend requires nodeGroup (checked by the stack config)"
    return {
        "apiVersion": NODE_GROUP_API,
        "kind": "NodeGroup",
        "metadata": {"name": group.node_group,
                     "annotations": {"pulumi.com/patchFieldManager": field_manager(namespace)}},
        "spec": {
            "nodeTemplate": {
                "labels": desired_node_labels(group, plan),
                "taints": [t.as_dict() for t in desired_node_taints(group)],
            }
        },
    }


def released_container_claims(managed_fields: list[dict[str, Any]], manager: str) -> list[dict[str, Any]] | None:
    """``managed_fields`` without other managers' claims on ``spec.nodeTemplate`` and its ``labels`` map
    themselves (their keys stay theirs), or None when there are none.

    Why: a manager whose update *created* one of these containers (``kubectl patch`` adding the first
    label, ``kubectl create`` with a node template) keeps a claim on the container itself (``"."``, or a
    bare ``"f:labels": {}`` once its own keys are gone). On ``destroy`` the provider relinquishes our
    fields by applying an empty patch under our field manager; the API server removes our keys but keeps
    the container another manager claims, and an emptied map comes out of the removal as ``null``
    (structured-merge-diff's ``removingWalker``), which the NodeGroup schema refuses (``spec.nodeTemplate.
    labels: Invalid value: "null": ... must be of type object``) on every retry. Without those claims the
    emptied container is removed with our keys, and everything another manager set (its labels, its
    keys' ownership) stays. The release changes no value of the object, only who claims two containers
    (``spec`` itself always holds the group's ``nodeType``, so it is never emptied).
    """
    out: list[dict[str, Any]] = []
    changed = False
    for entry in managed_fields:
        fields = entry.get("fieldsV1")
        spec = fields.get("f:spec") if isinstance(fields, dict) else None
        template = spec.get("f:nodeTemplate") if isinstance(spec, dict) else None
        if entry.get("manager") == manager or not isinstance(template, dict):
            out.append(entry)
            continue
        assert isinstance(fields, dict) and isinstance(spec, dict)  # narrowed above, for mypy
        new_template = _without_claim(template, "f:labels")
        if template and new_template == template:  # an empty node is a bare claim on nodeTemplate itself
            out.append(entry)
            continue
        changed = True
        new_spec = {k: v for k, v in spec.items() if k != "f:nodeTemplate"}
        if new_template:
            new_spec["f:nodeTemplate"] = new_template
        new_fields = {k: v for k, v in fields.items() if k != "f:spec"}
        if new_spec:
            new_fields["f:spec"] = new_spec
        if new_fields:
            out.append({**entry, "fieldsV1": new_fields})
        # else: the entry claimed nothing but the containers, and goes (the server drops empty entries too)
    return out if changed else None


def _without_claim(container: dict[str, Any], child: str) -> dict[str, Any]:
    """``container`` (a ``fieldsV1`` node) without its own ``"."`` claim, and ``child`` likewise; a child
    left empty (a bare claim on it, no keys inside) goes."""
    out = {k: v for k, v in container.items() if k != "."}
    inner = out.get(child)
    if isinstance(inner, dict):
        inner = {k: v for k, v in inner.items() if k != "."}
        if inner:
            out[child] = inner
        else:
            del out[child]
    return out


class NodeTemplateConflict(Exception):
    """The NodeGroup's node template has taints another manager owns that this stack does not declare."""


def check_node_template(group: NodeGroup, metadata: dict[str, Any] | None, spec: dict[str, Any] | None,
                        ours: list[dict[str, str]], manager: str) -> bool:
    """Refuse (at preview) a node template whose taints list another manager holds.

    ``metadata``/``spec`` are the live NodeGroup's (None under the offline preview, which has no
    cluster). The taints list is atomic: applying ours would drop taints the stack does not declare, and
    even when it declares them all (``extraTaints``), the apply conflicts with the other manager's
    ownership of the list halfway through ``up``. So the list must be the stack's or nobody's: the
    message names the taints, who holds them and how to hand the list over (remove it; the stack then
    applies its own, extraTaints included). Taking it over by force is not offered: it would silently
    overrule an operator's or a GitOps tool's later writes.
    """
    if not spec:
        return True
    live = (spec.get("nodeTemplate") or {}).get("taints") or []
    owners = [m.get("manager", "?") for m in (metadata or {}).get("managedFields") or []
              if "f:taints" in (((m.get("fieldsV1") or {}).get("f:spec") or {}).get("f:nodeTemplate") or {})]
    others = sorted({o for o in owners if o != manager})
    if not others or not live:
        return True  # the list is ours already, or nobody's
    declared = {(t.get("key"), t.get("value"), t.get("effect")) for t in ours}
    foreign = [t for t in live if (t.get("key"), t.get("value"), t.get("effect")) not in declared]
    hand_over = (f"kubectl patch nodegroups.deckhouse.io {group.node_group} --type=json -p "
                 "'[{\"op\":\"remove\",\"path\":\"/spec/nodeTemplate/taints\"}]'")
    if foreign:
        shown = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in foreign)
        raise NodeTemplateConflict(
            f"nodeGroups[{group.name}]: Deckhouse NodeGroup {group.node_group!r} has taints this stack does not "
            f"declare: {shown} (the list is managed by {', '.join(others)}). spec.nodeTemplate.taints is an "
            "atomic list, so applying the stack's taints would remove them. To keep them, add them to the "
            f"group's extraTaints and hand the list to the stack: {hand_over} (the stack's up then applies "
            "them with its own); or remove them from the NodeGroup")
    raise NodeTemplateConflict(
        f"nodeGroups[{group.name}]: Deckhouse NodeGroup {group.node_group!r}: spec.nodeTemplate.taints is managed "
        f"by {', '.join(others)}, so the stack's apply of the same list would conflict halfway through up. "
        f"Hand the list to the stack: {hand_over} (the stack's up then applies the taints it declares)")


def ngc_name(namespace_name: str, group: NodeGroup, script: NodeScript) -> str:
    """Cluster-scoped and ending in ``.sh`` like Deckhouse's own steps; unique per stack and group."""
    return f"{namespace_name}-{group.name}-{script.name}"


def node_group_configuration(namespace_name: str, group: NodeGroup, script: NodeScript) -> Manifest:
    assert group.node_group is not None, "the deckhouse backend requires nodeGroup (checked by the stack config)"
    return {
        "apiVersion": NGC_API,
        "kind": "NodeGroupConfiguration",
        "metadata": {
            "name": ngc_name(namespace_name, group, script),
            "labels": app_labels("node-setup", group.name, node_group=group.name),
        },
        "spec": {
            "weight": script.weight,
            "nodeGroups": [group.node_group],
            "bundles": ["*"],
            "content": script.content,
        },
    }
