"""The devices of this node, as the device plugin needs them, behind two narrow protocols.

:class:`NodeDevices` is the plugin's view of NVML (GPUs, MIG devices, pairwise links, health events,
re-checks) and :class:`HostFiles` its view of the host filesystem (sysfs NUMA nodes, MIG capability
minors, device nodes, CDI spec files). Like NVIDIA's ``ResourceManager`` the plugin holds only these,
never an NVML handle or a host path, so tests build nodes from plain values
(``tests/deviceplugin/builders.py``) and production adapts ``node_agent.nvml`` and ``node_agent.host``
(:mod:`node_agent.deviceplugin.nvml_devices`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import NewType, Protocol

GpuUuid = NewType("GpuUuid", str)
ResourceName = NewType("ResourceName", str)


class PcieLink(IntEnum):
    """The closest common PCIe ancestor of two GPUs, valued as go-gpuallocator scores it."""

    CROSS_CPU = 10  #: through the CPU interconnect (SMP/QPI/UPI): different sockets
    SAME_CPU = 20  #: same CPU / NUMA node
    HOST_BRIDGE = 30
    MULTI_SWITCH = 40
    SINGLE_SWITCH = 50
    SAME_BOARD = 60


@dataclass(frozen=True)
class Link:
    """What connects two GPUs: direct NVLinks (0 through an NVSwitch fabric) and the PCIe ancestor."""

    nvlinks: int
    pcie: PcieLink

    @property
    def score(self) -> int:
        """go-gpuallocator's pair score: the PCIe level plus 100 per direct NVLink."""
        return int(self.pcie) + 100 * self.nvlinks


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    index: int  #: MIG device index on its parent (``nvmlDeviceGetMigDeviceHandleByIndex``)
    profile: str  #: e.g. ``1g.10gb`` or ``1g.10gb+me``
    gi_id: int
    ci_id: int
    memory_mib: int
    multiprocessors: int = 0


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str  #: NVML form, ``00000000:07:00.0``
    minor: int  #: ``/dev/nvidia<minor>``
    compute_capability: tuple[int, int] = (8, 0)
    mig_enabled: bool = False
    migs: tuple[MigDevice, ...] = ()
    numa_node: int | None = None  #: NVML's answer, used when sysfs has none


class HealthEventKind(StrEnum):
    XID = "xid"  #: an XID critical error on a GPU (or one MIG instance of it)
    GPU_LOST = "gpu-lost"  #: the GPU fell off the bus
    WATCH_FAILED = "watch-failed"  #: the event wait itself failed: every device is suspect


#: NVML's "no instance" marker in XID events: the event is for the whole GPU.
WHOLE_GPU = 0xFFFFFFFF


@dataclass(frozen=True)
class HealthEvent:
    kind: HealthEventKind
    gpu_uuid: str | None = None  #: ``None`` with WATCH_FAILED
    xid: int = 0
    gi_id: int = WHOLE_GPU
    ci_id: int = WHOLE_GPU
    detail: str = ""


class NodeDevices(Protocol):
    """The GPUs of this node and their events (implemented over NVML, or by test builders)."""

    def gpus(self) -> Sequence[Gpu]:
        """Every GPU NVML sees, in index order (MIG devices under their parents)."""
        ...

    def link(self, a: Gpu, b: Gpu) -> Link:
        """How two GPUs are connected."""
        ...

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        """Block until a health event arrives or ``timeout_s`` passes (``None``)."""
        ...

    def check(self, gpu_uuid: str) -> bool:
        """A re-check: the GPU answers NVML queries normally right now."""
        ...


class HostFiles(Protocol):
    """Host-absolute paths read and written through the node's host root."""

    def read_text(self, path: str) -> str | None:
        """The file's text, or ``None`` if it does not exist or cannot be read."""
        ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]:
        """Sorted entry names; an absent directory is empty."""
        ...

    def write_text(self, path: str, text: str) -> bool:
        """Write atomically; ``False`` when the content was already identical."""
        ...

    def remove(self, path: str) -> None: ...


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """``00000000:07:00.0`` → ``0000:07:00.0`` (sysfs uses a 4-digit PCI domain, lower case)."""
    bus = nvml_bus_id.lower()
    domain, _, rest = bus.partition(":")
    if len(domain) == 8 and domain.startswith("0000"):
        domain = domain[4:]
    return f"{domain}:{rest}"


def numa_node(host: HostFiles, gpu: Gpu) -> int | None:
    """The GPU's NUMA node from sysfs; negative or unreadable means "no topology", as in NVIDIA's plugin.

    Without the sysfs file (no host sysfs mounted) NVML's own answer is used."""
    text = host.read_text(f"/sys/bus/pci/devices/{sysfs_bus_id(gpu.pci_bus_id)}/numa_node")
    if text is None:
        return gpu.numa_node
    try:
        node = int(text.strip())
    except ValueError:
        return None
    return node if node >= 0 else None


CONTROL_DEVICES: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


class DeviceError(RuntimeError):
    """The node's devices cannot be advertised as configured (an init error)."""
