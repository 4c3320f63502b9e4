"""What the driver can hand out: the node's GPUs, MIG devices and VFIO-bound GPUs as allocatable devices.

An :class:`Inventory` is a snapshot of the hardware (from NVML and sysfs, or a test builder); this module
turns it into :class:`Allocatable` devices with NVIDIA-compatible names, attributes and capacities, so
claims and DeviceClasses written for NVIDIA's DRA driver (``gpu.nvidia.com``) select the same devices.

Decisions:
- A GPU with MIG mode enabled is offered only through its MIG devices, never as a whole GPU as well
  (NVIDIA's driver advertises both, its issue #719, which lets the scheduler hand out the same silicon
  twice).
- Versions are published as semver (``550.67`` becomes ``550.67.0``, ``580.95.05`` becomes ``580.95.5``),
  because a ``version`` attribute must be semver 2.0.0.
- Unhealthy devices are withdrawn by default, or kept and tainted when the cluster has DRADeviceTaints.
- Every device with ``memory`` capacity (whole GPUs, MIG devices) also carries ``memory`` as an int
  attribute in MiB (:func:`memory_attribute`), which NVIDIA's driver does not publish (it has memory only as
  capacity): claims that select ``device.attributes['gpu.nvidia.com'].memory >= 16000``, as guides write
  them, then allocate, beside the capacity form ``device.capacity[...].memory.compareTo(quantity('16Gi'))``.
  VFIO devices get none: their capacity is ``addressableMemory`` (NVIDIA's name), and the attribute
  exists exactly where the ``memory`` capacity does, so the two never disagree.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

#: A ResourceSlice device may carry at most 32 attributes and capacities together.
MAX_ATTRIBUTES_AND_CAPACITIES = 32
#: The standard attribute domain of Kubernetes (deviceattribute package).
STANDARD_DOMAIN = "resource.kubernetes.io"

#: One numeric part, ``fullmatch``ed: ASCII digits only (``\d`` and ``$`` also took non-ASCII digits and ``5\n``).
_SEMVER_PART = re.compile(r"[0-9]{1,9}")


class DeviceKind(StrEnum):
    GPU = "gpu"
    MIG = "mig"
    VFIO = "vfio"


class HealthAction(StrEnum):
    """What to do with an unhealthy device: drop it from the slices, or publish it with a taint."""

    WITHDRAW = "withdraw"
    TAINT = "taint"


@dataclass(frozen=True)
class GpuInfo:
    """A physical GPU bound to the nvidia driver."""

    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    pci_bus_id: str
    mig_enabled: bool = False
    #: The PCIe root complex (``pci0000:00``) when sysfs tells it: ``resource.kubernetes.io/pcieRoot``, what
    #: ``matchAttribute`` constraints align GPUs and NICs on.
    pcie_root: str | None = None
    #: Empty when healthy; otherwise a short reason key such as ``gpu-lost`` or ``xid``.
    unhealthy: str = ""
    #: The XID that made it unhealthy, when one did.
    xid: int | None = None


@dataclass(frozen=True)
class MigInfo:
    """A MIG device (a GPU instance with its full compute instance) on a MIG-enabled GPU."""

    parent_uuid: str
    parent_minor: int
    uuid: str
    profile: str  #: nvidia-smi name, e.g. ``1g.10gb`` or ``1g.10gb+me``
    profile_id: int  #: the profile ID ``nvidia-smi mig -lgip`` prints
    placement_start: int
    placement_size: int
    memory_bytes: int
    multiprocessors: int
    gi_id: int
    ci_id: int
    #: ``/dev/nvidia-caps/nvidia-cap<N>`` nodes granting access to this GPU and compute instance.
    cap_device_nodes: tuple[str, ...] = ()
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0
    unhealthy: str = ""


@dataclass(frozen=True)
class VfioInfo:
    """A GPU bound to ``vfio-pci`` for passthrough (no NVML view of it)."""

    index: int
    pci_bus_id: str
    iommu_group: int
    device_id: int
    vendor_id: int
    product_name: str
    memory_bytes: int
    uuid: str
    numa_node: int = -1
    iommufd: bool = False
    unhealthy: str = ""


@dataclass(frozen=True)
class Inventory:
    """One snapshot of what the node has."""

    driver_version: str
    cuda_driver_version: str
    gpus: tuple[GpuInfo, ...] = ()
    migs: tuple[MigInfo, ...] = ()
    vfio: tuple[VfioInfo, ...] = ()


class InventorySource(Protocol):
    """Where inventories come from (the NVML adapter in production, builders in tests)."""

    def snapshot(self) -> Inventory: ...

    def wait_change(self, timeout_s: float, stop: threading.Event) -> bool:
        """Sleep up to ``timeout_s`` or until ``stop``; True when woken early by something the next snapshot
        shows (NVML's XID events), so the inventory loop polls only for what has no event."""
        ...


AttrType = Literal["string", "int", "bool", "version"]


@dataclass(frozen=True)
class Attribute:
    """A typed DeviceAttribute: exactly one of string, int, bool or version."""

    type: AttrType
    value: str | int | bool

    def to_api(self) -> dict[str, str | int | bool]:
        return {self.type: self.value}


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"

    def to_api(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class Allocatable:
    """One device as published in a ResourceSlice, plus what preparing it needs on the host."""

    name: str
    kind: DeviceKind
    uuid: str
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, int]
    #: Host device nodes a container needs for this device (per-device CDI edits).
    device_nodes: tuple[str, ...]
    #: The physical GPU this device lives on (itself for full GPUs); used for overlap checks.
    physical_uuid: str
    taints: tuple[DeviceTaint, ...] = ()
    healthy: bool = True
    env: tuple[str, ...] = field(default=())

    def to_api(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "attributes": {k: v.to_api() for k, v in sorted(self.attributes.items())},
            "capacity": {k: {"value": quantity(v, binary=k in BYTE_CAPACITIES)}
                         for k, v in sorted(self.capacity.items())},
        }
        if self.taints:
            out["taints"] = [t.to_api() for t in self.taints]
        return out


#: Capacities counted in bytes: written in binary suffixes, as NVIDIA's driver does (``resource.BinarySI``).
BYTE_CAPACITIES = frozenset({"memory", "addressableMemory"})
_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def quantity(value: int, *, binary: bool = False) -> str:
    """A capacity in the Kubernetes Quantity form the API server keeps for it: a byte count in the largest
    binary suffix that divides it exactly (``85899345920`` is ``80Gi``, what NVIDIA's plugin publishes and
    ``kubectl`` shows), anything else as a plain integer. Both spellings are the same quantity to the
    scheduler; the string is what users read and diff."""
    if not binary or value == 0:
        return str(value)
    suffix = ""
    for s in _BINARY_SUFFIXES:
        if value % 1024:
            break
        value //= 1024
        suffix = s
    return f"{value}{suffix}"


_QUANTITY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                   "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def quantity_value(text: str) -> int:
    """The integer an integral Kubernetes quantity stands for (``80Gi``, ``85899345920``, ``2k``): the inverse
    of :func:`quantity`, for capacities read back from the API server, which may respell them."""
    for suffix, factor in sorted(_QUANTITY_UNITS.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def semver(version: str) -> str:
    """Normalise ``550.67`` / ``580.95.05`` / ``12.4`` to semver 2.0.0 (three parts, no leading zeros)."""
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(_SEMVER_PART.fullmatch(p) for p in parts):
        raise ValueError(f"version {version!r} is not numeric MAJOR[.MINOR[.PATCH]]")
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in nums)


def mig_device_name(parent_minor: int, profile: str, profile_id: int, placement_start: int) -> str:
    """NVIDIA's (v25.12+) MIG device name: ``gpu-<minor>-mig-<profile slug>-<profileId>-<start>``."""
    slug = re.sub(r"[^a-z0-9-.]", "-", profile.lower()).replace(".", "")
    return f"gpu-{parent_minor}-mig-{slug}-{profile_id}-{placement_start}"


#: The attribute that repeats the ``memory`` capacity in MiB (an int), for attribute selectors.
MEMORY_ATTRIBUTE = "memory"


def memory_attribute(memory_bytes: int) -> Attribute:
    """``memory`` in MiB, rounded down (a selector's ``>=`` never promises more than the device has): the
    unit NVML, ``nvidia-smi`` and the ``nvidia.com/gpu.memory`` label use."""
    return Attribute("int", memory_bytes // 2**20)


def _common(inv: Inventory, *, product: str, brand: str, arch: str, cc: tuple[int, int],
            pci: str, pcie_root: str | None) -> dict[str, Attribute]:
    root = {f"{STANDARD_DOMAIN}/pcieRoot": Attribute("string", pcie_root)} if pcie_root else {}
    return root | {
        "productName": Attribute("string", product[:64]),
        "brand": Attribute("string", brand),
        "architecture": Attribute("string", arch),
        "cudaComputeCapability": Attribute("version", semver(f"{cc[0]}.{cc[1]}")),
        "driverVersion": Attribute("version", semver(inv.driver_version)),
        "cudaDriverVersion": Attribute("version", semver(inv.cuda_driver_version)),
        f"{STANDARD_DOMAIN}/pciBusID": Attribute("string", pci.lower()),
    }


def _health(reason: str, xid: int | None, driver: str, action: HealthAction) -> tuple[bool, tuple[DeviceTaint, ...]]:
    if not reason:
        return True, ()
    if action is HealthAction.WITHDRAW:
        return False, ()
    if reason == "xid" and xid is not None:
        return False, (DeviceTaint(f"{driver}/xid", str(xid)),)
    return False, (DeviceTaint(f"{driver}/{reason}"),)


def allocatable_devices(inv: Inventory, driver: str = "gpu.nvidia.com",
                        health: HealthAction = HealthAction.WITHDRAW) -> list[Allocatable]:
    """Turn a snapshot into the devices to publish, in a stable order (GPUs by minor, then MIG, then VFIO)."""
    out: list[Allocatable] = []
    parents = {g.uuid: g for g in inv.gpus}
    for g in sorted(inv.gpus, key=lambda g: g.minor):
        if g.mig_enabled:
            continue
        healthy, taints = _health(g.unhealthy, g.xid, driver, health)
        if not healthy and health is HealthAction.WITHDRAW:
            continue
        attrs = {"type": Attribute("string", DeviceKind.GPU.value), "uuid": Attribute("string", g.uuid),
                 MEMORY_ATTRIBUTE: memory_attribute(g.memory_bytes),
                 **_common(inv, product=g.product_name, brand=g.brand, arch=g.architecture, cc=g.compute_capability,
                            pci=g.pci_bus_id, pcie_root=g.pcie_root)}
        out.append(Allocatable(
            name=f"gpu-{g.minor}", kind=DeviceKind.GPU, uuid=g.uuid, attributes=attrs,
            capacity={"memory": g.memory_bytes}, device_nodes=(f"/dev/nvidia{g.minor}",),
            physical_uuid=g.uuid, taints=taints, healthy=healthy,
        ))
    for m in sorted(inv.migs, key=lambda m: (m.parent_minor, m.placement_start, m.profile_id)):
        parent = parents.get(m.parent_uuid)
        if parent is None:
            continue
        reason = parent.unhealthy or m.unhealthy
        healthy, taints = _health(reason, parent.xid, driver, health)
        if not healthy and health is HealthAction.WITHDRAW:
            continue
        attrs = {"type": Attribute("string", DeviceKind.MIG.value), "uuid": Attribute("string", m.uuid),
                 "parentUUID": Attribute("string", m.parent_uuid), "profile": Attribute("string", m.profile),
                 MEMORY_ATTRIBUTE: memory_attribute(m.memory_bytes),
                 **_common(inv, product=parent.product_name, brand=parent.brand, arch=parent.architecture,
                           cc=parent.compute_capability, pci=parent.pci_bus_id, pcie_root=parent.pcie_root)}
        capacity = {"multiprocessors": m.multiprocessors, "copyEngines": m.copy_engines, "decoders": m.decoders,
                    "encoders": m.encoders, "jpegEngines": m.jpeg_engines, "ofaEngines": m.ofa_engines,
                    "memory": m.memory_bytes}
        for i in range(m.placement_start, m.placement_start + m.placement_size):
            capacity[f"memorySlice{i}"] = 1
        out.append(Allocatable(
            name=mig_device_name(m.parent_minor, m.profile, m.profile_id, m.placement_start), kind=DeviceKind.MIG,
            uuid=m.uuid, attributes=attrs, capacity=capacity,
            device_nodes=(f"/dev/nvidia{m.parent_minor}", *m.cap_device_nodes),
            physical_uuid=m.parent_uuid, taints=taints, healthy=healthy,
        ))
    for v in sorted(inv.vfio, key=lambda v: v.index):
        healthy, taints = _health(v.unhealthy, None, driver, health)
        if not healthy and health is HealthAction.WITHDRAW:
            continue
        attrs = {
            "type": Attribute("string", DeviceKind.VFIO.value), "uuid": Attribute("string", v.uuid),
            "deviceID": Attribute("string", f"0x{v.device_id:04x}"),
            "vendorID": Attribute("string", f"0x{v.vendor_id:04x}"),
            "numa": Attribute("int", v.numa_node), "productName": Attribute("string", v.product_name[:64]),
            "iommuFDEnabled": Attribute("bool", v.iommufd),
            f"{STANDARD_DOMAIN}/pciBusID": Attribute("string", v.pci_bus_id.lower()),
        }
        out.append(Allocatable(
            name=f"gpu-vfio-{v.index}", kind=DeviceKind.VFIO, uuid=v.uuid, attributes=attrs,
            capacity={"addressableMemory": v.memory_bytes},
            device_nodes=("/dev/vfio/vfio", f"/dev/vfio/{v.iommu_group}"),
            physical_uuid=v.uuid, taints=taints, healthy=healthy,
        ))
    for d in out:
        total = len(d.attributes) + len(d.capacity)
        if total > MAX_ATTRIBUTES_AND_CAPACITIES:
            raise ValueError(f"device {d.name} has {total} attributes and capacities; the API allows at most 32")
    return out
