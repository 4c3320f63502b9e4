"""The GPU inventory CustomResourceDefinition (``gpus.gpu.nvidia-gpu.io``, see :mod:`nvgpu.inventory`).

Cluster-scoped like the Nodes its objects belong to (an ownerReference to the Node: deleting the Node
deletes its GPUs, through the garbage collector, with no finalizer that could get stuck on
``pulumi destroy``). ``spec`` is the GPU's identity (node and NVML index), ``status`` what the node's
labeller last saw, written through the status subresource only when it changed.
"""

from __future__ import annotations

from typing import Any

from nvgpu import inventory
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import shared_labels

COMPONENT = "gpu-inventory"


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _integer(description: str, minimum: int = 0) -> dict[str, Any]:
    return {"type": "integer", "format": "int64", "minimum": minimum, "description": description}


_TIME = {"type": "string", "format": "date-time"}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One physical NVIDIA GPU of a node, as the node's agent last saw it.",
    "required": ["spec"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["node", "index"],
            "properties": {
                "node": _string("The Node the GPU is in.", maxLength=253),
                "index": _integer("NVML's index of the GPU on its node (PCI bus order)."),
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "uuid": _string("NVML's GPU UUID.", pattern="^GPU-[0-9a-fA-F-]+$"),
                "pciBusID": _string("PCI bus ID, as sysfs writes it (0000:07:00.0)."),
                "productName": _string("The name NVML reports (NVIDIA H100 80GB HBM3)."),
                "model": _string("The GPU catalogue's key (H100-80GB); empty for a GPU the catalogue lacks."),
                "architecture": _string("NVML's architecture name (hopper, ampere, ...)."),
                "memoryMiB": _integer("Framebuffer memory, MiB."),
                "computeCapability": _string("CUDA compute capability (9.0).", pattern="^[0-9]+\\.[0-9]+$"),
                "driverVersion": _string("The NVIDIA driver's version."),
                "cudaVersion": _string("The CUDA driver API version the driver provides (12.4)."),
                "kernelModules": _string("The driver's kernel modules loaded on the node.",
                                         enum=["open", "proprietary"]),
                "nodeCheck": {
                    "type": "object",
                    "description": "Node setup's last check of the GPU's node (its check labels).",
                    "properties": {
                        "verdict": _string("ok, or unusable.", enum=["ok", "unusable"]),
                        "reasons": {"type": "array", "items": {"type": "string"},
                                    "description": "Why the node is unusable (driver-mismatch, toolkit-missing, ...)."},
                    },
                },
                "driverUpgrade": {
                    "type": "object",
                    "description": "The node's driver upgrade, while the stack's upgrade controller rolls one.",
                    "properties": {
                        "state": _string("The node's nvidia.com/gpu-driver-upgrade-state."),
                        "reason": _string("Why the upgrade failed (upgrade-failed)."),
                    },
                },
                "sharing": _string("The node group's sharing mode.", enum=["Exclusive", "TimeSlicing", "MPS", "MIG"]),
                "allocationMode": _string("How workloads get the GPU.", enum=["devicePlugin", "dra"]),
                "mig": {
                    "type": "object",
                    "properties": {
                        "mode": _string("MIG mode now.", enum=["Enabled", "Disabled", "Unsupported"]),
                        "pendingMode": _string("MIG mode after the next GPU reset, when it differs.",
                                               enum=["Enabled", "Disabled"]),
                        "instances": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["profile", "gpuInstance", "computeInstance"],
                                "properties": {
                                    "profile": _string("The MIG profile (1g.10gb)."),
                                    "gpuInstance": _integer("GPU instance ID."),
                                    "computeInstance": _integer("Compute instance ID."),
                                    "uuid": _string("The MIG device's UUID."),
                                    "memoryMiB": _integer("Memory of the instance, MiB."),
                                },
                            },
                        },
                    },
                },
                "unreadable": {
                    "type": "array", "items": {"type": "string"},
                    "description": "What NVML refused to tell about the GPU, and why (a GPU in MIG mode read "
                                   "without the MIG monitor capability: its memory and MIG devices).",
                },
                "exposedAs": {
                    "type": "array",
                    "description": "What workloads ask for to get (a share of) this GPU.",
                    "items": {
                        "type": "object",
                        "required": ["name", "count"],
                        "properties": {
                            "name": _string("An extended resource (nvidia.com/gpu, nvidia.com/mig-1g.10gb) or a "
                                            "DRA device (<DeviceClass>/<device>)."),
                            "count": _integer("Units of it on this GPU.", minimum=1),
                        },
                    },
                },
                "health": {
                    "type": "object",
                    "required": ["state"],
                    "properties": {
                        "state": _string("Healthy or not.", enum=["Healthy", "Unhealthy"]),
                        "reason": _string("Why not, as NVML says it."),
                        "since": {**_TIME, "description": "When the state last changed."},
                        "lastXID": _integer("The last XID error reported for the GPU."),
                        "lastXIDTime": {**_TIME, "description": "When the last XID error was reported."},
                        "needs": _string("What NVML says the GPU needs before it may take work again (its "
                                         "recovery action, a pending row remap or page retirement, a failed "
                                         "row remap).", enum=list(inventory.RECOVERY_NEEDS)),
                    },
                },
            },
        },
    },
}

#: ``kubectl get gpus`` (priority 0) and ``-o wide`` (priority 1).
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
    {"name": "Index", "type": "integer", "jsonPath": ".spec.index"},
    {"name": "Model", "type": "string", "jsonPath": ".status.productName"},
    {"name": "Memory(MiB)", "type": "integer", "jsonPath": ".status.memoryMiB"},
    {"name": "MIG", "type": "string", "jsonPath": ".status.mig.mode"},
    {"name": "Health", "type": "string", "jsonPath": ".status.health.state"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "UUID", "type": "string", "jsonPath": ".status.uuid", "priority": 1},
    {"name": "Driver", "type": "string", "jsonPath": ".status.driverVersion", "priority": 1},
    {"name": "Modules", "type": "string", "jsonPath": ".status.kernelModules", "priority": 1},
    {"name": "Upgrade", "type": "string", "jsonPath": ".status.driverUpgrade.state", "priority": 1},
    {"name": "Check", "type": "string", "jsonPath": ".status.nodeCheck.verdict", "priority": 1},
    {"name": "Sharing", "type": "string", "jsonPath": ".status.sharing", "priority": 1},
    {"name": "Allocation", "type": "string", "jsonPath": ".status.allocationMode", "priority": 1},
    {"name": "Reason", "type": "string", "jsonPath": ".status.health.reason", "priority": 1},
    {"name": "Last-XID", "type": "integer", "jsonPath": ".status.health.lastXID", "priority": 1},
    {"name": "Needs", "type": "string", "jsonPath": ".status.health.needs", "priority": 1},
]


def crd() -> Manifest:
    """Shared by every stack on the cluster (see :mod:`nvidia_gpu.components.manifests.shared`)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": inventory.CRD_NAME, "labels": shared_labels(COMPONENT)},
        "spec": {
            "group": inventory.GROUP,
            "scope": "Cluster",
            "names": {"plural": inventory.PLURAL, "singular": "gpu", "kind": inventory.KIND, "listKind": "GPUList",
                      "categories": ["nvidia-gpu"]},
            "versions": [{
                "name": inventory.VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": SCHEMA},
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
            }],
        },
    }
