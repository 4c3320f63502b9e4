"""The devices of this node, as the device plugin needs them, behind two narrow protocols.

:class:`NodeDevices` is the plugin's view of NVML (GPUs, MIG devices, pairwise links, health events,
re-checks) and :class:`HostFiles` its view of the host filesystem (sysfs NUMA nodes, MIG capability
minors, device nodes, CDI spec files). Like NVIDIA's ``ResourceManager`` the plugin holds only these,
never an NVML handle or a host path, so tests build nodes from plain values
(``tests/node_agent/deviceplugin/builders.py``); production adapts ``node_agent.nvml``
(:mod:`node_agent.deviceplugin.nvml_devices`) and passes the agent's ``node_agent.host.HostRoot`` as the
:class:`HostFiles` itself. A host file that is missing reads as absent; one the host layer refuses or
cannot read is never taken for absent: each caller either surfaces it (an init error naming the path)
or logs it once (``event=host-read-refused``) and carries on without it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import NewType, Protocol

from node_agent.host import HostError

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Recovery:
    """What NVML says a GPU still needs after an error before new work may land on it (its recovery action,
    row remapper and page retirement: NVIDIA's "GPU Memory Error Management" guide, "Error Recovery and
    Response Flags")."""

    #: The most drastic step outstanding (``reset``, ``reboot``, ``drain-and-reset``, ``replacement`` ...);
    #: ``None``: NVML shows nothing left to do.
    need: str | None = None
    #: The need keeps the GPU out of service on its own, XID or not (a recovery action, a failed remap);
    #: a pending row remap alone does not (NVIDIA: "new workloads can be launched").
    out_of_service: bool = False
    #: NVML answered at least one of the reads (without any, nothing can show the GPU recovered).
    known: bool = True
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

    def recovery(self, gpu_uuid: str) -> Recovery:
        """What NVML says the GPU still needs after an error (raises nothing: an unreadable GPU is ``check``'s)."""
        ...


class HostFiles(Protocol):
    """Host-absolute paths read and written through the node's host root; ``node_agent.host.HostRoot`` is
    the production one, passed as it is.

    A file that does not exist is ``None`` / ``False``; one that exists but cannot be read, or a path the
    root refuses (``..``), raises :class:`~node_agent.host.HostError`, so each caller decides what a refusal
    means for it instead of mistaking it for an absent file (:func:`report_refused`)."""

    def read_text_or_none(self, host_path: str) -> str | None:
        """The file's text, or ``None`` if it does not exist."""
        ...

    def exists(self, host_path: str) -> bool: ...

    def write_atomic(self, host_path: str, data: str) -> bool:
        """Write atomically; ``False`` when the content was already identical."""
        ...

    def remove(self, host_path: str) -> bool:
        """Delete the file; ``False`` when it was not there."""
        ...


class RefusalLog:
    """Host reads the plugin was refused, each logged once per path and reason: the plugin rebuilds its
    devices on every reload and kubelet restart, and one refusal logged each time would bury the rest."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def report(self, host_path: str, error: HostError) -> str:
        reason = refusal_reason(error)
        key = (error.path or host_path, reason)
        with self._lock:
            first = key not in self._seen
            self._seen.add(key)
        if first:
            log.warning("event=host-read-refused path=%s reason=%r", key[0], reason)
        return reason


#: The process's one log of refused host reads (tests may swap in a fresh one).
REFUSALS = RefusalLog()


def refusal_reason(error: HostError) -> str:
    """Why the host layer refused: the OS error's text (``Permission denied``) or the host layer's own
    message (``..`` in the path, not UTF-8)."""
    cause = error.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(error)


def report_refused(host_path: str, error: HostError) -> str:
    """Log (once) that ``host_path`` exists but could not be read; returns the reason for the caller's message."""
    return REFUSALS.report(host_path, error)


def device_node_present(host: HostFiles, host_path: str) -> bool:
    """An optional device node (UVM, modeset) the host has. One that cannot be checked is left out like
    a missing one, since passing a node the plugin cannot see would fail the container, but it is logged."""
    try:
        return host.exists(host_path)
    except HostError as e:
        report_refused(host_path, e)
        return False


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """``00000000:07:00.0`` → ``0000:07:00.0`` (sysfs uses a 4-digit PCI domain, lower case)."""
    bus = nvml_bus_id.lower()
    domain, _, rest = bus.partition(":")
    if len(domain) == 8 and domain.startswith("0000"):
        domain = domain[4:]
    return f"{domain}:{rest}"


def numa_node(host: HostFiles, gpu: Gpu) -> int | None:
    """The GPU's NUMA node from sysfs; negative or unreadable means "no topology", as in NVIDIA's plugin.

    Without the sysfs file (no host sysfs mounted) NVML's own answer is used. A file that is there but
    cannot be read is logged (``event=host-read-refused``) and means no topology: the device is still
    advertised, only without a NUMA hint."""
    path = f"/sys/bus/pci/devices/{sysfs_bus_id(gpu.pci_bus_id)}/numa_node"
    try:
        text = host.read_text_or_none(path)
    except HostError as e:
        report_refused(path, e)
        return None
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
