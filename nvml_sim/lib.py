"""A fake of NVML's C API, installed *underneath* nvidia-ml-py so production code runs unchanged.

How it plugs in: nvidia-ml-py resolves every C function with ``getattr(pynvml.nvmlLib, name)`` and
calls it with ctypes arguments. We set ``pynvml.nvmlLib`` to a ``FakeNvmlLibrary`` whose attributes
are ``ctypes.CFUNCTYPE`` function pointers wrapping Python code. Why this and not a Python object
with plain methods, or a C stub:

* The arguments go through libffi exactly as they would into ``libnvidia-ml.so``: pynvml's
  ``byref(...)``, ``create_string_buffer``, struct arrays and handle pointers arrive as raw
  addresses, and the fake writes results into pynvml's *own* ctypes structs at those addresses.
  A plain-Python fake would depend on how pynvml happens to build its arguments (``byref`` vs
  ``pointer``, private ``_obj`` attributes) and would break on a pynvml upgrade that a real driver
  would not notice; a wrong struct layout here fails the same way a real library would.
* Unknown functions raise ``AttributeError``, which pynvml turns into ``NVMLError_FunctionNotFound``
  — the same thing an older driver does — so the facade's fallbacks are exercised too.
* No compiler is needed (the C-stub route needs gcc at test time and cannot share Python state).

Handles are opaque integers that encode what they point at (GPU, MIG device, GPU instance,
compute instance, event set), so the fake keeps no handle table. A Python exception inside a
callback would make ctypes return 0 (success!), so every callback catches everything and returns
``NVML_ERROR_UNKNOWN`` instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from nvgpu.catalogue import (
    CI_PROFILE_BY_SLICES,
    GI_PROFILE_1_SLICE,
    GI_PROFILE_1_SLICE_REV1,
    GI_PROFILE_1_SLICE_REV2,
    GI_PROFILE_2_SLICE,
    GI_PROFILE_2_SLICE_REV1,
    GI_PROFILE_3_SLICE,
    GI_PROFILE_4_SLICE,
    GI_PROFILE_7_SLICE,
    GpuModel,
    MigProfile,
    parse_driver_version,
)
from nvml_sim.machines import MachineSpec
from nvml_sim.state import (
    FABRIC_MIN_COMPUTE_CAPABILITY,
    PAGE_RETIREMENT_ARCHITECTURES,
    SimComputeInstance,
    SimGpu,
    SimGpuInstance,
    SimState,
    SimStore,
    SimTelemetry,
    hold_clients,
)

log = logging.getLogger(__name__)

_P = ctypes.c_void_p
_U = ctypes.c_uint
_I = ctypes.c_int
_ULL = ctypes.c_ulonglong

_BASE = 0x7E57_0000_0000
_GPU_STRIDE = 0x1000
_MIG_OFF = 0x100  # + gi*8 + ci
_CI_OFF = 0x400  # + gi*8 + ci
_GI_OFF = 0x800  # + gi
_EVENT_BASE = 0x7E58_0000_0000
_WHOLE_GPU = 0xFFFFFFFF
_NVSWITCH_PCI_ID = {"ampere": 0x1AF110DE, "hopper": 0x22A310DE}
#: nvmlDeviceGetArchitecture by the catalogue's family word; nvml.h has NVML_DEVICE_ARCH_BLACKWELL (10) for
#: the B200/GB200/B300 and the RTX PRO 6000 alike (compute 10.x and 12.0, both GFD's "blackwell").
_ARCH = {"turing": pynvml.NVML_DEVICE_ARCH_TURING, "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
         "ada-lovelace": pynvml.NVML_DEVICE_ARCH_ADA, "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
         "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL}
_INIT_ERRORS = {"driver-not-loaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                "library-not-found": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
                "lib-rm-version-mismatch": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
                "no-permission": pynvml.NVML_ERROR_NO_PERMISSION}
_EVENT_BITS = {"xid": pynvml.nvmlEventTypeXidCriticalError,
               "double-bit-ecc": pynvml.nvmlEventTypeDoubleBitEccError,
               "single-bit-ecc": pynvml.nvmlEventTypeSingleBitEccError}
_SUPPORTED_EVENTS = sum(_EVENT_BITS.values())
_FABRIC_STATES = {"not-started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
                  "in-progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
                  "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED}
#: ``nvmlGpuFabricInfoV`` struct versions the fake fills: v2 and v3 (v3 adds ``healthSummary``).
_FABRIC_V_STRUCTS: dict[int, Any] = {pynvml.nvmlGpuFabricInfo_v2: pynvml.c_nvmlGpuFabricInfo_v2_t,
                                     pynvml.nvmlGpuFabricInfo_v3: pynvml.c_nvmlGpuFabricInfo_v3_t}
#: ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` and the first driver that answers it (NVML API changelog, "Changes
#: between v560 and v565": "Added new fieldId to query GPU recovery action").
RECOVERY_ACTION_FIELD = 230
RECOVERY_ACTION_SINCE = "565.57.01"
#: The environment variable by which a simulated caller holds the MIG monitor capability (see
#: ``SimState.mig_monitor_required``): nvidia-container-toolkit mounts the monitor capability's device
#: (``/dev/nvidia-caps/nvidia-cap2``) into a container that sets it to ``all`` and has CAP_SYS_ADMIN
#: (NVIDIA/nvidia-container-toolkit ``TestMigCapsValidate``: "errors when requested in a non-privileged
#: container"), so a process that sees ``all`` here is one the runtime gave the capability to.
MIG_MONITOR_ENV = "NVIDIA_MIG_MONITOR_DEVICES"
#: How long a "hung" GPU blocks a call before giving up on its own (keeps leaked threads bounded).
HANG_LIMIT_S = 30.0
#: The first driver whose libnvidia-ml.so exports the function: a simulated machine whose driver
#: version is older lacks it (``getattr`` fails, which nvidia-ml-py reports as
#: NVMLError_FunctionNotFound, as with a real old driver). The process-listing ``_v3`` symbols came
#: with 510.39.01 (nvidia-settings b2f0e7f); the ``_v2`` ones with the MIG-era 450 drivers (440.33
#: lacks them, pynvml issue #43); the unversioned ones (v1 struct) are in every driver.
FUNCTION_SINCE: dict[str, str] = {
    "nvmlDeviceGetComputeRunningProcesses_v3": "510.39.01",
    "nvmlDeviceGetGraphicsRunningProcesses_v3": "510.39.01",
    "nvmlDeviceGetComputeRunningProcesses_v2": "450.51.05",
    "nvmlDeviceGetGraphicsRunningProcesses_v2": "450.51.05",
}


class _ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _Ret(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class _Handle:
    kind: str  # gpu | mig | gi | ci
    gpu: int
    gi: int = 0
    ci: int = 0


def _gpu_handle(i: int) -> int:
    return _BASE + (i + 1) * _GPU_STRIDE


def _mig_handle(i: int, gi: int, ci: int) -> int:
    return _gpu_handle(i) + _MIG_OFF + gi * 8 + ci


def _gi_handle(i: int, gi: int) -> int:
    return _gpu_handle(i) + _GI_OFF + gi


def _ci_handle(i: int, gi: int, ci: int) -> int:
    return _gpu_handle(i) + _CI_OFF + gi * 8 + ci


def _decode(h: int | None) -> _Handle:
    if h is None or h < _BASE + _GPU_STRIDE or h >= _EVENT_BASE:
        raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    gpu, off = divmod(h - _BASE, _GPU_STRIDE)
    gpu -= 1
    if off == 0:
        return _Handle("gpu", gpu)
    if _MIG_OFF <= off < _CI_OFF:
        gi, ci = divmod(off - _MIG_OFF, 8)
        return _Handle("mig", gpu, gi, ci)
    if _CI_OFF <= off < _GI_OFF:
        gi, ci = divmod(off - _CI_OFF, 8)
        return _Handle("ci", gpu, gi, ci)
    if _GI_OFF <= off < _GI_OFF + 0x100:
        return _Handle("gi", gpu, off - _GI_OFF)
    raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _put(addr: int | None, ctype: Any, value: Any) -> None:
    if addr is None:
        raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    ctype.from_address(addr).value = value


def _put_str(addr: int | None, size: int, text: str) -> None:
    data = text.encode() + b"\0"
    if addr is None:
        raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if len(data) > size:
        raise _Ret(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(addr, data, len(data))


def _set_ptr(addr: int | None, value: int) -> None:
    _put(addr, ctypes.c_void_p, value)


#: Copy engines, decoders, encoders, JPEG and OFA engines per GPU-instance profile enum, by model:
#: NVIDIA's MIG tables as go-nvml's mock GPUs carry them (pkg/nvml/mock/gpus, v0.13.4-1), replacing
#: shape-based guesses that disagreed with them (copy engines per memory slice, too few NVDECs). The
#: A100-40GB media rows agree with the MIG guide notes in shared/reference (no NVDEC on 1g.5gb; +me
#: adds NVDEC, JPEG and OFA). A compute instance shares its GPU instance's engines.
_AMPERE_80GB_ENGINES = {GI_PROFILE_1_SLICE: (1, 1, 0, 0, 0), GI_PROFILE_1_SLICE_REV1: (1, 1, 0, 1, 1),
                        GI_PROFILE_1_SLICE_REV2: (1, 1, 0, 0, 0), GI_PROFILE_2_SLICE: (2, 1, 0, 0, 0),
                        GI_PROFILE_3_SLICE: (3, 2, 0, 0, 0), GI_PROFILE_4_SLICE: (4, 2, 0, 0, 0),
                        GI_PROFILE_7_SLICE: (7, 5, 0, 1, 1)}
#: The mock's H100/H200 rows are the same except that its whole-GPU profile lists no JPEG and no OFA
#: engine. H100/H200 have both, so the row keeps one of each (the Hopper rows are unverified on hardware).
_HOPPER_ENGINES = _AMPERE_80GB_ENGINES
_ENGINES: dict[str, dict[int, tuple[int, int, int, int, int]]] = {
    "A100-40GB": {**_AMPERE_80GB_ENGINES, GI_PROFILE_1_SLICE: (1, 0, 0, 0, 0)},  # 1g.5gb: no NVDEC
    "A100-80GB": _AMPERE_80GB_ENGINES,
    "H100-80GB": _HOPPER_ENGINES,
    "H200-141GB": _HOPPER_ENGINES,
    "A30-24GB": {GI_PROFILE_1_SLICE: (1, 0, 0, 0, 0), GI_PROFILE_1_SLICE_REV1: (1, 1, 0, 1, 1),
                 GI_PROFILE_2_SLICE: (2, 2, 0, 0, 0), GI_PROFILE_2_SLICE_REV1: (2, 2, 0, 1, 1),
                 GI_PROFILE_4_SLICE: (4, 4, 0, 1, 1)},
}


def _engines(model: GpuModel, p: MigProfile) -> tuple[int, int, int, int, int]:
    """Copy engines, decoders, encoders, JPEG, OFA of a GI profile (NVIDIA's tables, ``_ENGINES``).

    A model without a table gets one copy engine per compute slice and no media engines: what
    every table above has in common, not a claim about that GPU.
    """
    return _ENGINES.get(model.key, {}).get(p.gi_profile, (p.compute_slices, 0, 0, 0, 0))


class FakeNvmlLibrary:
    """Stands in for ``ctypes.CDLL("libnvidia-ml.so.1")`` on one simulated machine."""

    def __init__(self, store: SimStore) -> None:
        self.store = store
        self.spec: MachineSpec = store.read().spec
        self._init_count = 0
        self._clients_fd: int | None = None
        self._lock = threading.RLock()
        self._pointers: dict[str, Any] = {}
        self._strings: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._event_sets: dict[int, dict[str, Any]] = {}
        self._next_event_set = 1
        self._table: dict[str, tuple[tuple[Any, ...], Callable[..., int | None], Any]] = {
            "nvmlInitWithFlags": ((_U,), self.init, _I),
            "nvmlShutdown": ((), self.shutdown, _I),
            "nvmlErrorString": ((_I,), self.error_string, _P),
            "nvmlSystemGetDriverVersion": ((_P, _U), self.driver_version, _I),
            "nvmlSystemGetNVMLVersion": ((_P, _U), self.nvml_version, _I),
            "nvmlSystemGetCudaDriverVersion": ((_P,), self.cuda_version, _I),
            "nvmlSystemGetCudaDriverVersion_v2": ((_P,), self.cuda_version, _I),
            "nvmlDeviceGetCount_v2": ((_P,), self.device_count, _I),
            "nvmlDeviceGetHandleByIndex_v2": ((_U, _P), self.handle_by_index, _I),
            "nvmlDeviceGetHandleByUUID": ((_P, _P), self.handle_by_uuid, _I),
            "nvmlDeviceGetHandleByPciBusId_v2": ((_P, _P), self.handle_by_bus_id, _I),
            "nvmlDeviceGetIndex": ((_P, _P), self.device_index, _I),
            "nvmlDeviceGetName": ((_P, _P, _U), self.device_name, _I),
            "nvmlDeviceGetUUID": ((_P, _P, _U), self.device_uuid, _I),
            "nvmlDeviceGetMinorNumber": ((_P, _P), self.minor_number, _I),
            "nvmlDeviceGetPciInfo_v3": ((_P, _P), self.pci_info, _I),
            "nvmlDeviceGetMemoryInfo": ((_P, _P), self.memory_info, _I),
            "nvmlDeviceGetMemoryInfo_v2": ((_P, _P), self.memory_info_v2, _I),
            "nvmlDeviceGetCudaComputeCapability": ((_P, _P, _P), self.compute_capability, _I),
            "nvmlDeviceGetArchitecture": ((_P, _P), self.architecture, _I),
            "nvmlDeviceGetNumaNodeId": ((_P, _P), self.numa_node, _I),
            "nvmlDeviceGetVirtualizationMode": ((_P, _P), self.virtualization_mode, _I),
            "nvmlDeviceGetComputeMode": ((_P, _P), self.get_compute_mode, _I),
            "nvmlDeviceGetBrand": ((_P, _P), self.brand, _I),
            "nvmlDeviceGetSerial": ((_P, _P, _U), self.serial, _I),
            "nvmlDeviceGetVbiosVersion": ((_P, _P, _U), self.vbios_version, _I),
            "nvmlDeviceGetPersistenceMode": ((_P, _P), self.persistence_mode, _I),
            "nvmlDeviceSetComputeMode": ((_P, _U), self.set_compute_mode, _I),
            "nvmlDeviceSetPersistenceMode": ((_P, _U), self.set_persistence_mode, _I),
            "nvmlDeviceGetMigMode": ((_P, _P, _P), self.get_mig_mode, _I),
            "nvmlDeviceSetMigMode": ((_P, _U, _P), self.set_mig_mode, _I),
            "nvmlDeviceGetMaxMigDeviceCount": ((_P, _P), self.max_mig_devices, _I),
            "nvmlDeviceGetMigDeviceHandleByIndex": ((_P, _U, _P), self.mig_handle_by_index, _I),
            "nvmlDeviceIsMigDeviceHandle": ((_P, _P), self.is_mig_handle, _I),
            "nvmlDeviceGetGpuInstanceId": ((_P, _P), self.mig_gi_id, _I),
            "nvmlDeviceGetComputeInstanceId": ((_P, _P), self.mig_ci_id, _I),
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": ((_P, _P), self.mig_parent, _I),
            "nvmlDeviceGetGpuInstanceProfileInfo": ((_P, _U, _P), self.gi_profile_info_v1, _I),
            "nvmlDeviceGetGpuInstanceProfileInfoV": ((_P, _U, _P), self.gi_profile_info_v2, _I),
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2": ((_P, _U, _P, _P), self.possible_placements, _I),
            "nvmlDeviceGetGpuInstanceRemainingCapacity": ((_P, _U, _P), self.gi_remaining, _I),
            "nvmlDeviceCreateGpuInstance": ((_P, _U, _P), self.create_gi, _I),
            "nvmlDeviceCreateGpuInstanceWithPlacement": ((_P, _U, _P, _P), self.create_gi_placed, _I),
            "nvmlDeviceGetGpuInstances": ((_P, _U, _P, _P), self.get_gis, _I),
            "nvmlDeviceGetGpuInstanceById": ((_P, _U, _P), self.gi_by_id, _I),
            "nvmlGpuInstanceGetInfo": ((_P, _P), self.gi_info, _I),
            "nvmlGpuInstanceDestroy": ((_P,), self.destroy_gi, _I),
            "nvmlGpuInstanceGetComputeInstanceProfileInfo": ((_P, _U, _U, _P), self.ci_profile_info_v1, _I),
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV": ((_P, _U, _U, _P), self.ci_profile_info_v2, _I),
            "nvmlGpuInstanceGetComputeInstanceRemainingCapacity": ((_P, _U, _P), self.ci_remaining, _I),
            "nvmlGpuInstanceCreateComputeInstance": ((_P, _U, _P), self.create_ci, _I),
            "nvmlGpuInstanceGetComputeInstances": ((_P, _U, _P, _P), self.get_cis, _I),
            "nvmlGpuInstanceGetComputeInstanceById": ((_P, _U, _P), self.ci_by_id, _I),
            "nvmlComputeInstanceGetInfo_v2": ((_P, _P), self.ci_info, _I),
            "nvmlComputeInstanceDestroy": ((_P,), self.destroy_ci, _I),
            "nvmlDeviceGetNvLinkState": ((_P, _U, _P), self.nvlink_state, _I),
            "nvmlDeviceGetNvLinkRemotePciInfo_v2": ((_P, _U, _P), self.nvlink_remote_pci, _I),
            "nvmlDeviceGetNvLinkRemoteDeviceType": ((_P, _U, _P), self.nvlink_remote_type, _I),
            "nvmlDeviceGetTopologyCommonAncestor": ((_P, _P, _P), self.common_ancestor, _I),
            "nvmlDeviceGetGpuFabricInfo": ((_P, _P), self.fabric_info, _I),
            "nvmlDeviceGetGpuFabricInfoV": ((_P, _P), self.fabric_info_v, _I),
            "nvmlDeviceGetComputeRunningProcesses_v3": ((_P, _P, _P), self.compute_processes, _I),
            "nvmlDeviceGetGraphicsRunningProcesses_v3": ((_P, _P, _P), self.graphics_processes, _I),
            "nvmlDeviceGetComputeRunningProcesses_v2": ((_P, _P, _P), self.compute_processes, _I),
            "nvmlDeviceGetGraphicsRunningProcesses_v2": ((_P, _P, _P), self.graphics_processes, _I),
            "nvmlDeviceGetComputeRunningProcesses": ((_P, _P, _P), self.compute_processes_v1, _I),
            "nvmlDeviceGetGraphicsRunningProcesses": ((_P, _P, _P), self.graphics_processes, _I),
            "nvmlDeviceGetTemperature": ((_P, _U, _P), self.temperature, _I),
            "nvmlDeviceGetPowerUsage": ((_P, _P), self.power_usage, _I),
            "nvmlDeviceGetTotalEnergyConsumption": ((_P, _P), self.energy, _I),
            "nvmlDeviceGetClockInfo": ((_P, _U, _P), self.clock_info, _I),
            "nvmlDeviceGetUtilizationRates": ((_P, _P), self.utilization, _I),
            "nvmlDeviceGetEncoderUtilization": ((_P, _P, _P), self.encoder_utilization, _I),
            "nvmlDeviceGetDecoderUtilization": ((_P, _P, _P), self.decoder_utilization, _I),
            "nvmlDeviceGetPcieReplayCounter": ((_P, _P), self.pcie_replays, _I),
            "nvmlDeviceGetPcieThroughput": ((_P, _U, _P), self.pcie_throughput, _I),
            "nvmlDeviceGetTotalEccErrors": ((_P, _U, _U, _P), self.total_ecc_errors, _I),
            "nvmlDeviceGetRemappedRows": ((_P, _P, _P, _P, _P), self.remapped_rows, _I),
            "nvmlDeviceGetRetiredPagesPendingStatus": ((_P, _P), self.retired_pages_pending, _I),
            "nvmlDeviceGetFieldValues": ((_P, ctypes.c_int32, _P), self.field_values, _I),
            "nvmlDeviceGetCurrentClocksEventReasons": ((_P, _P), self.clock_events, _I),
            "nvmlEventSetCreate": ((_P,), self.event_set_create, _I),
            "nvmlDeviceRegisterEvents": ((_P, _ULL, _P), self.register_events, _I),
            "nvmlDeviceGetSupportedEventTypes": ((_P, _P), self.supported_events, _I),
            "nvmlEventSetWait_v2": ((_P, _P, _U), self.event_set_wait, _I),
            "nvmlEventSetFree": ((_P,), self.event_set_free, _I),
        }

    # -- the CDLL surface --------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._table or self._absent(name):
            raise AttributeError(name)
        with self._lock:
            fn = self._pointers.get(name)
            if fn is None:
                argtypes, impl, restype = self._table[name]
                fn = ctypes.CFUNCTYPE(restype, *argtypes)(self._guard(name, impl, restype))
                self._pointers[name] = fn
            return fn

    def _guard(self, name: str, impl: Callable[..., int | None], restype: Any) -> Callable[..., int | None]:
        def call(*args: Any) -> int | None:
            try:
                if name not in ("nvmlInitWithFlags", "nvmlErrorString") and self._init_count == 0:
                    return int(pynvml.NVML_ERROR_UNINITIALIZED)
                if self._absent(name):
                    # Looked up before the driver was "downgraded" (nvidia-ml-py caches pointers).
                    return int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
                injected = self._injected_error(name, args)
                if injected is not None:
                    return injected
                result = impl(*args)
                return pynvml.NVML_SUCCESS if restype is _I and result is None else result
            except _Ret as r:
                return r.code
            except Exception:
                log.exception("simulated NVML function failed fn=%s", name)
                return pynvml.NVML_ERROR_UNKNOWN if restype is _I else None

        return call

    def _absent(self, name: str) -> bool:
        """Whether the simulated library lacks ``name``: removed on purpose, or newer than its driver."""
        state = self._state()
        if name in state.missing_functions:
            return True
        since = FUNCTION_SINCE.get(name)
        return since is not None and parse_driver_version(self._driver()) < parse_driver_version(since)

    def _injected_error(self, name: str, args: tuple[Any, ...]) -> int | None:
        """The return code injected for ``name`` on the GPU its first argument names (``fail_call``)."""
        if not args or not isinstance(args[0], int):
            return None
        if name.startswith("nvmlDeviceGetHandleByIndex"):
            index = args[0]
        else:
            try:
                index = _decode(args[0]).gpu
            except _Ret:
                return None
        state = self._state()
        if not 0 <= index < len(state.gpus):
            return None
        errors = state.gpus[index].call_errors
        if not errors:
            return None
        base = name.rsplit("_v", 1)[0] if name.rsplit("_v", 1)[-1].isdigit() else name
        code = errors.get(name, errors.get(base))
        return None if code is None else int(code)

    # -- state helpers -----------------------------------------------------------------------
    def _state(self) -> SimState:
        return self.store.read()

    def _gpu(self, handle: int | None, kinds: tuple[str, ...] = ("gpu",)) -> tuple[_Handle, SimGpu]:
        h = _decode(handle)
        if h.kind not in kinds:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        state = self._state()
        if not 0 <= h.gpu < len(state.gpus):
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = state.gpus[h.gpu]
        self._check_alive(h.gpu, gpu)
        if h.kind in ("mig", "gi", "ci"):
            gi = self._find_gi(gpu, h.gi)
            if h.kind in ("mig", "ci") and not any(c.id == h.ci for c in gi.compute_instances):
                raise _Ret(pynvml.NVML_ERROR_NOT_FOUND)
        return h, gpu

    def _check_alive(self, index: int, gpu: SimGpu) -> None:
        if gpu.hang:
            deadline = time.monotonic() + HANG_LIMIT_S
            while time.monotonic() < deadline and self._state().gpus[index].hang:
                time.sleep(0.01)
            gpu = self._state().gpus[index]
        if gpu.lost:
            raise _Ret(pynvml.NVML_ERROR_GPU_IS_LOST)

    @staticmethod
    def _find_gi(gpu: SimGpu, gi_id: int) -> SimGpuInstance:
        if not gpu.mig_current:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for gi in gpu.instances:
            if gi.id == gi_id:
                return gi
        raise _Ret(pynvml.NVML_ERROR_NOT_FOUND)

    @property
    def _model(self) -> GpuModel:
        return self.spec.model

    def _profile(self, gi_profile: int) -> MigProfile:
        mig = self._model.mig
        if mig is None:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for p in mig.profiles:
            if p.gi_profile == gi_profile:
                return p
        raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _profile_by_id(self, profile_id: int) -> MigProfile:
        mig = self._model.mig
        if mig is None:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for p in mig.profiles:
            if p.profile_id == profile_id:
                return p
        raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_devices(self, gpu: SimGpu) -> list[tuple[SimGpuInstance, int]]:
        out = []
        for gi in sorted(gpu.instances, key=lambda g: g.id):
            for ci in sorted(gi.compute_instances, key=lambda c: c.id):
                out.append((gi, ci.id))
        return out

    def _driver(self) -> str:
        return self._state().driver_version or self.spec.driver_version

    # -- init / system -----------------------------------------------------------------------
    def init(self, flags: int) -> int | None:
        state = self._state()
        if state.init_error is not None:
            return int(_INIT_ERRORS[state.init_error])
        with self._lock:
            self._init_count += 1
            if self._init_count == 1:
                self._hold_clients()
        return None

    def shutdown(self) -> None:
        with self._lock:
            self._init_count = max(0, self._init_count - 1)
            if self._init_count == 0 and self._clients_fd is not None:
                os.close(self._clients_fd)  # the process's last session ends: its hold on the GPUs goes
                self._clients_fd = None

    @property
    def initialised(self) -> bool:
        """Whether a session of this process has NVML initialised."""
        with self._lock:
            return self._init_count > 0

    def _hold_clients(self) -> None:
        """While NVML is initialised, this process holds the GPUs open as a real NVML client does: a shared
        ``flock`` on the machine's clients file, which the simulated ``nvidia-smi -r`` finds (it refuses a
        reset "In use by another client"; mig-parted shuts NVML down before resetting, ``cmd/nvidia-mig-parted/
        apply/mode.go``)."""
        if self.store.path is None or self._clients_fd is not None:
            return
        self._clients_fd = hold_clients(self.store.path)

    def error_string(self, code: int) -> int | None:
        text = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}.get(
            code, f"NVML error {code}")
        with self._lock:
            buf = self._strings.get(code)
            if buf is None:
                buf = ctypes.create_string_buffer(text.encode())
                self._strings[code] = buf
        return ctypes.addressof(buf)

    def driver_version(self, buf: int | None, size: int) -> None:
        _put_str(buf, size, self._driver())

    def nvml_version(self, buf: int | None, size: int) -> None:
        cuda = self.spec.cuda_driver_version // 1000
        _put_str(buf, size, f"{cuda}.{self._driver()}")

    def cuda_version(self, out: int | None) -> None:
        _put(out, ctypes.c_int, self.spec.cuda_driver_version)

    def device_count(self, out: int | None) -> None:
        _put(out, ctypes.c_uint, self.spec.gpu_count)

    def handle_by_index(self, index: int, out: int | None) -> None:
        if index >= self.spec.gpu_count:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _set_ptr(out, _gpu_handle(index))

    def handle_by_uuid(self, text: int | None, out: int | None) -> None:
        if text is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        wanted = ctypes.string_at(text).decode()
        state = self._state()
        for i, gpu in enumerate(state.gpus):
            if self.spec.gpu_uuid(i) == wanted:
                _set_ptr(out, _gpu_handle(i))
                return
            for gi, ci in self._mig_devices(gpu):
                if self.spec.mig_uuid(i, gi.id, ci) == wanted:
                    _set_ptr(out, _mig_handle(i, gi.id, ci))
                    return
        raise _Ret(pynvml.NVML_ERROR_NOT_FOUND)

    def handle_by_bus_id(self, text: int | None, out: int | None) -> None:
        if text is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        wanted = ctypes.string_at(text).decode().lower()
        for i, bus in enumerate(self.spec.bus_ids):
            if bus.lower().endswith(wanted.split(":", 1)[-1]) and int(wanted.split(":")[0], 16) == 0:
                _set_ptr(out, _gpu_handle(i))
                return
        raise _Ret(pynvml.NVML_ERROR_NOT_FOUND)

    # -- device queries ----------------------------------------------------------------------
    def device_index(self, handle: int | None, out: int | None) -> None:
        h, _ = self._gpu(handle)
        _put(out, ctypes.c_uint, h.gpu)

    def device_name(self, handle: int | None, buf: int | None, size: int) -> None:
        h, gpu = self._gpu(handle, ("gpu", "mig"))
        name = gpu.name or self.spec.product_name
        if h.kind == "mig":
            name = f"{name} MIG {self._mig_profile_name(gpu, h.gi, h.ci)}"
        _put_str(buf, size, name)

    def _mig_profile_name(self, gpu: SimGpu, gi_id: int, ci_id: int) -> str:
        gi = self._find_gi(gpu, gi_id)
        profile = self._profile(gi.profile)
        ci = next(c for c in gi.compute_instances if c.id == ci_id)
        return profile.name if ci.slices == profile.compute_slices else f"{ci.slices}c.{profile.name}"

    def device_uuid(self, handle: int | None, buf: int | None, size: int) -> None:
        h, _ = self._gpu(handle, ("gpu", "mig"))
        text = self.spec.gpu_uuid(h.gpu) if h.kind == "gpu" else self.spec.mig_uuid(h.gpu, h.gi, h.ci)
        _put_str(buf, size, text)

    def minor_number(self, handle: int | None, out: int | None) -> None:
        h, _ = self._gpu(handle)
        _put(out, ctypes.c_uint, h.gpu)

    def pci_info(self, handle: int | None, out: int | None) -> None:
        h, gpu = self._gpu(handle)
        device = gpu.pci_device_id if gpu.pci_device_id is not None else self.spec.pci_device_id
        self._fill_pci(out, self.spec.bus_ids[h.gpu], (device << 16) | 0x10DE, self.spec.pci_subsystem_id)

    @staticmethod
    def _fill_pci(out: int | None, bus_id: str, device_id: int, subsystem: int) -> None:
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = pynvml.nvmlPciInfo_t.from_address(out)
        domain, bus, rest = bus_id.split(":")
        dev = rest.split(".")[0]
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
        info.busId = bus_id.encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(dev, 16)
        info.pciDeviceId = device_id
        info.pciSubSystemId = subsystem

    def _memory_mib(self, h: _Handle, gpu: SimGpu) -> int:
        if h.kind == "mig":
            return self._profile(self._find_gi(gpu, h.gi).profile).memory_mib
        return self._model.memory_mib

    def _used_mib(self, h: _Handle, gpu: SimGpu) -> int:
        procs = [p for p in gpu.processes if h.kind == "gpu" or (p.gi_id, p.ci_id) == (h.gi, h.ci)]
        return sum(p.used_mib or 0 for p in procs)

    def _check_mig_monitor(self, gpu: SimGpu) -> None:
        """NO_PERMISSION on a GPU in MIG mode for a caller without the MIG monitor capability, where the
        machine checks it (``SimState.mig_monitor_required``; the caller's side: ``MIG_MONITOR_ENV``)."""
        if gpu.mig_current and self._state().mig_monitor_required and os.environ.get(MIG_MONITOR_ENV) != "all":
            raise _Ret(pynvml.NVML_ERROR_NO_PERMISSION)

    def memory_info(self, handle: int | None, out: int | None) -> None:
        h, gpu = self._gpu(handle, ("gpu", "mig"))
        if h.kind == "gpu":  # "error getting parent memory info: Insufficient Permissions" (k8s-device-plugin#1683)
            self._check_mig_monitor(gpu)
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        mem = pynvml.c_nvmlMemory_t.from_address(out)
        mem.total = self._memory_mib(h, gpu) << 20
        mem.used = self._used_mib(h, gpu) << 20
        mem.free = mem.total - mem.used

    def memory_info_v2(self, handle: int | None, out: int | None) -> None:
        h, gpu = self._gpu(handle, ("gpu", "mig"))
        if h.kind == "gpu":
            self._check_mig_monitor(gpu)
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        mem = pynvml.c_nvmlMemory_v2_t.from_address(out)
        mem.total = self._memory_mib(h, gpu) << 20
        mem.used = self._used_mib(h, gpu) << 20
        mem.reserved = 0
        mem.free = mem.total - mem.used

    def compute_capability(self, handle: int | None, major: int | None, minor: int | None) -> None:
        _, gpu = self._gpu(handle, ("gpu", "mig"))
        cc = gpu.compute_capability or self._model.compute_capability
        _put(major, ctypes.c_int, cc[0])
        _put(minor, ctypes.c_int, cc[1])

    def architecture(self, handle: int | None, out: int | None) -> None:
        _, gpu = self._gpu(handle)
        arch = _ARCH.get(self._model.architecture, pynvml.NVML_DEVICE_ARCH_UNKNOWN)
        if gpu.compute_capability is not None and gpu.compute_capability[0] == 5:
            arch = pynvml.NVML_DEVICE_ARCH_MAXWELL
        _put(out, ctypes.c_uint, arch)

    def numa_node(self, handle: int | None, out: int | None) -> None:
        h, _ = self._gpu(handle)
        _put(out, ctypes.c_int, self.spec.numa_nodes[h.gpu])

    def virtualization_mode(self, handle: int | None, out: int | None) -> None:
        self._gpu(handle)
        _put(out, ctypes.c_uint, self._state().virtualization_mode)

    def brand(self, handle: int | None, out: int | None) -> None:
        """``nvmlDeviceGetBrand``: the machine's brand (``MachineSpec.brand``) or the GPU's override; a MIG
        device answers its parent's."""
        _, gpu = self._gpu(handle, ("gpu", "mig"))
        _put(out, ctypes.c_uint, self.spec.brand if gpu.brand is None else gpu.brand)

    def serial(self, handle: int | None, buf: int | None, size: int) -> None:
        h, _ = self._gpu(handle)
        _put_str(buf, size, self.spec.serial(h.gpu))

    def vbios_version(self, handle: int | None, buf: int | None, size: int) -> None:
        self._gpu(handle)
        _put_str(buf, size, self.spec.vbios_version)

    def persistence_mode(self, handle: int | None, out: int | None) -> None:
        _, gpu = self._gpu(handle)
        on = self.spec.persistence_mode if gpu.persistence_mode is None else gpu.persistence_mode
        _put(out, ctypes.c_uint, pynvml.NVML_FEATURE_ENABLED if on else pynvml.NVML_FEATURE_DISABLED)

    def set_persistence_mode(self, handle: int | None, mode: int) -> None:
        """``nvmlDeviceSetPersistenceMode`` (Linux only, root only: inject NO_PERMISSION with
        ``fail_call(i, "nvmlDeviceSetPersistenceMode", 4)``); INVALID_ARGUMENT for a mode that is neither
        ``NVML_FEATURE_ENABLED`` nor ``NVML_FEATURE_DISABLED`` (nvml.h)."""
        h, _ = self._gpu(handle)
        if mode not in (pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_ENABLED):
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self.store.mutate() as state:
            state.gpus[h.gpu].persistence_mode = mode == pynvml.NVML_FEATURE_ENABLED

    # -- compute mode -------------------------------------------------------------------------
    def get_compute_mode(self, handle: int | None, out: int | None) -> None:
        """The GPU's ``nvmlComputeMode_t``; a MIG device answers its parent's."""
        _, gpu = self._gpu(handle, ("gpu", "mig"))
        _put(out, ctypes.c_uint, gpu.compute_mode)

    def set_compute_mode(self, handle: int | None, mode: int) -> None:
        """``nvmlDeviceSetComputeMode``: whole GPUs only (a MIG handle is INVALID_ARGUMENT), and
        ``NVML_COMPUTEMODE_EXCLUSIVE_THREAD`` (1) is refused: NVML removed it (nvml.h, "Support Removed").
        It needs root: inject NO_PERMISSION with ``fail_call(i, "nvmlDeviceSetComputeMode", 4)`` for an
        unprivileged container. The mode persists in the state, so a restarted agent reads what it set."""
        h, _ = self._gpu(handle)
        if mode not in (pynvml.NVML_COMPUTEMODE_DEFAULT, pynvml.NVML_COMPUTEMODE_PROHIBITED,
                        pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS):
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self.store.mutate() as state:
            state.gpus[h.gpu].compute_mode = int(mode)

    # -- MIG mode ----------------------------------------------------------------------------
    def get_mig_mode(self, handle: int | None, current: int | None, pending: int | None) -> None:
        _, gpu = self._gpu(handle)
        if self._model.mig is None:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _put(current, ctypes.c_uint, int(gpu.mig_current))
        _put(pending, ctypes.c_uint, int(gpu.mig_pending))

    def set_mig_mode(self, handle: int | None, mode: int, status: int | None) -> None:
        h, gpu = self._gpu(handle)
        if self._model.mig is None:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mode not in (0, 1):
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not parse_driver_version(self._driver()) >= parse_driver_version(self._model.mig.min_driver):
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.instances and not mode:
            raise _Ret(pynvml.NVML_ERROR_IN_USE)
        with self.store.mutate() as state:
            g = state.gpus[h.gpu]
            g.mig_pending = bool(mode)
            # The mode flips at once unless something holds the GPU: then it stays pending until a reset (NVML
            # resets the GPU itself when it can: nvml.h, nvmlDeviceSetMigMode; mig-parted's mock A100 keeps the
            # mode pending while its "driver is busy", pkg/mig/mode/nvml_test.go). On an A100 the host's GPU
            # clients (DCGM, NVSM: mig-parted's hooks.sh stops them before a mode change) hold it too; Hopper
            # changes MIG mode without a reset (NVML_FI_DEV_IS_RESETLESS_MIG_SUPPORTED, NVML API changelog
            # v530 to v535), so only processes running on it keep its mode pending.
            resetless = self._model.architecture not in ("ampere",)
            # An A100 passed through to a VM needs the VM rebooted ("VM reboot is required", nvml.h).
            held = g.processes or g.reset_blocked or (not resetless and (any(state.host_services.values())
                                                                         or state.virtualization_mode == 1))
            if not held:
                g.mig_current = g.mig_pending
                result = pynvml.NVML_SUCCESS
            else:
                result = pynvml.NVML_ERROR_IN_USE
        _put(status, ctypes.c_uint, result)

    def max_mig_devices(self, handle: int | None, out: int | None) -> None:
        _, _gpu = self._gpu(handle)
        mig = self._model.mig
        if mig is None:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _put(out, ctypes.c_uint, mig.compute_slices)

    def mig_handle_by_index(self, handle: int | None, index: int, out: int | None) -> None:
        h, gpu = self._gpu(handle)
        if not gpu.mig_current:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mig = self._model.mig
        if mig is None or index >= mig.compute_slices:  # past nvmlDeviceGetMaxMigDeviceCount
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = self._mig_devices(gpu)
        if index >= len(devices):
            # An empty slot: NOT_FOUND as nvml.h documents it, or INVALID_ARGUMENT as drivers answer too
            # (go-nvlib skips both, pkg/nvlib/device/device.go VisitMigDevices): SimGpu.mig_empty_slot_error.
            raise _Ret(gpu.mig_empty_slot_error)
        gi, ci = devices[index]
        _set_ptr(out, _mig_handle(h.gpu, gi.id, ci))

    def is_mig_handle(self, handle: int | None, out: int | None) -> None:
        h = _decode(handle)
        _put(out, ctypes.c_uint, int(h.kind == "mig"))

    def mig_gi_id(self, handle: int | None, out: int | None) -> None:
        h, _ = self._gpu(handle, ("mig",))
        _put(out, ctypes.c_uint, h.gi)

    def mig_ci_id(self, handle: int | None, out: int | None) -> None:
        h, _ = self._gpu(handle, ("mig",))
        _put(out, ctypes.c_uint, h.ci)

    def mig_parent(self, handle: int | None, out: int | None) -> None:
        h, _ = self._gpu(handle, ("mig",))
        _set_ptr(out, _gpu_handle(h.gpu))

    # -- GPU instances -----------------------------------------------------------------------
    def _fill_gi_profile(self, out: int | None, profile: MigProfile, v2: bool) -> None:
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info: Any = (pynvml.c_nvmlGpuInstanceProfileInfo_v2_t if v2 else pynvml.c_nvmlGpuInstanceProfileInfo_t
                     ).from_address(out)
        info.id = profile.profile_id
        info.isP2pSupported = 0
        info.sliceCount = profile.compute_slices
        info.instanceCount = profile.max_instances
        info.multiprocessorCount = profile.multiprocessors
        ce, dec, enc, jpeg, ofa = _engines(self._model, profile)
        info.copyEngineCount, info.decoderCount, info.encoderCount = ce, dec, enc
        info.jpegCount, info.ofaCount = jpeg, ofa
        info.memorySizeMB = profile.memory_mib
        if v2:
            info.name = f"MIG {profile.name}".encode()

    def _enum_profile(self, handle: int | None, profile: int) -> MigProfile:
        """The GI profile for an NVML_GPU_INSTANCE_PROFILE_* value. Past the last enum value the answer
        is INVALID_ARGUMENT, not NOT_SUPPORTED: nvml.h tells callers to enumerate profiles from 0
        "until the API returns NVML_ERROR_INVALID_ARGUMENT" (go-nvml's mock does the same)."""
        self._gpu(handle)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._profile(profile)

    def gi_profile_info_v1(self, handle: int | None, profile: int, out: int | None) -> None:
        self._fill_gi_profile(out, self._enum_profile(handle, profile), v2=False)

    def gi_profile_info_v2(self, handle: int | None, profile: int, out: int | None) -> None:
        self._fill_gi_profile(out, self._enum_profile(handle, profile), v2=True)

    def _free_starts(self, gpu: SimGpu, profile: MigProfile) -> list[int]:
        """Starts where one more instance of ``profile`` could be created right now."""
        mig = self._model.mig
        assert mig is not None
        used = [False] * mig.memory_slices
        compute = 0
        same = 0
        media = 0
        for gi in gpu.instances:
            p = self._profile(gi.profile)
            for s in range(gi.start, gi.start + gi.size):
                used[s] = True
            compute += p.compute_slices
            same += p.profile_id == profile.profile_id
            media += p.media_extensions
        if compute + profile.compute_slices > mig.compute_slices or same >= profile.max_instances:
            return []
        if profile.media_extensions and media:
            return []
        return [s for s in profile.placement_starts
                if not any(used[i] for i in range(s, s + profile.memory_slices))]

    def possible_placements(self, handle: int | None, profile_id: int, out: int | None, count: int | None) -> None:
        self._gpu(handle)
        profile = self._profile_by_id(profile_id)
        starts = profile.placement_starts
        if count is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        n = ctypes.c_uint.from_address(count)
        if out is None:
            n.value = len(starts)
            return
        if n.value < len(starts):
            n.value = len(starts)
            raise _Ret(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        arr = (pynvml.c_nvmlGpuInstancePlacement_t * len(starts)).from_address(out)
        for i, s in enumerate(starts):
            arr[i].start, arr[i].size = s, profile.memory_slices
        n.value = len(starts)

    def gi_remaining(self, handle: int | None, profile_id: int, out: int | None) -> None:
        _h, gpu = self._gpu(handle)
        if not gpu.mig_current:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile_by_id(profile_id)
        probe = gpu.model_copy(deep=True)
        count = 0
        while True:
            starts = self._free_starts(probe, profile)
            if not starts:
                break
            probe.instances.append(SimGpuInstance(id=-1 - count, profile=profile.gi_profile, start=starts[0],
                                                  size=profile.memory_slices))
            count += 1
        _put(out, ctypes.c_uint, count)

    def _create_gi(self, handle: int | None, profile_id: int, start: int | None, out: int | None) -> None:
        h, gpu = self._gpu(handle)
        if not gpu.mig_current:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile_by_id(profile_id)
        with self.store.mutate() as state:
            g = state.gpus[h.gpu]
            starts = self._free_starts(g, profile)
            if start is not None:
                if start not in profile.placement_starts:
                    raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
                if start not in starts:
                    raise _Ret(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            elif not starts:
                raise _Ret(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            # Like NVML, fill from the end: the first 3g lands at 4:4, the first 1g at 6:1.
            chosen = start if start is not None else starts[-1]
            taken = {gi.id for gi in g.instances}
            mig = self._model.mig
            assert mig is not None
            # NVML gives the whole-GPU instance ID 0; smaller instances get the lowest free ID from 1.
            gi_id = 0 if profile.memory_slices == mig.memory_slices else 1
            while gi_id in taken:
                gi_id += 1
            g.instances.append(SimGpuInstance(id=gi_id, profile=profile.gi_profile, start=chosen,
                                              size=profile.memory_slices))
        _set_ptr(out, _gi_handle(h.gpu, gi_id))

    def create_gi(self, handle: int | None, profile_id: int, out: int | None) -> None:
        self._create_gi(handle, profile_id, None, out)

    def create_gi_placed(self, handle: int | None, profile_id: int, placement: int | None, out: int | None) -> None:
        if placement is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        p = pynvml.c_nvmlGpuInstancePlacement_t.from_address(placement)
        if p.size != self._profile_by_id(profile_id).memory_slices:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._create_gi(handle, profile_id, p.start, out)

    def get_gis(self, handle: int | None, profile_id: int, out: int | None, count: int | None) -> None:
        h, gpu = self._gpu(handle)
        if not gpu.mig_current:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._check_mig_monitor(gpu)
        profile = self._profile_by_id(profile_id)
        found = [gi for gi in sorted(gpu.instances, key=lambda g: g.id) if gi.profile == profile.gi_profile]
        if count is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        n = ctypes.c_uint.from_address(count)
        if out is not None:
            arr = (ctypes.c_void_p * max(len(found), 1)).from_address(out)
            for i, gi in enumerate(found):
                arr[i] = _gi_handle(h.gpu, gi.id)
        n.value = len(found)

    def gi_by_id(self, handle: int | None, gi_id: int, out: int | None) -> None:
        h, gpu = self._gpu(handle)
        self._check_mig_monitor(gpu)
        self._find_gi(gpu, gi_id)
        _set_ptr(out, _gi_handle(h.gpu, gi_id))

    def gi_info(self, handle: int | None, out: int | None) -> None:
        h, gpu = self._gpu(handle, ("gi",))
        gi = self._find_gi(gpu, h.gi)
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = pynvml.c_nvmlGpuInstanceInfo_t.from_address(out)
        ctypes.c_void_p.from_address(out).value = _gpu_handle(h.gpu)
        info.id = gi.id
        info.profileId = self._profile(gi.profile).profile_id
        info.placement.start, info.placement.size = gi.start, gi.size

    def destroy_gi(self, handle: int | None) -> None:
        h, gpu = self._gpu(handle, ("gi",))
        gi = self._find_gi(gpu, h.gi)
        if gi.compute_instances or any(p.gi_id == gi.id for p in gpu.processes):
            raise _Ret(pynvml.NVML_ERROR_IN_USE)
        with self.store.mutate() as state:
            g = state.gpus[h.gpu]
            g.instances = [x for x in g.instances if x.id != h.gi]

    # -- compute instances -------------------------------------------------------------------
    def _ci_slices(self, gi: SimGpuInstance, ci_profile: int) -> int:
        slices = {v: k for k, v in CI_PROFILE_BY_SLICES.items()}.get(ci_profile)
        if slices is None or slices > self._profile(gi.profile).compute_slices:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return slices

    def _fill_ci_profile(self, handle: int | None, ci_profile: int, eng: int, out: int | None, v2: bool) -> None:
        h, gpu = self._gpu(handle, ("gi",))
        gi = self._find_gi(gpu, h.gi)
        # nvml.h: INVALID_ARGUMENT for a bad engine profile (go-nvml's mock says NOT_SUPPORTED) and, as
        # for GI profiles, for a profile past the enum; NOT_SUPPORTED for one this GI cannot have.
        if eng != 0 or out is None or not 0 <= ci_profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = self._ci_slices(gi, ci_profile)
        gp = self._profile(gi.profile)
        info: Any = (pynvml.c_nvmlComputeInstanceProfileInfo_v2_t if v2 else
                     pynvml.c_nvmlComputeInstanceProfileInfo_t).from_address(out)
        info.id = ci_profile
        info.sliceCount = slices
        info.instanceCount = gp.compute_slices // slices
        info.multiprocessorCount = gp.multiprocessors * slices // gp.compute_slices
        ce, dec, enc, jpeg, ofa = _engines(self._model, gp)
        info.sharedCopyEngineCount, info.sharedDecoderCount, info.sharedEncoderCount = ce, dec, enc
        info.sharedJpegCount, info.sharedOfaCount = jpeg, ofa
        if v2:
            name = gp.name if slices == gp.compute_slices else f"{slices}c.{gp.name}"
            info.name = f"MIG {name}".encode()

    def ci_profile_info_v1(self, handle: int | None, profile: int, eng: int, out: int | None) -> None:
        self._fill_ci_profile(handle, profile, eng, out, v2=False)

    def ci_profile_info_v2(self, handle: int | None, profile: int, eng: int, out: int | None) -> None:
        self._fill_ci_profile(handle, profile, eng, out, v2=True)

    @staticmethod
    def _ci_free_start(gi_slices: int, gi: SimGpuInstance, slices: int) -> int | None:
        used = [False] * gi_slices
        for ci in gi.compute_instances:
            for s in range(ci.start, ci.start + ci.slices):
                used[s] = True
        aligned = list(range(0, gi_slices - slices + 1, slices))
        for start in aligned + [s for s in range(gi_slices - slices + 1) if s not in aligned]:
            if not any(used[start:start + slices]):
                return start
        return None

    def ci_remaining(self, handle: int | None, ci_profile: int, out: int | None) -> None:
        h, gpu = self._gpu(handle, ("gi",))
        gi = self._find_gi(gpu, h.gi).model_copy(deep=True)
        slices = self._ci_slices(gi, ci_profile)
        total = self._profile(gi.profile).compute_slices
        count = 0
        while (start := self._ci_free_start(total, gi, slices)) is not None:
            gi.compute_instances.append(SimComputeInstance(id=-1 - count, profile=ci_profile, start=start,
                                                           slices=slices))
            count += 1
        _put(out, ctypes.c_uint, count)

    def create_ci(self, handle: int | None, ci_profile: int, out: int | None) -> None:
        h, gpu = self._gpu(handle, ("gi",))
        self._find_gi(gpu, h.gi)
        with self.store.mutate() as state:
            gi = self._find_gi(state.gpus[h.gpu], h.gi)
            slices = self._ci_slices(gi, ci_profile)
            start = self._ci_free_start(self._profile(gi.profile).compute_slices, gi, slices)
            if start is None:
                raise _Ret(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            taken = {c.id for c in gi.compute_instances}
            ci_id = 0
            while ci_id in taken:
                ci_id += 1
            gi.compute_instances.append(SimComputeInstance(id=ci_id, profile=ci_profile, start=start, slices=slices))
        _set_ptr(out, _ci_handle(h.gpu, h.gi, ci_id))

    def get_cis(self, handle: int | None, ci_profile: int, out: int | None, count: int | None) -> None:
        h, gpu = self._gpu(handle, ("gi",))
        gi = self._find_gi(gpu, h.gi)
        found = sorted((c for c in gi.compute_instances if c.profile == ci_profile), key=lambda c: c.id)
        if count is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if out is not None:
            arr = (ctypes.c_void_p * max(len(found), 1)).from_address(out)
            for i, ci in enumerate(found):
                arr[i] = _ci_handle(h.gpu, h.gi, ci.id)
        ctypes.c_uint.from_address(count).value = len(found)

    def ci_by_id(self, handle: int | None, ci_id: int, out: int | None) -> None:
        h, gpu = self._gpu(handle, ("gi",))
        gi = self._find_gi(gpu, h.gi)
        if not any(c.id == ci_id for c in gi.compute_instances):
            raise _Ret(pynvml.NVML_ERROR_NOT_FOUND)
        _set_ptr(out, _ci_handle(h.gpu, h.gi, ci_id))

    def ci_info(self, handle: int | None, out: int | None) -> None:
        h, gpu = self._gpu(handle, ("ci",))
        gi = self._find_gi(gpu, h.gi)
        ci = next(c for c in gi.compute_instances if c.id == h.ci)
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = pynvml.c_nvmlComputeInstanceInfo_t.from_address(out)
        ptrs = (ctypes.c_void_p * 2).from_address(out)
        ptrs[0], ptrs[1] = _gpu_handle(h.gpu), _gi_handle(h.gpu, h.gi)
        info.id = ci.id
        info.profileId = ci.profile
        info.placement.start, info.placement.size = ci.start, ci.slices

    def destroy_ci(self, handle: int | None) -> None:
        h, gpu = self._gpu(handle, ("ci",))
        if any((p.gi_id, p.ci_id) == (h.gi, h.ci) for p in gpu.processes):
            raise _Ret(pynvml.NVML_ERROR_IN_USE)
        with self.store.mutate() as state:
            gi = self._find_gi(state.gpus[h.gpu], h.gi)
            gi.compute_instances = [c for c in gi.compute_instances if c.id != h.ci]

    # -- NVLink and topology -----------------------------------------------------------------
    def _link(self, handle: int | None, link: int) -> int:
        h, _ = self._gpu(handle)
        if link >= self.spec.nvlinks_per_gpu:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.spec.nvlink == "pairs" and (h.gpu ^ 1) >= self.spec.gpu_count:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.gpu

    def nvlink_state(self, handle: int | None, link: int, out: int | None) -> None:
        self._link(handle, link)
        _put(out, ctypes.c_uint, pynvml.NVML_FEATURE_ENABLED)

    def nvlink_remote_pci(self, handle: int | None, link: int, out: int | None) -> None:
        gpu = self._link(handle, link)
        if self.spec.nvlink == "nvswitch":
            switch = link % self.spec.nvswitch_count
            self._fill_pci(out, self.spec.nvswitch_bus_id(switch),
                           _NVSWITCH_PCI_ID.get(self._model.architecture, 0x1AF110DE), 0)
        else:
            self._fill_pci(out, self.spec.bus_ids[gpu ^ 1], (self.spec.pci_device_id << 16) | 0x10DE,
                           self.spec.pci_subsystem_id)

    def nvlink_remote_type(self, handle: int | None, link: int, out: int | None) -> None:
        self._link(handle, link)
        kind = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if self.spec.nvlink == "nvswitch" else \
            pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        _put(out, ctypes.c_uint, kind)

    def common_ancestor(self, h1: int | None, h2: int | None, out: int | None) -> None:
        a, _ = self._gpu(h1)
        b, _ = self._gpu(h2)
        spec = self.spec
        if a.gpu == b.gpu:
            level = pynvml.NVML_TOPOLOGY_INTERNAL
        elif spec.pcie_switch_groups[a.gpu] == spec.pcie_switch_groups[b.gpu]:
            level = pynvml.NVML_TOPOLOGY_MULTIPLE
        elif spec.numa_nodes[a.gpu] == spec.numa_nodes[b.gpu]:
            level = pynvml.NVML_TOPOLOGY_NODE
        else:
            level = pynvml.NVML_TOPOLOGY_SYSTEM
        _put(out, ctypes.c_uint, level)

    # -- NVLink fabric ----------------------------------------------------------------------
    def _fill_fabric(self, handle: int | None, out: int | None, struct: Any) -> None:
        """One GPU's fabric registration into ``struct`` at ``out``; NOT_SUPPORTED outside a fabric, and on
        every GPU older than Hopper whatever its state says (``%HOPPER_OR_NEWER%``, NVIDIA/go-nvml ``nvml.h``:
        a DGX A100 has NVSwitches and a Fabric Manager, yet its NVML reports no fabric)."""
        _, gpu = self._gpu(handle)
        fabric = gpu.fabric
        if fabric is None or (gpu.compute_capability or self._model.compute_capability) < FABRIC_MIN_COMPUTE_CAPABILITY:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = struct.from_address(out)
        ctypes.memmove(ctypes.addressof(info.clusterUuid), fabric.cluster_uuid.bytes, 16)
        info.status = fabric.status
        info.cliqueId = fabric.clique_id
        info.state = _FABRIC_STATES[fabric.state]

    def fabric_info(self, handle: int | None, out: int | None) -> None:
        """``nvmlDeviceGetGpuFabricInfo``: the unversioned ``nvmlGpuFabricInfo_t``."""
        self._fill_fabric(handle, out, pynvml.c_nvmlGpuFabricInfo_t)

    def fabric_info_v(self, handle: int | None, out: int | None) -> None:
        """``nvmlDeviceGetGpuFabricInfoV``: the struct version the caller put in its first field (v2, v3)."""
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        struct = _FABRIC_V_STRUCTS.get(ctypes.c_uint.from_address(out).value)
        if struct is None:
            raise _Ret(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill_fabric(handle, out, struct)

    # -- processes ---------------------------------------------------------------------------
    def compute_processes(self, handle: int | None, count: int | None, out: int | None) -> int | None:
        """``_v3`` and ``_v2``: ``nvmlProcessInfo_t`` with the GPU/compute-instance ids."""
        return self._fill_processes(handle, count, out, pynvml.c_nvmlProcessInfo_v3_t, instance_ids=True)

    def compute_processes_v1(self, handle: int | None, count: int | None, out: int | None) -> int | None:
        """The unversioned symbol: ``nvmlProcessInfo_v1_t`` (pid, usedGpuMemory), no GI/CI ids."""
        return self._fill_processes(handle, count, out, _ProcessInfoV1, instance_ids=False)

    def _fill_processes(self, handle: int | None, count: int | None, out: int | None, struct: Any,
                        *, instance_ids: bool) -> int | None:
        """NVML's two-call protocol: the count alone, INSUFFICIENT_SIZE when ``out`` is too small."""
        h, gpu = self._gpu(handle, ("gpu", "mig"))
        procs = [p for p in gpu.processes if h.kind == "gpu" or (p.gi_id, p.ci_id) == (h.gi, h.ci)]
        if count is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        n = ctypes.c_uint.from_address(count)
        if not procs:
            n.value = 0
            return None
        if out is None or n.value < len(procs):
            n.value = len(procs)
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        arr = (struct * len(procs)).from_address(out)
        for i, p in enumerate(procs):
            arr[i].pid = p.pid
            arr[i].usedGpuMemory = (p.used_mib << 20) if p.used_mib is not None else \
                pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
            if instance_ids:
                arr[i].gpuInstanceId = _WHOLE_GPU if p.gi_id is None else p.gi_id
                arr[i].computeInstanceId = _WHOLE_GPU if p.ci_id is None else p.ci_id
        n.value = len(procs)
        return None

    def graphics_processes(self, handle: int | None, count: int | None, out: int | None) -> None:
        self._gpu(handle, ("gpu", "mig"))
        _put(count, ctypes.c_uint, 0)

    # -- telemetry ---------------------------------------------------------------------------
    def _telemetry(self, handle: int | None) -> SimTelemetry:
        return self._gpu(handle)[1].telemetry

    def temperature(self, handle: int | None, sensor: int, out: int | None) -> None:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _put(out, ctypes.c_uint, self._telemetry(handle).gpu_temp_c)

    def power_usage(self, handle: int | None, out: int | None) -> None:
        _put(out, ctypes.c_uint, self._telemetry(handle).power_mw)

    def energy(self, handle: int | None, out: int | None) -> None:
        _put(out, ctypes.c_ulonglong, self._telemetry(handle).energy_mj)

    def clock_info(self, handle: int | None, clock: int, out: int | None) -> None:
        t = self._telemetry(handle)
        values = {pynvml.NVML_CLOCK_SM: t.sm_clock_mhz, pynvml.NVML_CLOCK_GRAPHICS: t.sm_clock_mhz,
                  pynvml.NVML_CLOCK_MEM: t.mem_clock_mhz}
        if clock not in values:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _put(out, ctypes.c_uint, values[clock])

    def utilization(self, handle: int | None, out: int | None) -> None:
        t = self._telemetry(handle)
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        u = pynvml.c_nvmlUtilization_t.from_address(out)
        u.gpu, u.memory = t.gpu_util, t.memory_util

    def _codec(self, value: int, util: int | None, period: int | None) -> None:
        _put(util, ctypes.c_uint, value)
        _put(period, ctypes.c_uint, 167_000)  # µs, what datacenter boards report

    def encoder_utilization(self, handle: int | None, util: int | None, period: int | None) -> None:
        self._codec(self._telemetry(handle).encoder_util, util, period)

    def decoder_utilization(self, handle: int | None, util: int | None, period: int | None) -> None:
        self._codec(self._telemetry(handle).decoder_util, util, period)

    def pcie_replays(self, handle: int | None, out: int | None) -> None:
        _put(out, ctypes.c_uint, self._telemetry(handle).pcie_replays)

    def pcie_throughput(self, handle: int | None, counter: int, out: int | None) -> None:
        t = self._telemetry(handle)
        values = {pynvml.NVML_PCIE_UTIL_TX_BYTES: t.pcie_tx_kbps, pynvml.NVML_PCIE_UTIL_RX_BYTES: t.pcie_rx_kbps}
        if counter not in values:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _put(out, ctypes.c_uint, values[counter])

    def total_ecc_errors(self, handle: int | None, error: int, counter: int, out: int | None) -> None:
        t = self._telemetry(handle)
        values = {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): t.ecc_sbe_volatile,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): t.ecc_dbe_volatile,
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): t.ecc_sbe_aggregate,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): t.ecc_dbe_aggregate,
        }
        if (error, counter) not in values:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _put(out, ctypes.c_ulonglong, values[(error, counter)])

    def remapped_rows(self, handle: int | None, corr: int | None, unc: int | None, pending: int | None,
                      failure: int | None) -> None:
        if self._model.architecture in ("turing",):  # row remapping came with Ampere
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        t = self._telemetry(handle)
        _put(corr, ctypes.c_uint, t.remapped_correctable)
        _put(unc, ctypes.c_uint, t.remapped_uncorrectable)
        _put(pending, ctypes.c_uint, int(t.remap_pending))
        _put(failure, ctypes.c_uint, int(t.remap_failure))

    def retired_pages_pending(self, handle: int | None, out: int | None) -> None:
        """Pages an ECC error retired, still mapped until a reset (``nvmlEnableState_t``). GPUs with row
        remapping (Ampere and later) retire no pages: NOT_SUPPORTED there (NVIDIA "GPU Memory Error
        Management": row remapping replaces dynamic page retirement from A100 on)."""
        if self._model.architecture not in PAGE_RETIREMENT_ARCHITECTURES:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _put(out, ctypes.c_uint, int(self._telemetry(handle).retired_pages_pending))

    def field_values(self, handle: int | None, count: int, values: int | None) -> None:
        """``nvmlDeviceGetFieldValues``: each field answers in its own ``nvmlReturn``. Only the GPU recovery
        action is modelled (on drivers from 565, which added it: NVML API changelog "Changes between v560 and
        v565"); every other field, and that one on an older driver, answers NOT_SUPPORTED, as fields a
        driver lacks do. NVIDIA's own mock NVML answers the same field the same way (NVIDIA/k8s-test-infra
        ``pkg/gpu/mocknvml``, ``nvmlDeviceGetFieldValues``)."""
        if values is None or count <= 0:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        t = self._telemetry(handle)
        fields = (pynvml.c_nvmlFieldValue_t * count).from_address(values)
        has_action = parse_driver_version(self._driver()) >= parse_driver_version(RECOVERY_ACTION_SINCE)
        for f in fields:
            f.timestamp, f.latencyUsec = int(time.time() * 1_000_000), 0
            if f.fieldId == RECOVERY_ACTION_FIELD and has_action:
                f.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                f.nvmlReturn = pynvml.NVML_SUCCESS
                f.value.uiVal = t.recovery_action
            else:
                f.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED

    def clock_events(self, handle: int | None, out: int | None) -> None:
        _put(out, ctypes.c_ulonglong, self._telemetry(handle).clock_events)

    # -- events ------------------------------------------------------------------------------
    def event_set_create(self, out: int | None) -> None:
        with self._lock:
            key = self._next_event_set
            self._next_event_set += 1
            self._event_sets[key] = {"gpus": {}, "seen": self._state().next_seq - 1}
        _set_ptr(out, _EVENT_BASE + key)

    def _event_set(self, handle: int | None) -> dict[str, Any]:
        if handle is None or handle - _EVENT_BASE not in self._event_sets:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._event_sets[handle - _EVENT_BASE]

    def register_events(self, handle: int | None, types: int, event_set: int | None) -> None:
        h, _ = self._gpu(handle)
        es = self._event_set(event_set)
        if types & ~_SUPPORTED_EVENTS:
            raise _Ret(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            es["gpus"][h.gpu] = es["gpus"].get(h.gpu, 0) | types

    def supported_events(self, handle: int | None, out: int | None) -> None:
        self._gpu(handle)
        _put(out, ctypes.c_ulonglong, _SUPPORTED_EVENTS)

    def event_set_wait(self, event_set: int | None, out: int | None, timeout_ms: int) -> int | None:
        es = self._event_set(event_set)
        if out is None:
            raise _Ret(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for ev in self._state().events:
                if ev.seq <= es["seen"]:
                    continue
                es["seen"] = ev.seq
                if es["gpus"].get(ev.gpu, 0) & _EVENT_BITS[ev.kind]:
                    data = pynvml.c_nvmlEventData_t.from_address(out)
                    ctypes.c_void_p.from_address(out).value = _gpu_handle(ev.gpu)
                    data.eventType = _EVENT_BITS[ev.kind]
                    data.eventData = ev.data
                    data.gpuInstanceId = _WHOLE_GPU if ev.gi_id is None else ev.gi_id
                    data.computeInstanceId = _WHOLE_GPU if ev.ci_id is None else ev.ci_id
                    return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return int(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(remaining, 0.005))

    def event_set_free(self, event_set: int | None) -> None:
        self._event_set(event_set)
        with self._lock:
            del self._event_sets[event_set - _EVENT_BASE]  # type: ignore[operator]

