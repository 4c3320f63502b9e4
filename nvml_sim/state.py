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

from nvml_sim.machines import MachineSpec, get_machine

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

    What a Hopper-or-newer GPU on NVSwitches reports (the NVML header marks the call ``%HOPPER_OR_NEWER%``:
    "On Hopper + NVSwitch systems, GPU is registered with the NVIDIA Fabric Manager", NVIDIA/go-nvml
    ``pkg/nvml/nvml.h``). An HGX/DGX H100 or H200 board: every GPU ``completed`` with a zero cluster UUID
    and clique 0 once Fabric Manager has run (see :func:`default_fabric`); until then ``not-started`` or
    ``in-progress``, and CUDA fails every program with error 802 (cudaErrorSystemNotReady). A multi-node
    NVLink machine (a GB200 NVL72 compute tray) reports the rack's cluster UUID and its NVLink partition
    (clique). ``None``: the GPU is outside any fabric and NVML answers NOT_SUPPORTED, like every PCIe board
    and every pre-Hopper GPU (A100 on NVSwitches included: its Fabric Manager state is not in NVML).
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
    #: Pages retired by ECC errors but still mapped until the GPU is reset or the driver reloads
    #: (``nvmlDeviceGetRetiredPagesPendingStatus``; GPUs before Ampere, which remap rows instead).
    retired_pages_pending: bool = False
    #: ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (``nvmlDeviceGpuRecoveryAction_t``): 0 none, 1 GPU reset,
    #: 2 node reboot, 3 drain P2P, 4 drain and reset (NVIDIA "GPU Memory Error Management", "Error Recovery
    #: and Response Flags"). Drivers before 565 do not have the field (NVML API changelog, v560 to v565).
    recovery_action: int = Field(default=0, ge=0, le=7)
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
    #: ``nvmlComputeMode_t``: 0 DEFAULT, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS (1, EXCLUSIVE_THREAD, was removed
    #: from NVML: setting it fails). Kept until changed or the driver reloads; NVIDIA's MPS daemons set 3 on
    #: the GPUs they serve (NVIDIA/k8s-device-plugin ``cmd/mps-control-daemon/mps/daemon.go``).
    compute_mode: int = Field(default=0, ge=0, le=3)
    #: Persistence mode as set since the driver loaded (None: the machine's default, ``MachineSpec.persistence_mode``).
    #: While it is on the driver keeps the GPU initialised, a client of its own: unbinding the GPU from ``nvidia``
    #: then blocks in the kernel, which is why NVIDIA's VFIO code turns it off first (NVIDIA/k8s-dra-driver-gpu
    #: ``cmd/gpu-kubelet-plugin/vfio-device.go``, ``disableGPUPersistenceMode`` before ``WaitForGPUFree``).
    persistence_mode: bool | None = None
    #: Another board's ``nvmlBrandType_t`` (None: the machine's, ``MachineSpec.brand``).
    brand: int | None = None
    #: What ``nvmlDeviceGetMigDeviceHandleByIndex`` answers for an index with no MIG device behind it:
    #: NVML_ERROR_NOT_FOUND (6, what nvml.h documents) or NVML_ERROR_INVALID_ARGUMENT (2), which drivers
    #: answer too: NVIDIA's go-nvlib skips both while walking the slots (``pkg/nvlib/device/device.go``,
    #: ``VisitMigDevices``), and NVIDIA's DRA driver tests fake the latter for unused slots.
    mig_empty_slot_error: Literal[2, 6] = 6


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
    #: The simulated ``nvidia-cuda-mps-control -d`` fails with this message (``nvml_sim.mpsctl``),
    #: as the real one does when it cannot start (no permission on the pipe directory, a driver problem).
    mps_start_error: str | None = None
    #: Whether NVML checks the caller's MIG monitor capability, as the real driver does: on a GPU in MIG
    #: mode, a process that cannot open the monitor capability (``/dev/nvidia-caps/nvidia-cap2``, which
    #: nvidia-container-toolkit mounts into a container that sets ``NVIDIA_MIG_MONITOR_DEVICES=all`` and has
    #: CAP_SYS_ADMIN) gets NVML_ERROR_NO_PERMISSION from the parent GPU's memory info and the GPU-instance
    #: lookups (NVIDIA/gpu-feature-discovery#6, NVIDIA/gpu-operator#322 and #685,
    #: NVIDIA/k8s-device-plugin#399 and #1683). The simulated caller holds the capability when its
    #: environment says ``NVIDIA_MIG_MONITOR_DEVICES=all`` (what the runtime honours), see
    #: ``lib.MIG_MONITOR_ENV``. Off by default: in-process tests play the privileged agents.
    mig_monitor_required: bool = False
    #: Host systemd units that keep the GPUs open while active (unit -> active), such as the ones NVIDIA's
    #: MIG manager stops before a MIG mode change (mig-parted ``deployments/systemd/hooks.sh``:
    #: ``nvsm.service``, ``nvidia-dcgm.service``). The simulated host's ``systemctl`` starts and stops them
    #: (``nvml_sim.systemctl``); while one is active an A100 keeps a MIG mode pending and
    #: ``nvidia-smi -r`` refuses.
    host_services: dict[str, bool] = {}
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


def clients_path(state_path: Path) -> Path:
    """The file every process with the simulated machine's NVML initialised holds a shared ``flock`` on (a
    process's open ``/dev/nvidia*``, as ``nvidia-smi -r`` sees it); created with the state file."""
    return state_path.with_name(state_path.name + ".clients")


def hold_clients(state_path: Path) -> int | None:
    """Take this process's shared hold on the machine's GPUs (an open descriptor; close it to let go), or
    None for a state file from before clients were tracked."""
    try:
        fd = os.open(clients_path(state_path), os.O_RDONLY)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def nvml_clients_open(state_path: Path) -> bool:
    """Whether any process (this one included) has this machine's NVML initialised now."""
    try:
        fd = os.open(clients_path(state_path), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return False


#: The first compute capability (Hopper) whose NVML reports the GPU's fabric registration; older GPUs answer
#: NVML_ERROR_NOT_SUPPORTED (``%HOPPER_OR_NEWER%`` on ``nvmlDeviceGetGpuFabricInfo``, NVIDIA/go-nvml ``nvml.h``).
FABRIC_MIN_COMPUTE_CAPABILITY = (9, 0)
#: The cluster UUID of a single-node NVSwitch fabric (HGX/DGX H100): all zeros, "NVLink-capable, but not
#: MNNVL-capable" (kubernetes-sigs/dra-driver-nvidia-gpu ``cmd/compute-domain-kubelet-plugin/nvlib.go``).
NO_FABRIC_CLUSTER = uuid.UUID(int=0)


def default_fabric(spec: MachineSpec) -> SimFabric | None:
    """A GPU's fabric registration on a freshly booted ``spec`` whose Fabric Manager has finished: registered
    (``completed``, status 0) in no multi-node cluster on Hopper-or-newer NVSwitch boards; none elsewhere."""
    if spec.nvlink != "nvswitch" or spec.model.compute_capability < FABRIC_MIN_COMPUTE_CAPABILITY:
        return None
    return SimFabric(cluster_uuid=NO_FABRIC_CLUSTER, clique_id=0)


#: What a memory or GSP XID leaves behind on a GPU that remaps rows (Ampere and later), after NVIDIA's Xid
#: catalogue (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog": 48, 64, 95,
#: 119 and 120 RESET_GPU; 63 and 94 RESTART_APP) and "GPU Memory Error Management" (a DBE marks its row for
#: remapping, done at the next reset; an uncontained error needs the reset now, a contained one does not):
#: XID -> (row remap pending, remap failed, recovery action).
ROW_REMAP_XIDS: dict[int, tuple[bool, bool, int]] = {
    48: (True, False, 1),  # double-bit ECC error
    63: (True, False, 0),  # row remapping recorded: "reset gpu to activate"
    64: (False, True, 1),  # row remapping failed (NVIDIA's RMA threshold)
    94: (True, False, 0),  # contained ECC error: the application that hit it is killed, the GPU goes on
    95: (True, False, 1),  # uncontained ECC error: every process on the GPU is lost, reset it
    119: (False, False, 1),  # GSP RPC timeout
    120: (False, False, 1),  # GSP error
}
#: Architectures that retire pages on ECC errors; Ampere and later remap rows instead.
PAGE_RETIREMENT_ARCHITECTURES = frozenset({"volta", "turing"})
#: XIDs that retire a page on GPUs before Ampere (48 DBE, 63 page retirement recorded, 64 recording failed):
#: the page stays mapped until the GPU is reattached (reset or driver reload).
PAGE_RETIREMENT_XIDS = frozenset({48, 63, 64})
#: Recovery actions a GPU reset settles (GPU_RESET, DRAIN_P2P, DRAIN_AND_RESET, BUS_RESET); NODE_REBOOT
#: and SYSTEM_REBOOT outlive it.
RESET_SETTLES_ACTIONS = frozenset({1, 3, 4, 6})


def xid_aftermath(gpu: SimGpu, xid: int, *, row_remapping: bool) -> None:
    """Leave on ``gpu`` what XID ``xid`` leaves on a real one: a pending row remap or page retirement, a
    failed remap, a recovery action (the most drastic of the one already set and the new one wins)."""
    t = gpu.telemetry
    if row_remapping and xid in ROW_REMAP_XIDS:
        pending, failure, action = ROW_REMAP_XIDS[xid]
        t.remap_pending = t.remap_pending or pending
        t.remap_failure = t.remap_failure or failure
        if action and t.recovery_action in (0, 3):  # a reboot or drain-and-reset already asked for stays
            t.recovery_action = action
    elif not row_remapping and xid in PAGE_RETIREMENT_XIDS:
        t.retired_pages_pending = True


def reset_aftermath(gpu: SimGpu) -> None:
    """A GPU reset: pending row remaps take effect (they count as remapped rows from now on), pending
    retired pages are retired, and a recovery action the reset settles goes back to NONE."""
    t = gpu.telemetry
    if t.remap_pending:
        t.remap_pending = False
        t.remapped_uncorrectable += 1
    t.retired_pages_pending = False
    if t.recovery_action in RESET_SETTLES_ACTIONS:
        t.recovery_action = 0


def fresh_state(machine: str) -> SimState:
    spec = get_machine(machine)
    return SimState(machine=spec.name, gpus=[SimGpu(fabric=default_fabric(spec)) for _ in range(spec.gpu_count)])


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
                    if not existed:
                        clients_path(self.path).touch()
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
