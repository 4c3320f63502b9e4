"""Node label, taint and annotation names shared by the components, the policies and the agent.

They follow Deckhouse's GPU flow and NVIDIA's GPU feature discovery / mig-manager so that existing
dashboards, selectors and runbooks keep working.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Deckhouse flow
GPU_NODE = "node.deckhouse.io/gpu"  #: "" on every GPU node of a group
DEVICE_GPU_CONFIG = "node.deckhouse.io/device-gpu.config"  #: Exclusive | TimeSlicing | MPS | MIG
GPU_SETUP_COMPLETE = "node.deckhouse.io/gpu-setup-complete"  #: set by node setup once the node is ready
#: ``true`` on a node of a DRA group once its setup completed, VFIO included (its GPUs may be bound to vfio-pci
#: for VMs); also set by ``vfio prepare --patch-node``.
GPU_VFIO_READY = "node.deckhouse.io/gpu-vfio-ready"
#: Deckhouse's label of a node's NodeGroup: what ``nodeGroups[].nodeGroup`` selects by.
DECKHOUSE_NODE_GROUP = "node.deckhouse.io/group"
#: Annotation (Deckhouse's disruption handshake): Deckhouse approves the disruption a node asked for
#: (``disruption-required``); the MIG manager and the driver upgrade remove it when they are done.
DISRUPTION_APPROVED = "update.node.deckhouse.io/disruption-approved"
#: Annotation: the node asks Deckhouse for a disruption (a MIG mode change, a driver replacement).
DISRUPTION_REQUIRED = "update.node.deckhouse.io/disruption-required"
#: Annotation: the node asks Deckhouse to drain it (Deckhouse sets ``drained`` when it has).
DRAINING = "update.node.deckhouse.io/draining"
#: Annotation: Deckhouse has drained the node.
DRAINED = "update.node.deckhouse.io/drained"

# This project's own labels
NODE_GROUP = "gpu.nvidia-gpu.io/node-group"  #: the stack's node group a node belongs to
#: On a stack's Namespace: ``<project>/<stack>`` of the Pulumi stack it belongs to, so a second stack
#: given the same namespace is told apart before it applies anything (nvidia_gpu.preflight).
STACK_ANNOTATION = "gpu.nvidia-gpu.io/stack"
ALLOCATION_MODE = "gpu.nvidia-gpu.io/allocation-mode"  #: devicePlugin | dra
#: Annotations on a Node: the label keys / taints (``key:effect``) the agent's labeller set there, comma-separated,
#: so it removes only its own when the stack stops asking for them (``node_agent.labeller.nodeconfig``).
OWNED_NODE_LABELS = "gpu.nvidia-gpu.io/labeller-owned-labels"
#: Annotation on a Node: the taints (``key:effect``) the labeller set there, comma-separated (as the labels above).
OWNED_NODE_TAINTS = "gpu.nvidia-gpu.io/labeller-owned-taints"
#: Annotation: why the last MIG reconfiguration failed (set with state ``failed``, removed on success).
MIG_FAILURE_REASON = "gpu.nvidia-gpu.io/mig-failure-reason"
#: Label or annotation on an object declaring the catalogue model its node group runs (policies read it).
GPU_MODEL = "gpu.nvidia-gpu.io/gpu-model"
#: Label or annotation declaring the NVIDIA driver on a node group's nodes (checked against the model's minimum).
DRIVER_VERSION = "gpu.nvidia-gpu.io/driver-version"
#: Annotation on the stack Namespace naming the cluster's Kubernetes version (policies' fallback signal).
KUBERNETES_VERSION = "gpu.nvidia-gpu.io/kubernetes-version"

# NVIDIA
#: The mig-parted config a node's GPUs should have (the node group's; ``all-disabled`` outside MIG): what the MIG
#: manager converges the node to.
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"  #: pending | rebooting | success | failed
#: GPU feature discovery's label: whether the node's GPUs support MIG (``true`` / ``false``).
MIG_CAPABLE = "nvidia.com/mig.capable"
#: GPU feature discovery's label: the MIG strategy its labels follow (``none``, ``single``, ``mixed``).
MIG_STRATEGY = "nvidia.com/mig.strategy"
#: NVIDIA's node label naming the device plugin's config (its default ``--config-label``); the stack's device
#: plugin is given ``node.deckhouse.io/device-gpu.config`` instead.
DEVICE_PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
GPU_DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
GPU_DEPLOY_COMPONENTS = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
PAUSED_FOR_MIG_CHANGE = "paused-for-mig-change"
#: Pod labels (key, value) of the agents that hold a node's GPUs open: NVIDIA's GPU Operator operands
#: (``app``) and this project's (``app.kubernetes.io/name``). The MIG manager and the driver upgrade stop them
#: before they change the GPUs or the driver under them; any pod requesting ``nvidia.com/*`` counts too.
GPU_AGENT_POD_LABELS: tuple[tuple[str, str], ...] = (
    ("app", "nvidia-device-plugin-daemonset"),
    ("app", "gpu-feature-discovery"),
    ("app", "nvidia-dcgm-exporter"),
    ("app", "nvidia-dcgm"),
    ("app.kubernetes.io/name", "device-plugin"),
    ("app.kubernetes.io/name", "mps-control-daemon"),  # its MPS servers hold the GPUs open
    ("app.kubernetes.io/name", "gpu-labeller"),
    ("app.kubernetes.io/name", "dra-kubelet-plugin"),
    ("app.kubernetes.io/name", "gpu-exporter"),
    ("app.kubernetes.io/name", "dcgm-exporter"),
)

#: Who installs a node's driver, as NVIDIA's GPU Operator labels it: ``pre-installed`` when node setup found
#: a driver on the host itself, so no driver container runs there.
GPU_DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
DRIVER_PREINSTALLED = "pre-installed"
#: Where a node is in a driver upgrade (NVIDIA's GPU Operator's key and values; node_agent.driverupgrade).
DRIVER_UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
#: Why a node's driver upgrade failed (the upgrade controller writes it; the GPU inventory shows it).
DRIVER_UPGRADE_FAILURE = "gpu.nvidia-gpu.io/driver-upgrade-failure"

# Node Feature Discovery's names for the OS and kernel, which node setup publishes itself (no NFD needed):
# a driver container is chosen by them (NVIDIA's driver images are per OS release, per kernel if precompiled).
#: The node's OS (``ID`` of /etc/os-release, NFD's name), published by node setup: driver containers select by it.
OS_RELEASE_ID = "feature.node.kubernetes.io/system-os_release.ID"
#: The node's OS release (``VERSION_ID`` of /etc/os-release, NFD's name), published by node setup.
OS_RELEASE_VERSION_ID = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
#: The node's kernel (``uname -r``, NFD's name), published by node setup: precompiled driver containers select by it.
KERNEL_VERSION_FULL = "feature.node.kubernetes.io/kernel-version.full"
OS_LABELS = (OS_RELEASE_ID, OS_RELEASE_VERSION_ID, KERNEL_VERSION_FULL)

# Taints
#: The GPU taint (``nvidia.com/gpu=present:NoSchedule``) on a node group's nodes unless ``gpuTaint`` is off: only
#: pods that tolerate it (GPU workloads, the agents) land there.
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "present"
GPU_TAINT_EFFECT = "NoSchedule"
#: The MIG manager's taint (``mig-reconfigure=true:NoSchedule``) while it reconfigures a node's GPUs.
MIG_RECONFIGURE_TAINT_KEY = "mig-reconfigure"

#: The verdict of the node's last ``check`` (``ok`` or ``unusable``; absent on a node without a GPU): written by
#: node setup and its monitor, and by ``gpu-check.sh`` on Deckhouse
#: (``kubectl get nodes -L gpu.nvidia-gpu.io/check,gpu.nvidia-gpu.io/check-reasons``).
NODE_CHECK = "gpu.nvidia-gpu.io/check"
#: The reason codes of an unusable verdict, ``.``-joined (as many as fit in a label value).
NODE_CHECK_REASONS = "gpu.nvidia-gpu.io/check-reasons"
#: A label value's limit: the reasons that do not fit are left off (the metrics and the inventory list all).
_LABEL_VALUE_MAX = 63


def check_labels(verdict: str, reasons: Iterable[str]) -> dict[str, str | None]:
    """The check labels for a verdict (``no-gpu``: none, removed) and its reason codes."""
    if verdict == "no-gpu":
        return {NODE_CHECK: None, NODE_CHECK_REASONS: None}
    joined = ".".join(sorted(set(reasons)))
    while len(joined) > _LABEL_VALUE_MAX:
        joined = joined.rsplit(".", 1)[0]
    return {NODE_CHECK: verdict, NODE_CHECK_REASONS: joined or None}


#: Label keys the stack's own agents write on GPU nodes (the labeller, node setup, the MIG manager, on
#: Deckhouse the node template): every agent is scheduled by the group's node selector, so a selector
#: on one of them never matches a node the agents have not reached yet.
AGENT_LABEL_PREFIXES = ("nvidia.com/", "gpu.nvidia-gpu.io/")
AGENT_LABEL_KEYS = (GPU_NODE, DEVICE_GPU_CONFIG, GPU_SETUP_COMPLETE, GPU_VFIO_READY, *OS_LABELS)


def written_by_agents(key: str) -> bool:
    """Is ``key`` a node label this stack's agents set (so it cannot be what selects the nodes)?"""
    return key in AGENT_LABEL_KEYS or key.startswith(AGENT_LABEL_PREFIXES)


# Feature files
NFD_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


# What each node agent may write on its own Node


@dataclass(frozen=True)
class KeySet:
    """Label, annotation or taint keys: the exact ``keys``, and every key under ``prefixes`` except
    ``except_keys`` and the keys under ``except_prefixes``."""

    keys: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    except_keys: tuple[str, ...] = ()
    except_prefixes: tuple[str, ...] = ()

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if key in self.keys:
            return True
        return (key.startswith(self.prefixes) and key not in self.except_keys
                and not key.startswith(self.except_prefixes))


@dataclass(frozen=True)
class NodeWrites:
    """What one node agent's role changes on its own Node, and nothing more: the stack's admission policy
    (``nvidia_gpu.components.manifests.confinement``) refuses the rest with the agent's own token. ``set_*``
    may be added, changed and removed; ``remove_*`` only removed (what another agent put there and this one
    withdraws). One list per agent, not one shared domain: a labeller may not approve a disruption, and no
    node agent may write the driver upgrade's state, which the upgrade controller trusts."""

    set_labels: tuple[KeySet, ...] = ()
    remove_labels: tuple[KeySet, ...] = ()
    set_annotations: tuple[KeySet, ...] = ()
    remove_annotations: tuple[KeySet, ...] = ()
    set_taints: tuple[KeySet, ...] = ()
    #: The node groups' own taint keys (the GPU taint and their extra taints, which only the stack knows):
    #: ``set`` (the labeller applies them), ``remove`` (teardown withdraws them) or ``""``.
    group_taints: str = ""
    #: ``spec.unschedulable`` (cordon and uncordon).
    cordon: bool = False

    def may_set_label(self, key: str) -> bool:
        return any(key in s for s in self.set_labels)

    def may_remove_label(self, key: str) -> bool:
        return self.may_set_label(key) or any(key in s for s in self.remove_labels)

    def may_set_annotation(self, key: str) -> bool:
        return any(key in s for s in self.set_annotations)

    def may_remove_annotation(self, key: str) -> bool:
        return self.may_set_annotation(key) or any(key in s for s in self.remove_annotations)

    def may_set_taint(self, key: str) -> bool:
        """One of its own taint keys (the node groups' taints, which only the stack names, are not listed)."""
        return any(key in s for s in self.set_taints)


#: The driver upgrade's state on a Node (its controller's, never a node agent's).
DRIVER_UPGRADE_KEYS = KeySet(keys=(DRIVER_UPGRADE_STATE, DRIVER_UPGRADE_FAILURE),
                             prefixes=("nvidia.com/gpu-driver-upgrade", "gpu.nvidia-gpu.io/driver-upgrade"))
#: The node group's labels (:func:`nvgpu.nodelabels.desired_node_labels`).
GROUP_LABELS = KeySet(keys=(GPU_NODE, DEVICE_GPU_CONFIG, MIG_CONFIG, NODE_GROUP))
#: GPU feature discovery's labels: NVIDIA's domain, but for the keys other writers own there (the MIG
#: manager's state and the components it pauses, node setup's driver placement, the driver upgrade's state).
GFD_LABELS = KeySet(prefixes=("nvidia.com/",),
                    except_keys=(MIG_CONFIG_STATE, GPU_DEPLOY_DRIVER, *DRIVER_UPGRADE_KEYS.keys),
                    except_prefixes=(GPU_DEPLOY_PREFIX, *DRIVER_UPGRADE_KEYS.prefixes))
#: The labeller's ownership records (which group labels and taints it set).
LABELLER_ANNOTATIONS = KeySet(keys=(OWNED_NODE_LABELS, OWNED_NODE_TAINTS))

LABELLER_WRITES = NodeWrites(set_labels=(GROUP_LABELS, GFD_LABELS), set_annotations=(LABELLER_ANNOTATIONS,),
                             group_taints="set")
#: Node setup (and its monitor and teardown): the gate, VFIO, the check verdict, the OS and kernel labels and
#: the pre-installed driver; teardown withdraws what the labeller put on (its labels, records and taints).
NODE_SETUP_WRITES = NodeWrites(
    set_labels=(KeySet(keys=(GPU_SETUP_COMPLETE, GPU_VFIO_READY, GPU_DEPLOY_DRIVER, NODE_CHECK, NODE_CHECK_REASONS,
                             *OS_LABELS)),),
    remove_labels=(GROUP_LABELS, GFD_LABELS), remove_annotations=(LABELLER_ANNOTATIONS,), group_taints="remove")
#: The MIG manager: its state, the components it pauses, its failure reason, Deckhouse's handshake as far as
#: a node asks for it (it requests a disruption and a drain, and clears the handshake when done, but never
#: approves one or says a drain is done), its own taint, cordon; it clears the group's MIG config when the
#: node has left MIG.
MIG_MANAGER_WRITES = NodeWrites(
    set_labels=(KeySet(keys=(MIG_CONFIG_STATE, *(GPU_DEPLOY_PREFIX + c for c in GPU_DEPLOY_COMPONENTS))),),
    remove_labels=(KeySet(keys=(MIG_CONFIG,)),),
    set_annotations=(KeySet(keys=(MIG_FAILURE_REASON, DISRUPTION_REQUIRED, DRAINING)),),
    remove_annotations=(KeySet(keys=(DISRUPTION_APPROVED, DRAINED)),),
    set_taints=(KeySet(keys=(MIG_RECONFIGURE_TAINT_KEY,)),), cordon=True)
