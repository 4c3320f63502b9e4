"""The GPU inventory API: one cluster-scoped ``GPU`` object per physical GPU, in both allocation modes.

Shared by the stack (which emits the CustomResourceDefinition and the writer's RBAC and admission rule)
and the node agent (whose labeller keeps each node's objects current), so the group, names and labels
are spelled once. ``kubectl get gpus -o wide`` lists every GPU of the cluster with its node, model,
memory, MIG mode and health; Deckhouse keeps such objects only in DRA mode, NVIDIA has none.
"""

from __future__ import annotations

GROUP = "gpu.nvidia-gpu.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPU"
PLURAL = "gpus"
CRD_NAME = f"{PLURAL}.{GROUP}"
#: Label on every GPU object naming its node: the writer lists its own node's objects by it.
NODE_LABEL = f"{GROUP}/node"
#: The manager name of the agent's writes (server-side field ownership).
FIELD_MANAGER = "nvidia-gpu-inventory"

#: What a GPU's object says it needs before it may take work again (``status.health.needs``), most drastic
#: first: NVML's recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``), a pending row remap or page
#: retirement (a reset), a failed row remap (NVIDIA's RMA policy: a replacement).
RECOVERY_NEEDS: tuple[str, ...] = ("replacement", "reboot", "drain-and-reset", "reset", "recover-imex-domain",
                                   "drain-p2p")


def object_name(node: str, index: int) -> str:
    """``<node>-gpu<index>``: NVML's index is stable for a GPU on one node (PCI bus order) and survives the
    GPU being lost, so the object that turns unhealthy is the one that was healthy."""
    return f"{node}-gpu{index}"


def collection_path() -> str:
    return f"/apis/{API_VERSION}/{PLURAL}"


def object_path(name: str) -> str:
    return f"{collection_path()}/{name}"
