"""PCI devices from sysfs: which GPUs exist, their driver, IOMMU group and NUMA node, and driver
binding through ``driver_override`` (the VFIO path)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from node_agent.host.root import HostError, HostRoot
from nvgpu.catalogue import NVIDIA_PCI_VENDOR
from nvgpu.nodescripts.facts import GPU_PCI_CLASSES, PCI_DEVICES_DIR


def normalize_address(address: str) -> str:
    """``00000000:07:00.0`` or ``0000:07:00.0`` → sysfs form ``0000:07:00.0`` (lower case)."""
    address = address.strip().lower()
    domain, sep, rest = address.partition(":")
    if not sep or rest.count(":") != 1 or "." not in rest:
        raise ValueError(f"PCI address {address!r} is not DOMAIN:BUS:DEVICE.FUNCTION")
    return f"{int(domain, 16):04x}:{rest}"


@dataclass(frozen=True)
class PciDevice:
    address: str
    vendor: int
    device: int
    pci_class: str  #: ``0x030200``
    driver: str | None
    iommu_group: int | None
    numa_node: int | None

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == NVIDIA_PCI_VENDOR and self.pci_class.startswith(GPU_PCI_CLASSES)


def _hex(host: HostRoot, path: str) -> int:
    try:
        return int(host.read_text(path).strip(), 16)
    except ValueError as e:
        raise HostError(f"{path} is not a hex number", path) from e


def read_device(host: HostRoot, address: str) -> PciDevice:
    addr = normalize_address(address)
    base = f"{PCI_DEVICES_DIR}/{addr}"
    if not host.exists(base):
        raise HostError(f"PCI device {addr} does not exist ({base})", base)
    group = host.readlink_name(f"{base}/iommu_group")
    numa_text = host.read_text_or_none(f"{base}/numa_node")
    numa = int(numa_text.strip()) if numa_text and numa_text.strip().lstrip("-").isdigit() else None
    return PciDevice(
        address=addr,
        vendor=_hex(host, f"{base}/vendor"),
        device=_hex(host, f"{base}/device"),
        pci_class=host.read_text(f"{base}/class").strip().lower(),
        driver=host.readlink_name(f"{base}/driver"),
        iommu_group=int(group) if group is not None and group.isdigit() else None,
        numa_node=numa if numa is not None and numa >= 0 else None,
    )


#: Where sysfs keeps the device tree that ``/sys/bus/pci/devices`` links into.
SYS_DEVICES = "/sys/devices"


def pcie_root(host: HostRoot, address: str) -> str | None:
    """The PCIe root complex a device sits under (``pci0000:00``), as Kubernetes' ``deviceattribute`` package
    resolves ``resource.kubernetes.io/pcieRoot``: the first component under ``/sys/devices`` of the device's
    ``/sys/bus/pci/devices`` link, whose target must end in the device's own address. None when the entry
    is not such a link (the attribute is then left out, as NVIDIA's plugin does)."""
    addr = normalize_address(address)
    link = f"{PCI_DEVICES_DIR}/{addr}"
    target = host.readlink(link)
    if target is None:
        return None
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    if not resolved.startswith(f"{SYS_DEVICES}/pci") or posixpath.basename(resolved) != addr:
        return None
    return resolved.removeprefix(f"{SYS_DEVICES}/").split("/", 1)[0]


def nvidia_gpus(host: HostRoot) -> list[PciDevice]:
    """Every NVIDIA VGA/3D controller on the PCI bus, whatever driver it is bound to."""
    out = []
    for addr in host.listdir(PCI_DEVICES_DIR):
        base = f"{PCI_DEVICES_DIR}/{addr}"
        vendor = host.read_text_or_none(f"{base}/vendor")
        if vendor is None or vendor.strip().lower() != f"0x{NVIDIA_PCI_VENDOR:04x}":
            continue
        dev = read_device(host, addr)
        if dev.is_nvidia_gpu:
            out.append(dev)
    return out
