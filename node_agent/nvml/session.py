"""The NVML facade: one session object, frozen values out, project errors, bounded calls.

``open_nvml(backend)`` initialises NVML (real, or a simulated machine installed underneath
nvidia-ml-py), yields an ``NvmlSession`` and always shuts NVML down again. Every call goes
through a ``CallRunner`` so a hung GPU costs a timeout, not the agent (and, once wedged, fails fast
instead of costing a thread per call). Per-device failures stay per device: ``inventory()`` reports
a GPU whose calls fail with any NVML error (lost, hung, NVML_ERROR_UNKNOWN, ...) as unusable next
to the usable ones instead of failing; only ``NvmlUnavailable`` (NVML itself gone) fails it all.
``processes()`` fails closed: when no process-listing symbol answers it raises rather than report
the GPU idle.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar

import pynvml

from node_agent.nvml import simulator
from node_agent.nvml.calls import CallRunner, on_gpus
from node_agent.nvml.errors import (
    DeviceLost,
    NvmlError,
    NvmlInvalidArgument,
    NvmlNotFound,
    NvmlNotSupported,
    NvmlPermissionDenied,
    NvmlTimeout,
    NvmlUnavailable,
)
from node_agent.nvml.loader import load_nvml
from node_agent.nvml.names import COMPUTE_MODES, RECOVERY_ACTIONS, RECOVERY_FIELD
from node_agent.nvml.types import (
    VIRTUALIZATION_MODES,
    ComputeInstance,
    DriverInfo,
    EventKind,
    FabricInfo,
    FabricState,
    Gpu,
    GpuEvent,
    GpuInstance,
    GpuInstanceProfile,
    GpuPair,
    GpuProcess,
    GpuRecovery,
    GpuTelemetry,
    GpuUuid,
    Inventory,
    LostGpu,
    MigDevice,
    MigMemory,
    MigMode,
    MigUuid,
    Placement,
    Topology,
    TopologyLevel,
    Virtualization,
)
from nvgpu.catalogue import model_by_pci_device

log = logging.getLogger(__name__)

#: Default budget for one NVML call. Real calls take micro- to milliseconds; seconds means wedged.
DEFAULT_TIMEOUT_S = 10.0
_WHOLE_GPU = 0xFFFFFFFF
_ARCH_NAMES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "ada-lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "blackwell",
    pynvml.NVML_DEVICE_ARCH_RUBIN: "rubin",
}
_EVENT_BITS = {
    EventKind.XID: pynvml.nvmlEventTypeXidCriticalError,
    EventKind.DOUBLE_BIT_ECC: pynvml.nvmlEventTypeDoubleBitEccError,
    EventKind.SINGLE_BIT_ECC: pynvml.nvmlEventTypeSingleBitEccError,
}
_LINK_END = (NvmlNotSupported, NvmlInvalidArgument, NvmlNotFound)
#: What ``nvmlDeviceGetMigDeviceHandleByIndex`` answers for a slot with no MIG device: NOT_FOUND (nvml.h)
#: or INVALID_ARGUMENT (drivers answer it too); NVIDIA's go-nvlib skips both (``pkg/nvlib/device/device.go``,
#: ``VisitMigDevices``), so an empty slot never costs the GPU.
_EMPTY_MIG_SLOT = (NvmlNotFound, NvmlInvalidArgument)
#: Why NVML refuses a MIG GPU's memory and MIG devices to a process (``Gpu.unreadable``).
_NO_MIG_MONITOR = ("the process lacks the MIG monitor capability (a container needs NVIDIA_MIG_MONITOR_DEVICES=all "
                   "and CAP_SYS_ADMIN)")


@dataclass(frozen=True)
class NvmlBackend:
    """Where NVML comes from: the driver's ``libnvidia-ml.so.1`` or a simulated machine."""

    kind: Literal["real", "simulated"]
    machine: str | None = None
    #: For simulated machines: share state with other processes through this JSON file.
    state_file: Path | None = None
    #: For ``real``: the driver root the library is loaded from, as the agent sees it
    #: (``node_agent.host.driverroot``); None: the process's driver root (``--driver-root``).
    driver_root: Path | None = None

    @classmethod
    def parse(cls, text: str, state_file: Path | None = None, driver_root: Path | None = None) -> NvmlBackend:
        """``real`` or ``simulated:<machine>``; raises ValueError naming the allowed values."""
        if text == "real":
            return cls("real", driver_root=driver_root)
        kind, _, machine = text.partition(":")
        sim = simulator.registered()
        if kind == "simulated" and sim is None:
            raise ValueError(f"--nvml {text!r}: {simulator.MISSING}")
        names = sim.machine_names if sim is not None else ()
        if kind == "simulated" and machine in names:
            return cls("simulated", machine, state_file, driver_root)
        raise ValueError(f"--nvml {text!r}: expected 'real' or 'simulated:<machine>'"
                         + (f" with machine one of {', '.join(names)}" if names else ""))

    def __str__(self) -> str:
        return "real" if self.kind == "real" else f"simulated:{self.machine}"


class GpuSource(Protocol):
    """What the health checker, labeller and device plugin read (implemented by ``NvmlSession``)."""

    def driver(self) -> DriverInfo: ...
    def inventory(self) -> Inventory: ...
    def topology(self, indices: Iterable[int] | None = None) -> Topology: ...
    def processes(self, index: int) -> tuple[GpuProcess, ...]: ...
    def watch_events(self, indices: Iterable[int] | None = None,
                     kinds: Iterable[EventKind] = tuple(EventKind)) -> EventWatcher: ...


class MigControl(Protocol):
    """The MIG operations the MIG manager needs (implemented by ``NvmlSession``)."""

    def mig_mode(self, index: int) -> MigMode | None: ...
    def set_mig_mode(self, index: int, enabled: bool) -> MigMode: ...
    def gpu_instance_profiles(self, index: int) -> tuple[GpuInstanceProfile, ...]: ...
    def possible_placements(self, index: int, profile_id: int) -> tuple[Placement, ...]: ...
    def remaining_capacity(self, index: int, profile_id: int) -> int: ...
    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]: ...
    def create_gpu_instance(self, index: int, profile_id: int, start: int | None = None) -> GpuInstance: ...
    def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...
    def compute_instances(self, index: int, gi_id: int) -> tuple[ComputeInstance, ...]: ...
    def create_compute_instance(self, index: int, gi_id: int, slices: int | None = None) -> ComputeInstance: ...
    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None: ...


_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S")


def _per_gpu(method: Callable[Concatenate[_S, int, _P], _R]) -> Callable[Concatenate[_S, int, _P], _R]:
    """Run a session method whose first argument is a GPU index inside ``on_gpus(index)``."""

    @wraps(method)
    def wrapper(self: _S, index: int, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with on_gpus(index):
            return method(self, index, *args, **kwargs)

    return wrapper


class _ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t``: what the unversioned process-listing symbols fill (no GI/CI ids)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


@dataclass(frozen=True)
class _RawProcess:
    pid: int
    used_bytes: int | None
    gi_id: int
    ci_id: int


def _v1_processes(symbol: str) -> Callable[[Any], list[_RawProcess]]:
    """The unversioned (v1 struct) listing, which nvidia-ml-py no longer wraps."""

    def call(handle: Any) -> list[_RawProcess]:
        fn = pynvml._nvmlGetFunctionPointer(symbol)
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.byref(count), None)
        if ret == pynvml.NVML_SUCCESS:
            return []
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(ret)
        count.value = count.value * 2 + 5
        arr = (_ProcessInfoV1 * count.value)()
        pynvml._nvmlCheckReturn(fn(handle, ctypes.byref(count), arr))
        na = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        return [_RawProcess(int(arr[i].pid), None if arr[i].usedGpuMemory == na else int(arr[i].usedGpuMemory),
                            _WHOLE_GPU, _WHOLE_GPU) for i in range(count.value)]

    return call


def _versioned_processes(fn: Callable[[Any], Any]) -> Callable[[Any], list[_RawProcess]]:
    def call(handle: Any) -> list[_RawProcess]:
        return [_RawProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                            int(p.gpuInstanceId), int(p.computeInstanceId)) for p in fn(handle)]

    return call


#: Per kind of process, the listing symbols newest first: a driver older than 510.39 has no ``_v3``,
#: one older than 450 no ``_v2``; the unversioned symbol (v1 struct) is in every driver.
_PROCESS_LISTINGS: tuple[tuple[str, tuple[tuple[str, Callable[[Any], list[_RawProcess]]], ...]], ...] = tuple(
    (kind, (
        (f"{base}_v3", _versioned_processes(getattr(pynvml, f"{base}_v3"))),
        (f"{base}_v2", _versioned_processes(getattr(pynvml, f"{base}_v2"))),
        (base, _v1_processes(base)),
    ))
    for kind, base in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                       ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"))
)


def _addr(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class NvmlSession:
    """An initialised NVML; create it with ``open_nvml``. Thread-safe (calls are serialised)."""

    def __init__(self, runner: CallRunner, timeout_s: float | None) -> None:
        self._run = runner.call
        self._runner = runner
        self._timeout_s = timeout_s
        self._handles: dict[int, Any] = {}
        self._profiles: dict[int, tuple[GpuInstanceProfile, ...]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """NVML shut down for the ``with`` block and initialised again after it, handles from before dropped:
        a GPU reset is refused while any process has NVML open ("In use by another client"), this one
        included, so NVIDIA's mig-parted shuts NVML down before it resets the GPUs
        (``cmd/nvidia-mig-parted/apply/mode.go``: ``TryNvmlShutdown``, then ``ResetAllGPUs``). Raises
        :class:`NvmlUnavailable` when NVML does not come back (the caller's session is then unusable)."""
        with self._lock:
            self._handles.clear()
            self._profiles.clear()
        with contextlib.suppress(NvmlError):
            self._run("nvmlShutdown", pynvml.nvmlShutdown)
        try:
            yield
        finally:
            try:
                self._run("nvmlInit", pynvml.nvmlInit)
            except NvmlError as e:
                if isinstance(e, NvmlUnavailable):
                    raise
                raise NvmlUnavailable(str(e), e.code) from e

    # -- system ------------------------------------------------------------------------------
    def driver(self) -> DriverInfo:
        version = self._run("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        cuda = self._run("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
        return DriverInfo(driver_version=str(version), cuda_driver_version=(cuda // 1000, (cuda % 1000) // 10))

    def device_count(self) -> int:
        return int(self._run("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))

    @_per_gpu
    def _handle(self, index: int) -> Any:
        with self._lock:
            h = self._handles.get(index)
        if h is None:
            h = self._run(f"nvmlDeviceGetHandleByIndex({index})", pynvml.nvmlDeviceGetHandleByIndex, index)
            with self._lock:
                self._handles[index] = h
        return h

    # -- inventory ---------------------------------------------------------------------------
    def inventory(self) -> Inventory:
        gpus: list[Gpu] = []
        lost: list[LostGpu] = []
        for index in range(self.device_count()):
            try:
                gpus.append(self.gpu(index))
            except NvmlUnavailable:
                raise  # NVML itself is gone (uninitialised, driver unloaded): no GPU is usable
            except NvmlError as e:
                # Any other error is this GPU's alone (lost, hung, NVML_ERROR_UNKNOWN, ...): leave it
                # out with the reason and keep the others. Debug only: every caller reports
                # ``Inventory.lost`` in its own terms, and the DRA plugin polls twice a second, which
                # made this two warnings a second per lost GPU.
                log.debug("gpu unusable index=%d reason=%s", index, e)
                lost.append(LostGpu(index, str(e)))
        return Inventory(tuple(gpus), tuple(lost))

    def gpus(self) -> tuple[Gpu, ...]:
        """Every GPU; raises ``DeviceLost`` if any is unusable (see ``inventory``)."""
        inv = self.inventory()
        if inv.lost:
            first = inv.lost[0]
            raise DeviceLost(f"GPU {first.index}: {first.reason}")
        return inv.gpus

    @_per_gpu
    def gpu(self, index: int) -> Gpu:
        """Everything the agents read of GPU ``index``, in one batch on the call runner."""
        return self._runner.batch(f"read GPU {index}", lambda: self._read_gpu(index))

    def _read_gpu(self, index: int) -> Gpu:
        h = self._handle(index)
        r = self._run
        pci = r(f"nvmlDeviceGetPciInfo({index})", pynvml.nvmlDeviceGetPciInfo, h)
        major, minor = r(f"nvmlDeviceGetCudaComputeCapability({index})", pynvml.nvmlDeviceGetCudaComputeCapability, h)
        unreadable: list[str] = []
        try:
            memory_mib = int(r(f"nvmlDeviceGetMemoryInfo({index})", pynvml.nvmlDeviceGetMemoryInfo, h).total) >> 20
        except NvmlPermissionDenied as e:
            # A GPU in MIG mode read without the MIG monitor capability: keep the GPU (NVIDIA's tools drop
            # the whole node's GPUs, k8s-device-plugin#1683) with the catalogue's memory and the reason.
            model = model_by_pci_device(int(pci.pciDeviceId) >> 16)
            memory_mib = model.memory_mib if model else 0
            unreadable.append(f"memory: {e}; {_NO_MIG_MONITOR}")
        uuid = GpuUuid(str(r(f"nvmlDeviceGetUUID({index})", pynvml.nvmlDeviceGetUUID, h)))
        try:
            arch_code = r(f"nvmlDeviceGetArchitecture({index})", pynvml.nvmlDeviceGetArchitecture, h)
            architecture = _ARCH_NAMES.get(arch_code, "unknown")
        except NvmlNotSupported:
            architecture = "unknown"
        mode = self.mig_mode(index)
        migs: tuple[MigDevice, ...] = ()
        if mode is not None and mode.current:
            try:
                migs = self._mig_devices(index, h, uuid)
            except NvmlPermissionDenied as e:
                unreadable.append(f"MIG devices: {e}; {_NO_MIG_MONITOR}")
        try:
            brand: int | None = int(r(f"nvmlDeviceGetBrand({index})", pynvml.nvmlDeviceGetBrand, h))
        except NvmlNotSupported:
            brand = None
        return Gpu(
            index=index,
            uuid=uuid,
            name=str(r(f"nvmlDeviceGetName({index})", pynvml.nvmlDeviceGetName, h)),
            minor=int(r(f"nvmlDeviceGetMinorNumber({index})", pynvml.nvmlDeviceGetMinorNumber, h)),
            pci_bus_id=pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId),
            pci_device_id=int(pci.pciDeviceId) >> 16,
            pci_subsystem_id=int(pci.pciSubSystemId),
            memory_mib=memory_mib,
            compute_capability=(int(major), int(minor)),
            architecture=architecture,
            numa_node=self._numa(index, h),
            mig_mode=mode,
            mig_devices=migs,
            virtualization=self._virtualization(index, h),
            brand=brand,
            unreadable=tuple(unreadable),
        )

    @_per_gpu
    def probe(self, index: int) -> GpuUuid:
        """GPU ``index``'s UUID, read live together with its PCI info: NVML's reference lists
        ``NVML_ERROR_GPU_IS_LOST`` for both when the GPU has fallen off the bus or is otherwise inaccessible.
        A periodic re-check of a healthy GPU then costs two calls, not :meth:`gpu`'s full read (a dozen,
        and many more for a MIG GPU's devices)."""
        h = self._handle(index)
        self._run(f"nvmlDeviceGetPciInfo({index})", pynvml.nvmlDeviceGetPciInfo, h)
        return GpuUuid(str(self._run(f"nvmlDeviceGetUUID({index})", pynvml.nvmlDeviceGetUUID, h)))

    @_per_gpu
    def _virtualization(self, index: int, h: Any) -> Virtualization | None:
        try:
            mode = int(self._run(f"nvmlDeviceGetVirtualizationMode({index})",
                                 pynvml.nvmlDeviceGetVirtualizationMode, h))
        except NvmlNotSupported:  # also FUNCTION_NOT_FOUND: a library without it
            return None
        return VIRTUALIZATION_MODES.get(mode)

    @_per_gpu
    def _numa(self, index: int, h: Any) -> int | None:
        try:
            node = int(self._run(f"nvmlDeviceGetNumaNodeId({index})", pynvml.nvmlDeviceGetNumaNodeId, h))
        except NvmlNotSupported:
            return None
        return node if node >= 0 else None

    @_per_gpu
    def fabric_info(self, index: int) -> FabricInfo | None:
        """The GPU's NVLink fabric registration, or None when the GPU or driver has no fabric to report.

        As go-nvlib asks (``IsFabricAttached``, used by NVIDIA's GFD for ``nvidia.com/gpu.clique``): the
        unversioned ``nvmlDeviceGetGpuFabricInfo`` when the library has it, else the versioned
        ``nvmlDeviceGetGpuFabricInfoV`` (v2 struct); NOT_SUPPORTED (a GPU outside any NVLink fabric) and
        a library with neither symbol mean no fabric. Every other error is raised: NVIDIA's GFD then
        fails the labelling run rather than publish a partial clique.
        """
        h = self._handle(index)
        calls: tuple[tuple[str, Callable[[Any, Any], Any], type[ctypes.Structure]], ...] = (
            ("nvmlDeviceGetGpuFabricInfo", pynvml.nvmlDeviceGetGpuFabricInfo, pynvml.c_nvmlGpuFabricInfo_t),
            ("nvmlDeviceGetGpuFabricInfoV", pynvml.nvmlDeviceGetGpuFabricInfoV, pynvml.c_nvmlGpuFabricInfo_v2_t),
        )
        for symbol, fn, struct in calls:
            info: Any = struct()
            try:
                self._run(f"{symbol}({index})", fn, h, ctypes.byref(info))
            except NvmlNotSupported as e:
                if e.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    continue  # an older (or newer) library: try the other symbol
                return None
            raw_state = int(info.state)
            known = raw_state in {s.value for s in FabricState}
            return FabricInfo(
                cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
                clique_id=int(info.cliqueId),
                state=FabricState(raw_state) if known else FabricState.NOT_SUPPORTED,
                status=int(info.status),
            )
        return None

    @_per_gpu
    def mig_mode(self, index: int) -> MigMode | None:
        h = self._handle(index)
        try:
            current, pending = self._run(f"nvmlDeviceGetMigMode({index})", pynvml.nvmlDeviceGetMigMode, h)
        except NvmlNotSupported:
            return None
        return MigMode(current=bool(current), pending=bool(pending))

    @_per_gpu
    def _mig_devices(self, index: int, h: Any, parent_uuid: GpuUuid) -> tuple[MigDevice, ...]:
        r = self._run
        profiles = {p.id: p for p in self.gpu_instance_profiles(index)}
        out: list[MigDevice] = []
        for where, mh in self._mig_slots(index, h):
            gi_id = int(r(where, pynvml.nvmlDeviceGetGpuInstanceId, mh))
            ci_id = int(r(where, pynvml.nvmlDeviceGetComputeInstanceId, mh))
            gi = r(where, pynvml.nvmlDeviceGetGpuInstanceById, h, gi_id)
            gi_info = r(where, pynvml.nvmlGpuInstanceGetInfo, gi)
            ci = r(where, pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
            ci_info = r(where, pynvml.nvmlComputeInstanceGetInfo, ci)
            ci_profile = self._ci_profile(where, gi, int(ci_info.profileId))
            gi_profile = profiles.get(int(gi_info.profileId))
            base = gi_profile.name if gi_profile else f"profile-{gi_info.profileId}"
            full = gi_profile is None or int(ci_profile.sliceCount) == gi_profile.slice_count
            out.append(MigDevice(
                uuid=MigUuid(str(r(where, pynvml.nvmlDeviceGetUUID, mh))),
                index=len(out),
                parent_index=index,
                parent_uuid=parent_uuid,
                gi_id=gi_id,
                ci_id=ci_id,
                profile=base if full else f"{ci_profile.sliceCount}c.{base}",
                gi_profile_id=int(gi_info.profileId),
                placement=Placement(int(gi_info.placement.start), int(gi_info.placement.size)),
                memory_mib=int(r(where, pynvml.nvmlDeviceGetMemoryInfo, mh).total) >> 20,
                multiprocessors=int(ci_profile.multiprocessorCount),
                name=str(r(where, pynvml.nvmlDeviceGetName, mh)),
            ))
        return tuple(out)

    def _mig_slots(self, index: int, h: Any) -> Iterator[tuple[str, Any]]:
        """(where, handle) of each MIG device of GPU ``index``, walking its slots as go-nvlib does: every
        index below nvmlDeviceGetMaxMigDeviceCount, an empty one (NOT_FOUND or INVALID_ARGUMENT) skipped."""
        count = int(self._run(f"nvmlDeviceGetMaxMigDeviceCount({index})", pynvml.nvmlDeviceGetMaxMigDeviceCount, h))
        for mig_index in range(count):
            where = f"MIG device {index}:{mig_index}"
            try:
                mh = self._run(where, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, mig_index)
            except _EMPTY_MIG_SLOT:
                continue
            yield where, mh

    def _ci_profile_info(self, where: str, gi: Any, enum: int) -> Any:
        """The compute-instance profile info of ``enum`` (shared engines): the versioned call, else the v1
        call on drivers that lack it (NVML_ERROR_FUNCTION_NOT_FOUND), as for GPU-instance profiles."""
        shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        try:
            return self._run(where, pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, enum, shared)
        except NvmlNotSupported as e:
            if e.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        return self._run(where, pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, enum, shared, 1)

    def _ci_profile(self, where: str, gi: Any, profile_id: int) -> Any:
        """The compute-instance profile info whose ``id`` is ``profile_id`` (searched, not assumed = enum)."""
        for enum in (profile_id, *range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                info = self._ci_profile_info(where, gi, enum)
            except (NvmlNotSupported, NvmlInvalidArgument):
                continue
            if int(info.id) == profile_id:
                return info
        raise NvmlNotFound(f"{where}: no compute-instance profile with id {profile_id}")

    # -- topology ----------------------------------------------------------------------------
    def topology(self, indices: Iterable[int] | None = None) -> Topology:
        """NVLink counts and PCIe common ancestors for every pair of GPUs.

        NVSwitch systems (DGX/HGX) wire every GPU's links into the switch fabric, not to a peer,
        so a pair joined through switches counts the links both GPUs have into the fabric
        (min of the two), which is what NVIDIA's allocator scores for an NVSwitch pair.
        """
        chosen = list(range(self.device_count())) if indices is None else sorted(set(indices))
        bus = {i: self.gpu_bus_id(i) for i in chosen}
        direct: dict[int, dict[str, int]] = {}
        switched: dict[int, int] = {}
        for i in chosen:
            try:
                direct[i], switched[i] = self._links(i, set(bus.values()))
            except NvmlUnavailable:
                raise
            except NvmlError as e:
                # One GPU's NVLink state failing must not cost the other GPUs their topology.
                log.warning("event=gpu-links-unreadable index=%d error=%s", i, e)
                direct[i], switched[i] = {}, 0
        pairs = []
        for n, a in enumerate(chosen):
            for b in chosen[n + 1:]:
                try:
                    with on_gpus(a, b):
                        level = self._run(f"nvmlDeviceGetTopologyCommonAncestor({a},{b})",
                                          pynvml.nvmlDeviceGetTopologyCommonAncestor, self._handle(a),
                                          self._handle(b))
                except NvmlNotSupported:
                    # Some drivers and virtual GPUs cannot tell (NVIDIA's go-nvml mock machines neither):
                    # score the pair as the farthest apart rather than refuse to serve the node's GPUs.
                    level = TopologyLevel.SYSTEM
                except NvmlUnavailable:
                    raise
                except NvmlError as e:
                    log.warning("event=gpu-topology-unreadable pair=%d,%d error=%s", a, b, e)
                    level = TopologyLevel.SYSTEM
                links = direct[a].get(bus[b], 0)
                if switched[a] and switched[b]:
                    links += min(switched[a], switched[b])
                pairs.append(GpuPair(a, b, links, TopologyLevel(int(level))))
        return Topology(tuple(pairs))

    @_per_gpu
    def gpu_bus_id(self, index: int) -> str:
        pci = self._run(f"nvmlDeviceGetPciInfo({index})", pynvml.nvmlDeviceGetPciInfo, self._handle(index))
        return pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)

    @_per_gpu
    def _links(self, index: int, gpu_buses: set[str]) -> tuple[dict[str, int], int]:
        h = self._handle(index)
        direct: dict[str, int] = {}
        switched = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            where = f"NVLink {link} of GPU {index}"
            try:
                active = self._run(where, pynvml.nvmlDeviceGetNvLinkState, h, link)
            except _LINK_END:
                break
            if active != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = self._run(where, pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            remote_bus = remote.busId.decode() if isinstance(remote.busId, bytes) else str(remote.busId)
            try:
                kind = self._run(where, pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
                is_switch = kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            except NvmlNotSupported:
                is_switch = remote_bus not in gpu_buses
            if is_switch:
                switched += 1
            else:
                direct[remote_bus] = direct.get(remote_bus, 0) + 1
        return direct, switched

    # -- processes ---------------------------------------------------------------------------
    @_per_gpu
    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """Compute and graphics processes on a GPU (the "in use" test for VFIO and MIG changes).

        Fails closed: each kind is listed with the newest symbol the driver has (``_v3``, ``_v2``,
        then the unversioned one); when none answers, ``NvmlError`` "cannot tell whether GPU N is in
        use" is raised rather than reporting the GPU idle. A GPU that does not support listing
        graphics processes (NVML_ERROR_NOT_SUPPORTED) runs none.
        """
        h = self._handle(index)
        seen: dict[int, GpuProcess] = {}
        for kind, versions in _PROCESS_LISTINGS:
            procs: list[_RawProcess] | None = None
            tried: list[NvmlError] = []
            for what, fn in versions:
                try:
                    procs = self._run(f"{what}({index})", fn, h)
                    break
                except NvmlNotSupported as e:
                    if e.code == pynvml.NVML_ERROR_NOT_SUPPORTED and kind == "graphics":
                        procs = []
                        break
                    tried.append(e)
                    if e.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                        break
                except NvmlUnavailable:
                    raise
                except NvmlError as e:
                    tried.append(e)
                    break
            if procs is None:
                raise NvmlError(f"cannot tell whether GPU {index} is in use: no {kind}-process listing "
                                f"answered ({'; '.join(map(str, tried))})") from (tried[-1] if tried else None)
            for p in procs:
                seen.setdefault(p.pid, GpuProcess(
                    pid=p.pid,
                    used_mib=None if p.used_bytes is None else p.used_bytes >> 20,
                    gi_id=None if p.gi_id == _WHOLE_GPU else p.gi_id,
                    ci_id=None if p.ci_id == _WHOLE_GPU else p.ci_id,
                ))
        return tuple(seen.values())

    # -- compute mode ------------------------------------------------------------------------
    @_per_gpu
    def compute_mode(self, index: int) -> str:
        """GPU ``index``'s compute mode by NVML's name (``DEFAULT``, ``PROHIBITED``, ``EXCLUSIVE_PROCESS``)."""
        code = self._run(f"nvmlDeviceGetComputeMode({index})", pynvml.nvmlDeviceGetComputeMode, self._handle(index))
        return COMPUTE_MODES.get(int(code), f"unknown({int(code)})")

    @_per_gpu
    def set_compute_mode(self, index: int, mode: str) -> None:
        """Put GPU ``index`` in compute mode ``mode`` (a name of :data:`COMPUTE_MODES`); needs root, as
        ``nvidia-smi -c`` does (``NvmlPermissionDenied`` otherwise)."""
        codes = {name: code for code, name in COMPUTE_MODES.items()}
        if mode not in codes:
            raise ValueError(f"compute mode {mode!r}: expected one of {', '.join(sorted(codes))}")
        self._run(f"nvmlDeviceSetComputeMode({index},{mode})", pynvml.nvmlDeviceSetComputeMode,
                  self._handle(index), codes[mode])

    # -- persistence mode --------------------------------------------------------------------
    @_per_gpu
    def persistence_mode(self, index: int) -> bool:
        """Whether GPU ``index`` is in persistence mode (the driver keeps it initialised with no client)."""
        code = self._run(f"nvmlDeviceGetPersistenceMode({index})", pynvml.nvmlDeviceGetPersistenceMode,
                         self._handle(index))
        return bool(int(code) == pynvml.NVML_FEATURE_ENABLED)

    @_per_gpu
    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        """Turn GPU ``index``'s persistence mode on or off; needs root, as ``nvidia-smi -pm`` does
        (``NvmlPermissionDenied`` otherwise)."""
        self._run(f"nvmlDeviceSetPersistenceMode({index},{int(enabled)})", pynvml.nvmlDeviceSetPersistenceMode,
                  self._handle(index), pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED)

    # -- MIG ---------------------------------------------------------------------------------
    @_per_gpu
    def set_mig_mode(self, index: int, enabled: bool) -> MigMode:
        """Request MIG on/off; the returned mode shows whether it is still pending a GPU reset."""
        h = self._handle(index)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        status = self._run(f"nvmlDeviceSetMigMode({index},{int(enabled)})", pynvml.nvmlDeviceSetMigMode, h, mode)
        if status != pynvml.NVML_SUCCESS:
            log.info("mig mode change pending gpu=%d activation_status=%d", index, status)
        with self._lock:
            self._profiles.pop(index, None)
        result = self.mig_mode(index)
        if result is None:
            raise NvmlNotSupported(f"GPU {index} does not support MIG")
        return result

    @_per_gpu
    def gpu_instance_profiles(self, index: int) -> tuple[GpuInstanceProfile, ...]:
        with self._lock:
            cached = self._profiles.get(index)
        if cached is not None:
            return cached
        h = self._handle(index)
        out = []
        version = 2
        for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            where = f"nvmlDeviceGetGpuInstanceProfileInfo({index},{enum})"
            try:
                info = self._run(where, pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, enum, version)
            except NvmlNotSupported as e:
                if e.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND or version == 1:
                    continue
                version = 1  # drivers before the V call: the v1 struct has no name; the catalogue names it
                try:
                    info = self._run(where, pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, enum, version)
                except (NvmlNotSupported, NvmlInvalidArgument):
                    continue
            except NvmlInvalidArgument:
                continue
            name = self._profile_name(index, info, enum)
            out.append(GpuInstanceProfile(
                profile=enum, id=int(info.id), name=name.removeprefix("MIG "),
                slice_count=int(info.sliceCount), instance_count=int(info.instanceCount),
                multiprocessors=int(info.multiprocessorCount), memory_mib=int(info.memorySizeMB),
                copy_engines=int(info.copyEngineCount), decoders=int(info.decoderCount),
                encoders=int(info.encoderCount), jpegs=int(info.jpegCount), ofas=int(info.ofaCount),
            ))
        result = tuple(out)
        with self._lock:
            self._profiles[index] = result
        return result

    @_per_gpu
    def _profile_name(self, index: int, info: Any, enum: int) -> str:
        """NVML's name for the profile (v2 struct), else the catalogue's for the profile *enum*: the kind of
        profile is what the enum says; ``info.id`` is the driver's numbering, which the catalogue records for
        real drivers but a driver (or NVIDIA's mock, which numbers profiles by enum) may number otherwise."""
        raw = getattr(info, "name", b"")
        name = (raw.decode() if isinstance(raw, bytes) else str(raw)).removeprefix("MIG ")
        if name:
            return name
        pci = self._run(f"nvmlDeviceGetPciInfo({index})", pynvml.nvmlDeviceGetPciInfo, self._handle(index))
        model = model_by_pci_device(int(pci.pciDeviceId) >> 16)
        profile = next((p for p in (model.mig.profiles if model and model.mig else ()) if p.gi_profile == enum),
                       None)
        return profile.name if profile else f"profile-{info.id}"

    @_per_gpu
    def possible_placements(self, index: int, profile_id: int) -> tuple[Placement, ...]:
        h = self._handle(index)
        count = ctypes.c_uint(0)
        where = f"nvmlDeviceGetGpuInstancePossiblePlacements({index},{profile_id})"
        self._run(where, pynvml.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, None, ctypes.byref(count))
        arr = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        self._run(where, pynvml.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, arr, ctypes.byref(count))
        return tuple(Placement(int(arr[i].start), int(arr[i].size)) for i in range(count.value))

    @_per_gpu
    def remaining_capacity(self, index: int, profile_id: int) -> int:
        return int(self._run(f"nvmlDeviceGetGpuInstanceRemainingCapacity({index},{profile_id})",
                             pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity, self._handle(index), profile_id))

    @_per_gpu
    def _gi_value(self, index: int, gi: Any) -> GpuInstance:
        info = self._run(f"nvmlGpuInstanceGetInfo(GPU {index})", pynvml.nvmlGpuInstanceGetInfo, gi)
        return GpuInstance(index, int(info.id), int(info.profileId),
                           Placement(int(info.placement.start), int(info.placement.size)))

    @_per_gpu
    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]:
        h = self._handle(index)
        found: list[GpuInstance] = []
        for profile in self.gpu_instance_profiles(index):
            arr = (pynvml.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
            count = ctypes.c_uint(len(arr))
            try:
                self._run(f"nvmlDeviceGetGpuInstances({index},{profile.id})", pynvml.nvmlDeviceGetGpuInstances,
                          h, profile.id, arr, ctypes.byref(count))
            except NvmlNotSupported:
                return ()
            found.extend(self._gi_value(index, arr[i]) for i in range(count.value))
        return tuple(sorted(found, key=lambda g: g.id))

    @_per_gpu
    def create_gpu_instance(self, index: int, profile_id: int, start: int | None = None) -> GpuInstance:
        """Create a GPU instance; ``start`` picks the placement (NVML chooses when None)."""
        h = self._handle(index)
        where = f"create GPU instance profile {profile_id} on GPU {index}"
        if start is None:
            gi = self._run(where, pynvml.nvmlDeviceCreateGpuInstance, h, profile_id)
        else:
            size = next((p.size for p in self.possible_placements(index, profile_id)), 0)
            placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
            gi = self._run(where, pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, h, profile_id,
                           ctypes.byref(placement))
        return self._gi_value(index, gi)

    @_per_gpu
    def _gi(self, index: int, gi_id: int) -> Any:
        return self._run(f"nvmlDeviceGetGpuInstanceById({index},{gi_id})", pynvml.nvmlDeviceGetGpuInstanceById,
                         self._handle(index), gi_id)

    @_per_gpu
    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._run(f"destroy GPU instance {gi_id} on GPU {index}", pynvml.nvmlGpuInstanceDestroy,
                  self._gi(index, gi_id))

    @_per_gpu
    def compute_instances(self, index: int, gi_id: int) -> tuple[ComputeInstance, ...]:
        gi = self._gi(index, gi_id)
        found: list[ComputeInstance] = []
        for enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            where = f"compute instances of GI {gi_id} on GPU {index}"
            try:
                info = self._ci_profile_info(where, gi, enum)
            except (NvmlNotSupported, NvmlInvalidArgument):
                continue
            arr = (pynvml.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(len(arr))
            self._run(where, pynvml.nvmlGpuInstanceGetComputeInstances, gi, int(info.id), arr, ctypes.byref(count))
            for i in range(count.value):
                ci = self._run(where, pynvml.nvmlComputeInstanceGetInfo, arr[i])
                found.append(ComputeInstance(index, gi_id, int(ci.id), int(ci.profileId), int(ci.placement.start)))
        return tuple(sorted(found, key=lambda c: c.id))

    @_per_gpu
    def create_compute_instance(self, index: int, gi_id: int, slices: int | None = None) -> ComputeInstance:
        """Create a compute instance of ``slices`` compute slices (the whole GPU instance when None)."""
        gi = self._gi(index, gi_id)
        where = f"create compute instance in GI {gi_id} on GPU {index}"
        best: Any = None
        for enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._ci_profile_info(where, gi, enum)
            except (NvmlNotSupported, NvmlInvalidArgument):
                continue
            if slices is not None and int(info.sliceCount) == slices:
                best = info
                break
            if slices is None and (best is None or int(info.sliceCount) > int(best.sliceCount)):
                best = info
        if best is None:
            raise NvmlNotSupported(f"{where}: no compute-instance profile with {slices} slice(s)")
        ci = self._run(where, pynvml.nvmlGpuInstanceCreateComputeInstance, gi, int(best.id))
        info = self._run(where, pynvml.nvmlComputeInstanceGetInfo, ci)
        return ComputeInstance(index, gi_id, int(info.id), int(info.profileId), int(info.placement.start))

    @_per_gpu
    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        gi = self._gi(index, gi_id)
        where = f"destroy compute instance {ci_id} in GI {gi_id} on GPU {index}"
        ci = self._run(where, pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
        self._run(where, pynvml.nvmlComputeInstanceDestroy, ci)

    # -- diagnostics -------------------------------------------------------------------------
    def nvml_version(self) -> str:
        return str(self._run("nvmlSystemGetNVMLVersion", pynvml.nvmlSystemGetNVMLVersion))

    @_per_gpu
    def query(self, index: int, name: str, *args: Any) -> Any:
        """One read of GPU ``index`` by its nvidia-ml-py name (``nvmlDeviceGet*`` only: a read can change
        nothing), for ``diagnose``: the raw value, or the project's error (``NvmlNotSupported`` where the
        GPU or the library has no such thing)."""
        if not name.startswith("nvmlDeviceGet") or not hasattr(pynvml, name):
            raise ValueError(f"{name}: not an NVML device getter")
        return self._run(f"{name}({index})", getattr(pynvml, name), self._handle(index), *args)

    # -- telemetry ---------------------------------------------------------------------------
    def _optional(self, where: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None where the GPU or the library does not support it."""
        try:
            return self._run(where, fn, *args)
        except NvmlNotSupported:
            return None

    @_per_gpu
    def telemetry(self, index: int) -> GpuTelemetry:
        """One reading of GPU ``index``'s sensors and counters, each read once (what dcgm-exporter's
        NVML-backed fields read). A lost GPU raises, as every other per-GPU call does."""
        h = self._handle(index)

        def get(name: str, *args: Any) -> Any:
            return self._optional(f"{name}({index})", getattr(pynvml, name), h, *args)

        power = get("nvmlDeviceGetPowerUsage")
        util = get("nvmlDeviceGetUtilizationRates")
        enc, dec = get("nvmlDeviceGetEncoderUtilization"), get("nvmlDeviceGetDecoderUtilization")
        tx = get("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = get("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_RX_BYTES)
        mem: Any = None
        try:
            try:
                mem = self._run(f"nvmlDeviceGetMemoryInfo_v2({index})", pynvml.nvmlDeviceGetMemoryInfo, h,
                                pynvml.nvmlMemory_v2)
            except NvmlNotSupported:
                mem = self._run(f"nvmlDeviceGetMemoryInfo({index})", pynvml.nvmlDeviceGetMemoryInfo, h)
        except NvmlPermissionDenied:
            pass  # a GPU in MIG mode without the MIG monitor capability: its framebuffer is its MIG devices'

        rows = get("nvmlDeviceGetRemappedRows")
        corrected, uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return GpuTelemetry(
            gpu_temp_c=get("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
            power_w=None if power is None else power / 1000.0,
            energy_mj=get("nvmlDeviceGetTotalEnergyConsumption"),
            sm_clock_mhz=get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
            mem_clock_mhz=get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_MEM),
            gpu_util=None if util is None else int(util.gpu),
            memory_util=None if util is None else int(util.memory),
            encoder_util=None if enc is None else int(enc[0]),
            decoder_util=None if dec is None else int(dec[0]),
            pcie_replays=get("nvmlDeviceGetPcieReplayCounter"),
            pcie_tx_bytes_per_s=None if tx is None else int(tx) * 1024,
            pcie_rx_bytes_per_s=None if rx is None else int(rx) * 1024,
            fb_used_mib=None if mem is None else int(mem.used) >> 20,
            fb_free_mib=None if mem is None else int(mem.free) >> 20,
            fb_reserved_mib=int(mem.reserved) >> 20 if mem is not None and hasattr(mem, "reserved") else None,
            ecc_sbe_volatile=get("nvmlDeviceGetTotalEccErrors", corrected, pynvml.NVML_VOLATILE_ECC),
            ecc_dbe_volatile=get("nvmlDeviceGetTotalEccErrors", uncorrected, pynvml.NVML_VOLATILE_ECC),
            ecc_sbe_aggregate=get("nvmlDeviceGetTotalEccErrors", corrected, pynvml.NVML_AGGREGATE_ECC),
            ecc_dbe_aggregate=get("nvmlDeviceGetTotalEccErrors", uncorrected, pynvml.NVML_AGGREGATE_ECC),
            remapped_correctable=None if rows is None else int(rows[0]),
            remapped_uncorrectable=None if rows is None else int(rows[1]),
            remap_pending=None if rows is None else bool(rows[2]),
            remap_failure=None if rows is None else bool(rows[3]),
            clock_events=get("nvmlDeviceGetCurrentClocksEventReasons"),
        )

    @_per_gpu
    def recovery(self, index: int) -> GpuRecovery:
        """What NVML says GPU ``index`` still needs after an error: its recovery action field, the row
        remapper's pending and failure flags (Ampere and later) and pending page retirement (earlier GPUs).
        A read the GPU or driver lacks is ``None``; a lost GPU raises, as every other per-GPU call does."""
        h = self._handle(index)
        action: str | None = None
        if RECOVERY_FIELD is not None:
            values = self._optional(f"nvmlDeviceGetFieldValues({index})", pynvml.nvmlDeviceGetFieldValues, h,
                                    [RECOVERY_FIELD])
            if values is not None and int(values[0].nvmlReturn) == pynvml.NVML_SUCCESS:
                raw = int(values[0].value.uiVal)
                action = RECOVERY_ACTIONS.get(raw, str(raw))
        rows = self._optional(f"nvmlDeviceGetRemappedRows({index})", pynvml.nvmlDeviceGetRemappedRows, h)
        pages = self._optional(f"nvmlDeviceGetRetiredPagesPendingStatus({index})",
                               pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        return GpuRecovery(action=action, remap_pending=None if rows is None else bool(rows[2]),
                           remap_failure=None if rows is None else bool(rows[3]),
                           retired_pages_pending=None if pages is None else bool(pages))

    @_per_gpu
    def mig_memory(self, index: int) -> tuple[MigMemory, ...]:
        """Each MIG device's framebuffer use on GPU ``index`` (empty when MIG is off)."""
        h = self._handle(index)
        mode = self.mig_mode(index)
        if mode is None or not mode.current:
            return ()
        out: list[MigMemory] = []
        for where, mh in self._mig_slots(index, h):
            mem = self._run(where, pynvml.nvmlDeviceGetMemoryInfo, mh)
            out.append(MigMemory(int(self._run(where, pynvml.nvmlDeviceGetGpuInstanceId, mh)),
                                 int(self._run(where, pynvml.nvmlDeviceGetComputeInstanceId, mh)),
                                 int(mem.used) >> 20, int(mem.free) >> 20))
        return tuple(out)

    # -- events ------------------------------------------------------------------------------
    def watch_events(self, indices: Iterable[int] | None = None,
                     kinds: Iterable[EventKind] = tuple(EventKind)) -> EventWatcher:
        """Register for XID/ECC events on the GPUs; use the watcher as a context manager."""
        chosen = list(range(self.device_count())) if indices is None else list(indices)
        return EventWatcher(self, chosen, tuple(kinds), self._timeout_s)


class EventWatcher:
    """An NVML event set. ``wait(timeout_s)`` returns the next event or None on timeout.

    GPUs that cannot register (lost, no event support) are listed in ``failed`` with the reason so
    the caller can mark them unhealthy at once, as NVIDIA's device plugin does.
    """

    def __init__(self, session: NvmlSession, indices: list[int], kinds: tuple[EventKind, ...],
                 timeout_s: float | None) -> None:
        # Waiting blocks for the whole wait timeout, so the watcher gets its own runner: other NVML
        # calls must not queue behind it.
        self._runner = CallRunner(timeout_s)
        self._session = session
        #: Waits in progress, and whether :meth:`close` came meanwhile: the set is freed by whichever ends
        #: last, never under a wait (``nvmlEventSetFree`` while another thread waits on the set is
        #: undefined), and ``close`` never blocks for a wait's timeout.
        self._state = threading.Lock()
        self._waiting = 0
        self._closed = False
        self._freed = False
        self.failed: dict[int, str] = {}
        self._by_handle: dict[int, tuple[int, GpuUuid]] = {}
        wanted = 0
        for k in kinds:
            wanted |= _EVENT_BITS[k]
        self._set = self._runner.call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        for index in indices:
            try:
                with on_gpus(index):
                    self._register(session, index, wanted)
            except NvmlError as e:
                self.failed[index] = str(e)

    def _register(self, session: NvmlSession, index: int, wanted: int) -> None:
        h = session._handle(index)
        uuid = GpuUuid(str(session._run(f"nvmlDeviceGetUUID({index})", pynvml.nvmlDeviceGetUUID, h)))
        supported = int(self._runner.call(f"nvmlDeviceGetSupportedEventTypes({index})",
                                          pynvml.nvmlDeviceGetSupportedEventTypes, h))
        mask = wanted & supported
        if not mask:
            self.failed[index] = "GPU supports none of the requested event types"
            return
        self._runner.call(f"nvmlDeviceRegisterEvents({index})", pynvml.nvmlDeviceRegisterEvents, h, mask, self._set)
        self._by_handle[_addr(h)] = (index, uuid)

    def wait(self, timeout_s: float) -> GpuEvent | None:
        """The next event within ``timeout_s``, or None (also once closed)."""
        ms = max(0, int(timeout_s * 1000))
        with self._state:
            if self._closed:
                return None
            self._waiting += 1
        data = None
        try:
            data = self._runner.call("nvmlEventSetWait", pynvml.nvmlEventSetWait, self._set, ms,
                                     timeout_s=timeout_s + 5.0)
        except NvmlTimeout as e:
            if e.code != pynvml.NVML_ERROR_TIMEOUT:
                raise
        finally:
            closed = self._leave()
        if data is None or closed:  # an event that came as the watcher closed goes with its set
            return None
        index, uuid = self._device_of(data.device)
        kind = next((k for k, bit in _EVENT_BITS.items() if int(data.eventType) & bit), EventKind.XID)
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return GpuEvent(index, uuid, kind, int(data.eventData),
                        None if gi == _WHOLE_GPU else gi, None if ci == _WHOLE_GPU else ci)

    def _device_of(self, handle: Any) -> tuple[int, GpuUuid]:
        """The NVML index and UUID of an event's device, by the UUID NVML gives for it (NVIDIA's plugin asks
        ``event.Device.GetUUID()``, k8s-device-plugin ``internal/rm/health.go``), the handle's address only
        where NVML cannot name it. ``(-1, "")``: neither names one of the watched GPUs (the caller re-checks
        them all)."""
        try:
            named = GpuUuid(str(self._runner.call("nvmlDeviceGetUUID(event device)", pynvml.nvmlDeviceGetUUID,
                                                  handle)))
        except NvmlError:
            return self._by_handle.get(_addr(handle), (-1, GpuUuid("")))
        index = next((i for i, u in self._by_handle.values() if u == named), -1)
        return index, named

    def _leave(self) -> bool:
        """A wait ended: the last one out after :meth:`close` frees the set. Answers whether it is closed."""
        with self._state:
            self._waiting -= 1
            closed, last = self._closed, self._closed and not self._waiting
        if last:
            self._free()
        return closed

    def close(self) -> None:
        """Free the set now, or, while a wait is in progress, as soon as it ends (without waiting for it:
        a device plugin restarting for a kubelet restart must not sit out its health monitor's wait)."""
        with self._state:
            self._closed = True
            if self._waiting:
                return
        self._free()

    def _free(self) -> None:
        with self._state:
            if self._freed:
                return
            self._freed = True
        with contextlib.suppress(NvmlError):
            self._runner.call("nvmlEventSetFree", pynvml.nvmlEventSetFree, self._set)
        self._runner.close()

    def __enter__(self) -> EventWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def open_nvml(backend: NvmlBackend | str = "real", *, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> Iterator[
        NvmlSession]:
    """Initialise NVML for the ``with`` block; raises ``NvmlUnavailable`` when it cannot start.

    ``real``: ``libnvidia-ml.so.1`` is loaded from the backend's driver root first (``loader``); a root
    without it is ``NvmlUnavailable`` naming the paths searched.
    """
    if isinstance(backend, str):
        backend = NvmlBackend.parse(backend)
    installed: object = None
    sim = None
    if backend.kind == "simulated":
        assert backend.machine is not None
        sim = simulator.get()
        installed = sim.install(backend.machine, backend.state_file)
    else:
        # Before nvmlInit: the library comes from the driver root, never the process's library path.
        load_nvml(backend.driver_root)
    runner = CallRunner(timeout_s)
    try:
        try:
            runner.call("nvmlInit", pynvml.nvmlInit)
        except NvmlTimeout as e:
            raise NvmlUnavailable(str(e), e.code) from e
        except NvmlError as e:
            if isinstance(e, NvmlUnavailable):
                raise
            raise NvmlUnavailable(str(e), e.code) from e
        try:
            yield NvmlSession(runner, timeout_s)
        finally:
            with contextlib.suppress(NvmlError):
                runner.call("nvmlShutdown", pynvml.nvmlShutdown)
    finally:
        runner.close()
        if sim is not None:
            sim.uninstall(installed)
