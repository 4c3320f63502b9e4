"""Simulated GPU machines underneath nvidia-ml-py: ``--nvml simulated:<machine>``.

``install(store)`` points ``pynvml.nvmlLib`` at a ``FakeNvmlLibrary`` (see ``lib.py`` for why the
fake sits at the C-function level); ``uninstall()`` puts the previous library back. The
``SimulatedMachine`` wrapper is the test and operator handle for faults: XID/ECC events, a GPU
that falls off the bus, a hung GPU, one C function failing on one GPU (``fail_call``, e.g. error
999), functions the library lacks (``remove_functions``, and by driver version: see
``lib.FUNCTION_SINCE``), NVML init failure, processes holding a GPU, overridden driver version /
name / compute capability for bad-node scenarios, and NVLink fabric registration (``set_fabric``: a
multi-node NVLink machine such as a GB200 NVL72 tray; by default no GPU is in a fabric). ``summary``
renders a machine's state for the ``sim`` command (``node_agent.cli.sim``); ``smi`` is the simulated ``nvidia-smi``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pynvml

from node_agent.nvml.sim.lib import FakeNvmlLibrary
from node_agent.nvml.sim.machines import MACHINE_NAMES, MACHINES, MachineSpec, UnknownMachineError, get_machine
from node_agent.nvml.sim.state import (
    EventName,
    FabricStateName,
    InitError,
    SimFabric,
    SimProcess,
    SimState,
    SimStateError,
    SimStore,
    SimTelemetry,
)
from nvgpu import hostpaths

#: Under a host root that is not ``/``, the CLI keeps a simulated machine's state here, so separate
#: agent processes against the same root see the same machine.
DEFAULT_STATE_DIR = f"{hostpaths.AGENT_RUN_DIR}/nvml-sim"

__all__ = [
    "DEFAULT_STATE_DIR",
    "MACHINES",
    "MACHINE_NAMES",
    "FakeNvmlLibrary",
    "MachineSpec",
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
        self.inject_event(index, "xid", xid, gi_id, ci_id)

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
        ``cluster_uuid=None`` takes them out of any fabric again (NVML answers NOT_SUPPORTED)."""
        fabric = None if cluster_uuid is None else SimFabric(
            cluster_uuid=uuid.UUID(str(cluster_uuid)), clique_id=clique_id, state=state, status=status)
        with self.store.mutate() as s:
            for i in range(len(s.gpus)) if gpus is None else gpus:
                s.gpus[i].fabric = fabric

    def block_reset(self, index: int, blocked: bool = True) -> None:
        with self.store.mutate() as s:
            s.gpus[index].reset_blocked = blocked

    def reset_gpu(self, index: int) -> None:
        """A GPU reset: a pending MIG mode takes effect (instances are gone after a mode change)."""
        with self.store.mutate() as s:
            g = s.gpus[index]
            if g.mig_current != g.mig_pending:
                g.instances = []
            g.mig_current = g.mig_pending
