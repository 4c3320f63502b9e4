"""The node labels and taints a node group's nodes must carry, computed once for every path that sets them.

On Deckhouse they travel through the NodeGroup's ``spec.nodeTemplate`` (set by the components); on any
other cluster the agent's labeller applies them. Both read this module so the two paths cannot drift.
The values follow Deckhouse's GPU hook: ``node.deckhouse.io/gpu=""``, ``node.deckhouse.io/device-gpu.config``
naming the sharing mode, and ``nvidia.com/mig.config`` naming a mig-parted config (``all-disabled`` when
the group does not use MIG, so a stale MIG layout is torn down).
"""

from __future__ import annotations

from nvgpu import labels
from nvgpu.migparted import custom_config_name
from nvgpu.stackconfig import GroupPlan, Mig, NodeGroup
from nvgpu.taints import NodeTaint

__all__ = ["NodeTaint", "custom_mig_config_name", "desired_node_labels", "desired_node_taints"]


def custom_mig_config_name(group_name: str, mig: Mig) -> str:
    """``custom-<group>-<8 hex>``, Deckhouse's name for a custom layout (:func:`nvgpu.migparted.custom_config_name`)."""
    return custom_config_name(group_name, mig.custom_layouts)


def desired_node_labels(group: NodeGroup, plan: GroupPlan) -> dict[str, str]:
    """Labels every node of the group carries (the Deckhouse flow plus this project's group label).

    ``nvidia.com/mig.config`` is the plan's (:attr:`~nvgpu.stackconfig.GroupPlan.mig_config_name`), the name
    the stack config's own MIG check and the mig-parted ConfigMap use.
    """
    return {
        labels.GPU_NODE: "",
        labels.DEVICE_GPU_CONFIG: group.gpu.sharing.value,
        labels.MIG_CONFIG: plan.mig_config_name,
        labels.NODE_GROUP: group.name,
    }


def desired_node_taints(group: NodeGroup) -> tuple[NodeTaint, ...]:
    """The GPU taint (unless turned off) followed by the group's extra taints, without duplicates."""
    out: list[NodeTaint] = []
    if group.gpu_taint:
        out.append(NodeTaint(labels.GPU_TAINT_KEY, labels.GPU_TAINT_VALUE, labels.GPU_TAINT_EFFECT))
    for t in group.extra_taints:
        taint = NodeTaint(t.key, t.value, t.effect)
        if all((x.key, x.effect) != (taint.key, taint.effect) for x in out):
            out.append(taint)
    return tuple(out)
