"""The mutable state of a simulated machine, optionally persisted in a JSON file.

A machine's *spec* (``machines.py``) never changes; its *state* does: MIG mode, GPU and compute
instances, running processes, injected faults and queued events. Keeping the state in a file lets
separate processes (the CLI run twice, a test and a subprocess, the MIG manager and the device
plugin) see one machine. Writers take an ``flock`` on a sibling lock file and replace the file
atomically; readers reload only when the file's mtime/size changed.

The file is an external input (tests and operators edit it), so it is parsed with pydantic and
unknown keys are refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node_agent.nvml.sim.machines import MachineSpec, get_machine

InitError = Literal["driver-not-loaded", "library-not-found", "lib-rm-version-mismatch", "no-permission"]
EventName = Literal["xid", "double-bit-ecc", "single-bit-ecc"]
FabricStateName = Literal["not-started", "in-progress", "completed"]
#: Keep the last events only; event sets remember the sequence number they have seen.
MAX_EVENTS = 256


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SimComputeInstance(_Model):
    id: int
    profile: int  #: NVML_COMPUTE_INSTANCE_PROFILE_* enum (= profile id)
    start: int  #: first compute slice inside the GPU instance
    slices: int


class SimGpuInstance(_Model):
    id: int
    profile: int  #: NVML_GPU_INSTANCE_PROFILE_* enum
    start: int
    size: int
    compute_instances: list[SimComputeInstance] = []


class SimProcess(_Model):
    pid: int
    used_mib: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None


class SimEvent(_Model):
    seq: int
    gpu: int
    kind: EventName
    data: int = 0
    gi_id: int | None = None
    ci_id: int | None = None


class SimFabric(_Model):
    """The GPU's registration with the NVLink fabric manager (``nvmlDeviceGetGpuFabricInfo``).

    What a multi-node NVLink machine reports, a GB200 NVL72 compute tray for one: every GPU ``completed``
    in the rack's cluster UUID and its NVLink partition (clique). Without it (the default) the GPU is
    outside any fabric and NVML answers NOT_SUPPORTED, like every PCIe and HGX board.
    """

    cluster_uuid: uuid.UUID
    clique_id: int = Field(ge=0, le=0xFFFFFFFF)
    state: FabricStateName = "completed"
    #: NVML return code of the registration itself (0: it succeeded).
    status: int = 0


class SimTelemetry(_Model):
    """What the GPU's sensors and counters read (``nvmlDeviceGetTemperature``, ``GetPowerUsage``, ...).

    The defaults are an idle, healthy datacenter GPU; tests set the values a scenario needs. A call a
    board does not support is a ``call_errors`` entry (NVML_ERROR_NOT_SUPPORTED = 3), as on real GPUs.
    """

    gpu_temp_c: int = Field(default=34, ge=0)
    power_mw: int = Field(default=72_000, ge=0)
    #: Energy since the driver loaded, in mJ (nvmlDeviceGetTotalEnergyConsumption).
    energy_mj: int = Field(default=0, ge=0)
    sm_clock_mhz: int = Field(default=1980, ge=0)
    mem_clock_mhz: int = Field(default=2619, ge=0)
    gpu_util: int = Field(default=0, ge=0, le=100)
    memory_util: int = Field(default=0, ge=0, le=100)
    encoder_util: int = Field(default=0, ge=0, le=100)
    decoder_util: int = Field(default=0, ge=0, le=100)
    pcie_replays: int = Field(default=0, ge=0)
    #: PCIe throughput over NVML's last 20 ms window, KB/s (nvmlDeviceGetPcieThroughput).
    pcie_tx_kbps: int = Field(default=0, ge=0)
    pcie_rx_kbps: int = Field(default=0, ge=0)
    #: ECC error counts: volatile (since the driver loaded) and aggregate (the GPU's lifetime).
    ecc_sbe_volatile: int = Field(default=0, ge=0)
    ecc_dbe_volatile: int = Field(default=0, ge=0)
    ecc_sbe_aggregate: int = Field(default=0, ge=0)
    ecc_dbe_aggregate: int = Field(default=0, ge=0)
    #: Row remapping (Ampere and later): rows remapped, a remap pending until reset, a remap failed.
    remapped_correctable: int = Field(default=0, ge=0)
    remapped_uncorrectable: int = Field(default=0, ge=0)
    remap_pending: bool = False
    remap_failure: bool = False
    #: Clock event (throttle) reasons bitmask (nvmlDeviceGetCurrentClocksEventReasons).
    clock_events: int = Field(default=0, ge=0)


class SimGpu(_Model):
    mig_current: bool = False
    mig_pending: bool = False
    instances: list[SimGpuInstance] = []
    processes: list[SimProcess] = []
    #: Faults and overrides for bad-node scenarios.
    lost: bool = False
    hang: bool = False
    reset_blocked: bool = False  #: a MIG mode change stays pending (clients hold the GPU)
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    #: Another board's PCI device ID (an unknown GPU is unknown by ID as well as by name).
    pci_device_id: int | None = None
    #: C function name (``nvmlDeviceGetMemoryInfo``, or with its ``_vN`` suffix) -> the NVML return
    #: code every call of it on this GPU fails with (999 = NVML_ERROR_UNKNOWN).
    call_errors: dict[str, int] = {}
    fabric: SimFabric | None = None
    telemetry: SimTelemetry = SimTelemetry()


class SimState(_Model):
    machine: str
    driver_version: str | None = None
    init_error: InitError | None = None
    #: ``nvmlGpuVirtualizationMode_t`` of every GPU: 0 bare metal, 1 passthrough, 2 a vGPU guest, 3 a vGPU host.
    virtualization_mode: int = Field(default=0, ge=0, le=4)
    #: C functions the simulated library does not export at all (on top of those its driver version
    #: predates), as if an older or stripped-down libnvidia-ml.so were installed.
    missing_functions: list[str] = []
    gpus: list[SimGpu]
    events: list[SimEvent] = []
    next_seq: int = Field(default=1, ge=1)

    @property
    def spec(self) -> MachineSpec:
        return get_machine(self.machine)

    def gpu(self, index: int) -> SimGpu:
        return self.gpus[index]

    def push_event(self, gpu: int, kind: EventName, data: int = 0, gi_id: int | None = None,
                   ci_id: int | None = None) -> SimEvent:
        event = SimEvent(seq=self.next_seq, gpu=gpu, kind=kind, data=data, gi_id=gi_id, ci_id=ci_id)
        self.next_seq += 1
        self.events.append(event)
        del self.events[:-MAX_EVENTS]
        return event


class SimStateError(ValueError):
    """The state file is unreadable or does not describe the machine asked for."""


def fresh_state(machine: str) -> SimState:
    spec = get_machine(machine)
    return SimState(machine=spec.name, gpus=[SimGpu() for _ in range(spec.gpu_count)])


class SimStore:
    """Holds one machine's state in memory or in a JSON file shared between processes."""

    def __init__(self, machine: str, path: Path | None = None) -> None:
        self.machine = get_machine(machine).name
        self.path = path
        self._lock = threading.RLock()
        self._state = fresh_state(machine)
        self._stamp: tuple[int, int] | None = None
        if path is not None:
            with self.mutate():
                pass  # creates the file on first use, validates it otherwise

    # -- reading -----------------------------------------------------------------------------
    def read(self) -> SimState:
        """The current state (reloaded if another process changed the file). Do not mutate it."""
        with self._lock:
            if self.path is not None:
                self._reload_if_changed()
            return self._state

    def _reload_if_changed(self) -> None:
        assert self.path is not None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._state = self._load(self.path)
            self._stamp = stamp

    def _load(self, path: Path) -> SimState:
        try:
            state = SimState.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as e:
            raise SimStateError(f"simulated NVML state {path}: {e}") from e
        if state.machine != self.machine:
            raise SimStateError(f"simulated NVML state {path} is for machine {state.machine!r}, not {self.machine!r}")
        if len(state.gpus) != state.spec.gpu_count:
            raise SimStateError(
                f"simulated NVML state {path}: {len(state.gpus)} GPUs, machine has {state.spec.gpu_count}"
            )
        return state

    # -- writing -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def mutate(self) -> Iterator[SimState]:
        """Yield the state for changes; they are saved (atomically, under a file lock) on exit, and only
        when there are any: a real NVML writes nothing when it is read (``diagnose`` proves it changes
        nothing on a simulated host, down to the state file's time)."""
        with self._lock:
            if self.path is None:
                yield self._state
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock_path = self.path.with_name(self.path.name + ".lock")
            with open(lock_path, "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    self._stamp = None
                    existed = self.path.exists()
                    if existed:
                        self._state = self._load(self.path)
                    state = self._state.model_copy(deep=True)
                    yield state
                    if not existed or state != self._state:
                        self._save(state)
                    else:
                        st = self.path.stat()
                        self._stamp = (st.st_mtime_ns, st.st_size)
                    self._state = state
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _save(self, state: SimState) -> None:
        assert self.path is not None
        data = state.model_dump_json(indent=1).encode()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        st = self.path.stat()
        self._stamp = (st.st_mtime_ns, st.st_size)
