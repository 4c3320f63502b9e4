"""Simulated GPU machines underneath nvidia-ml-py: ``--nvml simulated:<machine>``.

A package of its own beside the agent, not part of it: the agent image can leave it out, and the agent
reaches it only through the ``node_agent.nvml.simulator.Simulator`` protocol that ``nvml_sim.provider``
implements and ``node_agent.cli`` registers (``ResetRefused`` is that protocol's).

``install(store)`` points ``pynvml.nvmlLib`` at a ``FakeNvmlLibrary`` (see ``lib.py`` for why the
fake sits at the C-function level); ``uninstall()`` puts the previous library back. The
``SimulatedMachine`` wrapper is the test and operator handle for faults: XID/ECC events, a GPU
that falls off the bus, a hung GPU, one C function failing on one GPU (``fail_call``, e.g. error
999), functions the library lacks (``remove_functions``, and by driver version: see
``lib.FUNCTION_SINCE``), NVML init failure, processes holding a GPU, overridden driver version /
name / compute capability for bad-node scenarios, and NVLink fabric registration (``set_fabric``: a
multi-node NVLink machine such as a GB200 NVL72 tray; ``set_fabric_manager``: Fabric Manager not started,
still running or failed; by default the Hopper NVSwitch machines are registered, no other GPU is in a
fabric). XIDs leave what they leave on a real GPU (``inject_xid``: a pending row remap or retired page, a
failed remap, a recovery action; ``reset_gpu`` settles what a reset settles; ``set_recovery_action``), and
what holds the GPUs is tracked as a driver sees it: processes, host GPU clients (``set_host_service``) and
every process with NVML initialised, so ``smi_reset`` (``nvidia-smi -r``) refuses while any holds them.
``summary`` renders a machine's state for the ``sim`` command (``node_agent.cli.sim``); ``smi`` is the
simulated ``nvidia-smi``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pynvml

from node_agent.nvml.simulator import ResetRefused
from nvgpu import hostpaths
from nvml_sim.lib import FakeNvmlLibrary
from nvml_sim.machines import MACHINE_NAMES, MACHINES, MachineSpec, UnknownMachineError, get_machine
from nvml_sim.state import (
    FABRIC_MIN_COMPUTE_CAPABILITY,
    PAGE_RETIREMENT_ARCHITECTURES,
    EventName,
    FabricStateName,
    InitError,
    SimFabric,
    SimProcess,
    SimState,
    SimStateError,
    SimStore,
    SimTelemetry,
    nvml_clients_open,
    reset_aftermath,
    xid_aftermath,
)

#: Under a host root that is not ``/``, the CLI keeps a simulated machine's state here, so separate
#: agent processes against the same root see the same machine.
DEFAULT_STATE_DIR = f"{hostpaths.AGENT_RUN_DIR}/nvml-sim"

__all__ = [
    "DEFAULT_STATE_DIR",
    "MACHINES",
    "MACHINE_NAMES",
    "FakeNvmlLibrary",
    "MachineSpec",
    "ResetRefused",
    "SimStateError",
    "SimStore",
    "SimTelemetry",
    "SimulatedMachine",
    "UnknownMachineError",
    "get_machine",
    "install",
    "installed_library",
    "uninstall",
]

_lock = threading.Lock()
_saved: list[object] = []
#: How many installs share each installed library (by ``id``).
_installs: dict[int, int] = {}


def install(store: SimStore) -> FakeNvmlLibrary:
    """Make nvidia-ml-py talk to the simulated machine behind ``store`` (process-wide).

    A process loads ``libnvidia-ml.so.1`` once, however many NVML sessions it opens: while the same
    machine's file-backed library is installed, a further install shares it (counted; the last matching
    ``uninstall`` restores what was there), so a session held open (an event set waiting for XIDs) keeps
    its handles while other sessions come and go beside it, as it does on a real driver."""
    with pynvml.libLoadLock, _lock:
        current = pynvml.nvmlLib
        if (isinstance(current, FakeNvmlLibrary) and store.path is not None
                and (current.store.machine, current.store.path) == (store.machine, store.path)):
            _installs[id(current)] += 1
            return current
        lib = FakeNvmlLibrary(store)
        _saved.append(current)
        _installs[id(lib)] = 1
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    return lib


def uninstall(lib: FakeNvmlLibrary) -> None:
    """Undo the matching ``install``; after the last one the previous library (real or none) comes back."""
    with pynvml.libLoadLock, _lock:
        if pynvml.nvmlLib is not lib:
            return
        _installs[id(lib)] -= 1
        if _installs[id(lib)] > 0:
            return
        del _installs[id(lib)]
        pynvml.nvmlLib = _saved.pop() if _saved else None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def installed_library() -> FakeNvmlLibrary | None:
    lib = pynvml.nvmlLib
    return lib if isinstance(lib, FakeNvmlLibrary) else None


#: ``nvmlGpuVirtualizationMode_t`` NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH.
PASSTHROUGH = 1


class SimulatedMachine:
    """Handle on a simulated machine's state, for tests and fault injection."""

    def __init__(self, machine: str, state_file: Path | None = None) -> None:
        self.store = SimStore(machine, state_file)

    @property
    def spec(self) -> MachineSpec:
        return get_machine(self.store.machine)

    @property
    def state(self) -> SimState:
        return self.store.read()

    def fail_init(self, error: InitError | None = "driver-not-loaded") -> None:
        with self.store.mutate() as s:
            s.init_error = error

    def set_driver_version(self, version: str | None) -> None:
        with self.store.mutate() as s:
            s.driver_version = version

    def set_virtualization_mode(self, mode: int) -> None:
        """The GPUs as NVML sees them in a VM with vGPUs (2), on a vGPU host (3), or bare metal (0)."""
        with self.store.mutate() as s:
            s.virtualization_mode = mode

    def lose_gpu(self, index: int, xid: int = 79) -> None:
        """The GPU falls off the bus: XID 79 is raised, then every call on it fails with GPU_IS_LOST."""
        with self.store.mutate() as s:
            s.push_event(index, "xid", xid)
            s.gpus[index].lost = True

    def restore_gpu(self, index: int) -> None:
        with self.store.mutate() as s:
            s.gpus[index].lost = False
            s.gpus[index].hang = False
            s.gpus[index].call_errors = {}

    def fail_call(self, index: int, function: str, code: int | None = 999) -> None:
        """Every call of C function ``function`` on this GPU returns ``code`` (None: stop failing it)."""
        with self.store.mutate() as s:
            if code is None:
                s.gpus[index].call_errors.pop(function, None)
            else:
                s.gpus[index].call_errors[function] = code

    def remove_functions(self, functions: list[str]) -> None:
        """The library exports none of ``functions`` (an empty list: every function is back)."""
        with self.store.mutate() as s:
            s.missing_functions = list(functions)

    def hang_gpu(self, index: int, hang: bool = True) -> None:
        with self.store.mutate() as s:
            s.gpus[index].hang = hang

    def inject_event(self, index: int, kind: EventName = "xid", data: int = 0, gi_id: int | None = None,
                     ci_id: int | None = None) -> None:
        with self.store.mutate() as s:
            s.push_event(index, kind, data, gi_id, ci_id)

    def inject_xid(self, index: int, xid: int, gi_id: int | None = None, ci_id: int | None = None) -> None:
        """Raise XID ``xid`` and leave what it leaves on a real GPU (``state.xid_aftermath``): XID 95 makes
        the GPU need a reset with a row remap pending, 64 a failed remap, 48 on a T4 a pending retired page."""
        with self.store.mutate() as s:
            s.push_event(index, "xid", xid, gi_id, ci_id)
            remaps_rows = self.spec.model.architecture not in PAGE_RETIREMENT_ARCHITECTURES
            xid_aftermath(s.gpus[index], xid, row_remapping=remaps_rows)

    def set_recovery_action(self, index: int, action: int) -> None:
        """GPU ``index``'s ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (0 none, 1 reset, 2 reboot, 3 drain P2P,
        4 drain and reset); drivers before 565 do not report it."""
        self.set_telemetry(index, recovery_action=action)

    def set_telemetry(self, index: int, **values: Any) -> SimTelemetry:
        """Set what GPU ``index``'s sensors and counters read (:class:`SimTelemetry` fields); answers them all."""
        with self.store.mutate() as s:
            gpu = s.gpus[index]
            gpu.telemetry = SimTelemetry.model_validate({**gpu.telemetry.model_dump(), **values})
            return gpu.telemetry

    def set_processes(self, index: int, processes: list[SimProcess]) -> None:
        with self.store.mutate() as s:
            s.gpus[index].processes = list(processes)

    def override_gpu(self, index: int, *, name: str | None = None,
                     compute_capability: tuple[int, int] | None = None, pci_device_id: int | None = None) -> None:
        """Make GPU ``index`` another board: its name, compute capability and PCI device ID (None: the
        machine's). Set the ID too for a GPU the catalogue must not know: models are found by ID first."""
        with self.store.mutate() as s:
            s.gpus[index].name = name
            s.gpus[index].compute_capability = compute_capability
            s.gpus[index].pci_device_id = pci_device_id

    def set_fabric(self, cluster_uuid: uuid.UUID | str | None, clique_id: int = 0, *,
                   gpus: Iterable[int] | None = None, state: FabricStateName = "completed",
                   status: int = 0) -> None:
        """Register ``gpus`` (default: all) with an NVLink fabric, as a GB200 NVL72 tray reports it;
        ``cluster_uuid=None`` takes them out of any fabric again (NVML answers NOT_SUPPORTED). Only
        Hopper-or-newer GPUs have a fabric NVML reports (``%HOPPER_OR_NEWER%``, NVIDIA/go-nvml ``nvml.h``):
        registering an older one is refused rather than silently never seen."""
        fabric = None if cluster_uuid is None else SimFabric(
            cluster_uuid=uuid.UUID(str(cluster_uuid)), clique_id=clique_id, state=state, status=status)
        with self.store.mutate() as s:
            for i in range(len(s.gpus)) if gpus is None else gpus:
                cc = s.gpus[i].compute_capability or self.spec.model.compute_capability
                if fabric is not None and cc < FABRIC_MIN_COMPUTE_CAPABILITY:
                    raise ValueError(f"GPU {i} ({self.spec.name}) has compute capability {cc[0]}.{cc[1]}: NVML "
                                     "reports a fabric on Hopper (9.0) or newer GPUs only")
                s.gpus[i].fabric = fabric

    def set_fabric_manager(self, state: FabricStateName, status: int = 0, *,
                           gpus: Iterable[int] | None = None) -> None:
        """Where Fabric Manager's registration of ``gpus`` (default: every GPU with a fabric) stands, each
        GPU keeping its cluster and clique: ``not-started`` (the service is not running), ``in-progress``
        (it is training the NVSwitch fabric), ``completed`` with ``status`` 0 (done) or an NVML error code
        (it failed, e.g. 10 = NVML_ERROR_TIMEOUT). Until ``completed`` with status 0, CUDA fails every
        program with error 802 (cudaErrorSystemNotReady); a GPU without a fabric is refused."""
        with self.store.mutate() as s:
            for i in range(len(s.gpus)) if gpus is None else gpus:
                fabric = s.gpus[i].fabric
                if fabric is None:
                    if gpus is None:
                        continue
                    raise ValueError(f"GPU {i} ({self.spec.name}) is in no NVLink fabric (NVML answers NOT_SUPPORTED)")
                s.gpus[i].fabric = fabric.model_copy(update={"state": state, "status": status})

    def compute_mode(self, index: int) -> int:
        """GPU ``index``'s ``nvmlComputeMode_t`` (0 DEFAULT, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS)."""
        return self.store.read().gpus[index].compute_mode

    def set_compute_mode(self, index: int, mode: int) -> None:
        """Put GPU ``index`` in ``mode`` as an operator's ``nvidia-smi -c`` would (before an agent starts)."""
        with self.store.mutate() as s:
            s.gpus[index].compute_mode = mode

    def persistence_mode(self, index: int) -> bool:
        """Whether GPU ``index`` is in persistence mode now (its own setting, else the machine's default)."""
        on = self.store.read().gpus[index].persistence_mode
        return self.spec.persistence_mode if on is None else on

    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        """Turn GPU ``index``'s persistence mode on or off, as an operator's ``nvidia-smi -pm`` would."""
        with self.store.mutate() as s:
            s.gpus[index].persistence_mode = enabled

    def fail_mps_start(self, message: str | None) -> None:
        """The simulated ``nvidia-cuda-mps-control -d`` fails with ``message`` (None: it starts again)."""
        with self.store.mutate() as s:
            s.mps_start_error = message

    def require_mig_monitor(self, required: bool = True) -> None:
        """NVML checks the caller's MIG monitor capability, as a real driver does: on a GPU in MIG mode a
        caller whose environment lacks ``NVIDIA_MIG_MONITOR_DEVICES=all`` gets NVML_ERROR_NO_PERMISSION from
        the parent's memory info and the GPU-instance lookups (``SimState.mig_monitor_required``)."""
        with self.store.mutate() as s:
            s.mig_monitor_required = required

    def set_mig_empty_slot_error(self, index: int, code: int) -> None:
        """What GPU ``index`` answers for a MIG device slot with no device behind it: 6 (NOT_FOUND) or 2
        (INVALID_ARGUMENT), both of which real drivers answer (``SimGpu.mig_empty_slot_error``)."""
        if code not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
            raise ValueError(f"empty MIG slot error {code}: expected 6 (NOT_FOUND) or 2 (INVALID_ARGUMENT)")
        with self.store.mutate() as s:
            s.gpus[index].mig_empty_slot_error = code  # type: ignore[assignment]

    def set_brand(self, index: int, brand: int | None) -> None:
        """GPU ``index`` answers ``brand`` (an ``nvmlBrandType_t``) to nvmlDeviceGetBrand (None: the machine's)."""
        with self.store.mutate() as s:
            s.gpus[index].brand = brand

    def set_host_service(self, unit: str, active: bool) -> None:
        """A host systemd unit that holds the GPUs while active (``nvidia-dcgm.service``, ``nvsm.service``)."""
        with self.store.mutate() as s:
            s.host_services[unit] = active

    def reset_refusal(self, indices: Iterable[int]) -> str | None:
        """Why ``nvidia-smi -r`` would refuse to reset these GPUs now, or None: processes on them, a blocked
        reset, a host GPU client (a systemd unit) running, or any process with NVML initialised, this one
        included (nvidia-smi: "In use by another client"; mig-parted shuts NVML down and stops the host's
        GPU clients first: ``cmd/nvidia-mig-parted/apply/mode.go``, ``deployments/systemd/hooks.sh``)."""
        state = self.state
        for i in indices:
            g = state.gpus[i]
            if g.processes or g.reset_blocked:
                return f"GPU {self.spec.bus_ids[i]}: In use by another client (processes on the GPU)"
        running = sorted(u for u, active in state.host_services.items() if active)
        if running:
            return f"In use by another client (host services: {', '.join(running)})"
        if self.store.path is not None and nvml_clients_open(self.store.path):
            return "In use by another client (a process has NVML open)"
        lib = installed_library()
        if self.store.path is None and lib is not None and lib.store is self.store and lib.initialised:
            return "In use by another client (a process has NVML open)"
        return None

    def smi_reset(self, indices: Iterable[int]) -> None:
        """``nvidia-smi -r``: reset the GPUs, or raise :class:`ResetRefused` (nothing reset) when held."""
        wanted = list(indices)
        refusal = self.reset_refusal(wanted)
        if refusal is not None:
            raise ResetRefused(refusal)
        for i in wanted:
            self.reset_gpu(i)

    def block_reset(self, index: int, blocked: bool = True) -> None:
        with self.store.mutate() as s:
            s.gpus[index].reset_blocked = blocked

    def reset_gpu(self, index: int) -> None:
        """A GPU reset: a pending MIG mode takes effect (instances are gone after a mode change), pending row
        remaps and retired pages take effect and a recovery action a reset settles is cleared. A GPU passed
        through to a VM (``set_virtualization_mode(1)``) keeps its MIG mode pending: "on certain platforms
        like pass-through virtualization, where reset functionality may not be exposed directly, VM reboot is
        required" (nvml.h, ``nvmlDeviceSetMigMode``)."""
        with self.store.mutate() as s:
            g = s.gpus[index]
            if s.virtualization_mode != PASSTHROUGH:
                if g.mig_current != g.mig_pending:
                    g.instances = []
                g.mig_current = g.mig_pending
            reset_aftermath(g)
