"""Deckhouse objects of one node group: the NodeGroup node template patch and the NodeGroupConfiguration scripts.

The node template is how Deckhouse keeps labels and taints on every node of a NodeGroup (including
nodes that join later), so the Deckhouse-flow labels and the GPU taint go there instead of being
patched onto Nodes. It is applied as a server-side-apply patch that only owns ``spec.nodeTemplate``
fields this stack sets; ``taints`` is an atomic list in the CRD, so declare every taint of the group
here (``extraTaints``). The scripts run through bashible in ``weight`` order on the group's nodes.
"""

from __future__ import annotations

from components.manifests import Manifest
from components.manifests.meta import app_labels
from nvgpu.nodelabels import desired_node_labels, desired_node_taints
from nvgpu.nodescripts import NodeScript
from nvgpu.stackconfig import NodeGroup

NODE_GROUP_API = "deckhouse.io/v1"
NGC_API = "deckhouse.io/v1alpha1"
#: SSA patches of a NodeGroup another controller (or a person) also edits must win on our fields.
PATCH_FORCE = {"pulumi.com/patchForce": "true"}


def node_group_patch(group: NodeGroup) -> Manifest:
    assert group.node_group is not None, "the deckhouse backend requires nodeGroup (checked by the stack config)"
    return {
        "apiVersion": NODE_GROUP_API,
        "kind": "NodeGroup",
        "metadata": {"name": group.node_group, "annotations": dict(PATCH_FORCE)},
        "spec": {
            "nodeTemplate": {
                "labels": desired_node_labels(group),
                "taints": [t.as_dict() for t in desired_node_taints(group)],
            }
        },
    }


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
