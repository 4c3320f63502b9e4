"""Frozen values the NVML layer returns: what the rest of the agent knows about GPUs.

Nothing here holds an NVML handle, so these values can be cached, compared, logged and sent across
threads freely. Sizes are MiB, PCI bus IDs are NVML's 8-digit-domain form (``00000000:07:00.0``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import NewType

GpuUuid = NewType("GpuUuid", str)
MigUuid = NewType("MigUuid", str)


class TopologyLevel(IntEnum):
    """``nvmlDeviceGetTopologyCommonAncestor`` levels: lower is closer."""

    INTERNAL = 0  #: same board (multi-GPU card)
    SINGLE = 10  #: one PCIe switch
    MULTIPLE = 20  #: several PCIe switches, no host bridge
    HOSTBRIDGE = 30  #: same host bridge
    NODE = 40  #: same NUMA node / CPU socket
    SYSTEM = 50  #: across sockets (SMP interconnect)


class EventKind(StrEnum):
    XID = "xid"
    DOUBLE_BIT_ECC = "double-bit-ecc"
    SINGLE_BIT_ECC = "single-bit-ecc"


class Virtualization(StrEnum):
    """``nvmlDeviceGetVirtualizationMode``, as nvidia-smi -q words it ("GPU Virtualization Mode")."""

    NONE = "None"  #: bare metal
    PASSTHROUGH = "Pass-Through"  #: the whole GPU passed to this VM
    VGPU = "VGPU"  #: a vGPU, in a VM (a vGPU guest driver runs)
    HOST_VGPU = "Host VGPU"  #: the hypervisor's GPU, shared out as vGPUs (the vGPU manager runs)
    HOST_VSGA = "Host VSGA"  #: the hypervisor's GPU in vSGA mode


#: NVML's ``nvmlGpuVirtualizationMode_t`` values.
VIRTUALIZATION_MODES = {0: Virtualization.NONE, 1: Virtualization.PASSTHROUGH, 2: Virtualization.VGPU,
                        3: Virtualization.HOST_VGPU, 4: Virtualization.HOST_VSGA}


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool

    @property
    def change_pending(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True)
class Placement:
    """A GPU-instance placement in memory slices, as NVML reports it."""

    start: int
    size: int


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance inside a GPU instance)."""

    uuid: MigUuid
    index: int  #: position among the parent's MIG devices (the ``<gpu>:<mig>`` index's second part)
    parent_index: int
    parent_uuid: GpuUuid
    gi_id: int
    ci_id: int
    profile: str  #: ``1g.10gb``, ``1g.10gb+me``, or ``1c.2g.20gb`` for a partial compute instance
    gi_profile_id: int  #: NVML profileInfo.id (the ``nvidia-smi mig -lgip`` ID)
    placement: Placement
    memory_mib: int
    multiprocessors: int
    name: str


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: GpuUuid
    name: str
    minor: int
    pci_bus_id: str  #: ``00000000:07:00.0``
    pci_device_id: int  #: device part of the PCI ID (``0x2330``), vendor stripped
    pci_subsystem_id: int
    memory_mib: int
    compute_capability: tuple[int, int]
    architecture: str  #: NVML's architecture name (``ampere``, ``hopper``, ``ada-lovelace``, ...)
    numa_node: int | None  #: None when NVML does not know (the host layer reads sysfs instead)
    mig_mode: MigMode | None  #: None when the GPU is not MIG-capable
    mig_devices: tuple[MigDevice, ...] = field(default=())
    #: None when the driver cannot tell (NOT_SUPPORTED, or a library without the function).
    virtualization: Virtualization | None = None
    #: ``nvmlDeviceGetBrand`` (``nvmlBrandType_t``); None when the driver cannot tell.
    brand: int | None = None
    #: What NVML refused to tell about this GPU, each ``"<what>: <reason>"``: a GPU in MIG mode read by a
    #: process without the MIG monitor capability answers NO_PERMISSION for its memory and its MIG devices
    #: (NVIDIA/k8s-device-plugin#1683). The GPU is still listed (counted, labelled, exported) with these
    #: reasons; its memory is then the catalogue's for its PCI device ID (0 for a GPU the catalogue lacks).
    unreadable: tuple[str, ...] = ()

    @property
    def mig_enabled(self) -> bool:
        return self.mig_mode is not None and self.mig_mode.current

    @property
    def sysfs_bus_id(self) -> str:
        """The sysfs spelling: 4-digit domain, lower case (``0000:07:00.0``)."""
        return normalize_bus_id(self.pci_bus_id)


@dataclass(frozen=True)
class GpuTelemetry:
    """One reading of a GPU's sensors and counters (``NvmlSession.telemetry``); None where the board or
    driver does not support the reading (NVML's NOT_SUPPORTED or a function the library lacks)."""

    gpu_temp_c: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    gpu_util: int | None = None
    memory_util: int | None = None
    encoder_util: int | None = None
    decoder_util: int | None = None
    pcie_replays: int | None = None
    pcie_tx_bytes_per_s: int | None = None
    pcie_rx_bytes_per_s: int | None = None
    fb_used_mib: int | None = None
    fb_free_mib: int | None = None
    fb_reserved_mib: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    #: NVML's clock event (throttle) reasons bitmask.
    clock_events: int | None = None


class RecoveryNeed(StrEnum):
    """What a GPU needs before new work may land on it, most drastic first (``GpuRecovery.need``)."""

    REPLACEMENT = "replacement"  #: a row remapping failed: NVIDIA's RMA policy
    REBOOT = "reboot"  #: NVML_GPU_RECOVERY_ACTION_NODE_REBOOT / SYSTEM_REBOOT
    DRAIN_AND_RESET = "drain-and-reset"  #: NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    RESET = "reset"  #: NVML_GPU_RECOVERY_ACTION_GPU_RESET / BUS_RESET, a pending row remap or page retirement
    RECOVER_IMEX_DOMAIN = "recover-imex-domain"  #: NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN
    DRAIN_P2P = "drain-p2p"  #: NVML_GPU_RECOVERY_ACTION_DRAIN_P2P: stop the processes doing peer-to-peer traffic


#: NVML's recovery action names (``names.RECOVERY_ACTIONS``, nvml.h ``nvmlDeviceGpuRecoveryAction_t``) to the need.
RECOVERY_ACTION_NEEDS: dict[str, RecoveryNeed] = {
    "GPU_RESET": RecoveryNeed.RESET, "BUS_RESET": RecoveryNeed.RESET, "NODE_REBOOT": RecoveryNeed.REBOOT,
    "SYSTEM_REBOOT": RecoveryNeed.REBOOT, "DRAIN_P2P": RecoveryNeed.DRAIN_P2P,
    "DRAIN_AND_RESET": RecoveryNeed.DRAIN_AND_RESET, "RECOVER_IMEX_DOMAIN": RecoveryNeed.RECOVER_IMEX_DOMAIN,
}


@dataclass(frozen=True)
class GpuRecovery:
    """What NVML says is still outstanding on a GPU after an error (NVIDIA's "GPU Memory Error Management"
    guide, "Error Recovery and Response Flags": the row-remapping pending and failure flags and the recovery
    action; pre-Ampere GPUs retire pages instead, pending until the GPU is reattached). ``None`` per read:
    the GPU or the driver does not support it."""

    #: ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` by name (``NONE``, ``GPU_RESET``, ``NODE_REBOOT`` ...).
    action: str | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_pending: bool | None = None

    @property
    def known(self) -> bool:
        """NVML answered at least one of the reads (a clean answer is then evidence, not a guess)."""
        return any(v is not None for v in (self.action, self.remap_pending, self.remap_failure,
                                            self.retired_pages_pending))

    @property
    def reasons(self) -> tuple[str, ...]:
        out: list[str] = []
        if self.remap_failure:
            out.append("row remapping failed")
        if self.action not in (None, "NONE"):
            out.append(f"recovery action {self.action}")
        if self.remap_pending:
            out.append("row remapping pending")
        if self.retired_pages_pending:
            out.append("page retirement pending")
        return tuple(out)

    @property
    def out_of_service(self) -> bool:
        """The GPU must take no new work whatever raised it: NVML names a recovery action, or a row remap
        failed. A pending remap alone is not that: "unaffected applications can continue running ... and new
        workloads can be launched" (NVIDIA "GPU Memory Error Management", "Error Recovery and Response Flags")."""
        return bool(self.remap_failure) or self.action not in (None, "NONE")

    @property
    def need(self) -> RecoveryNeed | None:
        """The most drastic step outstanding, or ``None`` when NVML shows nothing left to do."""
        needs: list[RecoveryNeed] = []
        if self.remap_failure:
            needs.append(RecoveryNeed.REPLACEMENT)
        if self.action not in (None, "NONE"):
            # An action this table does not know yet (a newer driver's) still needs a reset at least.
            needs.append(RECOVERY_ACTION_NEEDS.get(str(self.action), RecoveryNeed.RESET))
        if self.remap_pending or self.retired_pages_pending:
            needs.append(RecoveryNeed.RESET)
        order = list(RecoveryNeed)
        return min(needs, key=order.index) if needs else None


@dataclass(frozen=True)
class MigMemory:
    """A MIG device's framebuffer use (its own memory slice)."""

    gi_id: int
    ci_id: int
    used_mib: int
    free_mib: int


@dataclass(frozen=True)
class LostGpu:
    index: int
    reason: str


@dataclass(frozen=True)
class Inventory:
    """Every GPU NVML lists: the usable ones and those that failed (lost, hung)."""

    gpus: tuple[Gpu, ...]
    lost: tuple[LostGpu, ...] = ()


class FabricState(IntEnum):
    """``nvmlGpuFabricState_t``: how far the GPU's registration with the NVLink fabric manager got."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


_NO_CLUSTER = str(uuid.UUID(int=0))


@dataclass(frozen=True)
class FabricInfo:
    """``nvmlGpuFabricInfo_t`` of one GPU: its place in a multi-node NVLink fabric (GB200 NVL72 and the like).

    ``status`` is the NVML return code of the registration itself (0 once it succeeded), not of the query.
    """

    cluster_uuid: str  #: the fabric's cluster UUID, canonical text (all zeros: none assigned)
    clique_id: int  #: the NVLink partition (clique) inside the cluster
    state: FabricState
    status: int

    @property
    def attached(self) -> bool:
        """go-nvlib's ``IsFabricAttached``: registration COMPLETED and successful, with a cluster UUID.

        Anything else (still registering, failed, no cluster) counts as not attached, as NVIDIA's GFD
        treats it, so such a GPU takes no part in the ``nvidia.com/gpu.clique`` label.
        """
        return self.state is FabricState.COMPLETED and self.cluster_uuid != _NO_CLUSTER and self.status == 0


@dataclass(frozen=True)
class DriverInfo:
    driver_version: str  #: ``550.54.15``
    cuda_driver_version: tuple[int, int]  #: CUDA driver API version, e.g. (12, 4)


@dataclass(frozen=True)
class GpuPair:
    a: int
    b: int
    nvlinks: int  #: NVLinks joining the pair (through NVSwitch: the links both GPUs have into the fabric)
    level: TopologyLevel  #: PCIe common ancestor


@dataclass(frozen=True)
class Topology:
    pairs: tuple[GpuPair, ...]

    def pair(self, a: int, b: int) -> GpuPair | None:
        lo, hi = min(a, b), max(a, b)
        for p in self.pairs:
            if (p.a, p.b) == (lo, hi):
                return p
        return None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int | None
    gi_id: int | None
    ci_id: int | None


@dataclass(frozen=True)
class GpuInstanceProfile:
    """``nvmlGpuInstanceProfileInfo_v2_t`` for one profile enum a GPU supports."""

    profile: int  #: the NVML_GPU_INSTANCE_PROFILE_* enum value
    id: int  #: profileInfo.id
    name: str  #: ``1g.10gb`` (NVML's ``MIG `` prefix removed)
    slice_count: int
    instance_count: int
    multiprocessors: int
    memory_mib: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int


@dataclass(frozen=True)
class GpuInstance:
    gpu_index: int
    id: int
    profile_id: int
    placement: Placement


@dataclass(frozen=True)
class ComputeInstance:
    gpu_index: int
    gi_id: int
    id: int
    profile_id: int
    slice_start: int


@dataclass(frozen=True)
class GpuEvent:
    gpu_index: int
    gpu_uuid: GpuUuid
    kind: EventKind
    data: int  #: the XID for XID events
    gi_id: int | None  #: None when the event concerns the whole GPU
    ci_id: int | None


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:07:00.0`` → ``0000:07:00.0`` (sysfs form, lower case)."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if not rest:
        return bus_id
    return f"{int(domain, 16):04x}:{rest}"
