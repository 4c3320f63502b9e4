"""The one door to simulated machines: a :class:`Simulator` registered at run time, never imported.

``--nvml simulated:<machine>`` runs the agent on a simulated GPU machine (with fault injection, a
simulated ``nvidia-smi`` and a simulated node laid out under ``--host-root``). The simulator is a package
of its own beside the agent (``nvml_sim``), so the agent image can ship without it and no production
module branches on its internals: what production code needs of it is this protocol, and
``node_agent.cli`` (the one place that imports ``nvml_sim``) registers it when a command line asks for a
simulated machine; the test suite registers it for every test (``tests/conftest.py``).

What is asked of it, and by whom: the machine names (``NvmlBackend.parse``), putting the machine's NVML
library in place for a session and taking it away (``open_nvml``), the simulated ``nvidia-smi -r``
(``node_agent.mig.nvmlbackend.SimulatedReset``), and for the CLI's simulated hosts: where the machine's
state lives under a host root, whether a root is a simulated host (and of which machine), laying one out,
and making its device nodes as regular files (its users run as non-root, where mknod fails).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

__all__ = [
    "MISSING",
    "ResetRefused",
    "Simulator",
    "SimulatorMissing",
    "get",
    "register",
    "registered",
    "unregister",
]


class ResetRefused(RuntimeError):
    """The simulated ``nvidia-smi -r`` refused: something holds the GPUs."""


class SimulatorMissing(LookupError):
    """A simulated machine was asked for and no simulator is registered (this install lacks ``nvml_sim``)."""


class Simulator(Protocol):
    """Simulated GPU machines, as production code uses them (implemented by ``nvml_sim.provider``)."""

    @property
    def machine_names(self) -> tuple[str, ...]:
        """The machines ``--nvml simulated:<machine>`` accepts."""
        ...

    @property
    def state_dir(self) -> str:
        """Host-absolute directory, under a host root other than ``/``, of each machine's state file
        (``<machine>.json``), so separate agent processes against the same root see the same machine."""
        ...

    def install(self, machine: str, state_file: Path | None) -> object:
        """Make nvidia-ml-py talk to ``machine`` (process-wide) for one session; the answer goes to
        :meth:`uninstall`."""
        ...

    def uninstall(self, installed: object) -> None:
        """Undo the matching :meth:`install`."""
        ...

    def reset(self, machine: str, state_file: Path | None, indices: Iterable[int]) -> None:
        """``nvidia-smi -r`` of these GPUs; raises :class:`ResetRefused` (nothing reset) while they are held."""
        ...

    def is_simulated_host(self, root: Path) -> bool:
        """Whether ``root`` was laid out as a simulated host."""
        ...

    def machine_of(self, root: Path) -> str | None:
        """The machine a simulated host was laid out for."""
        ...

    def lay_out(self, root: Path, machine: str) -> None:
        """Lay out (or bring back) ``machine``'s node under ``root``."""
        ...

    def device_node_stand_in(self, local: Path, major: int, minor: int, mode: int) -> None:
        """A simulated host's ``HostRoot.mknod``: a regular file standing for the character device."""
        ...


#: Why a simulated machine cannot be had.
MISSING = ("simulated machines are not available: no simulator is registered in this process (the nvml_sim "
           "package is not installed, as in the agent image)")

_lock = threading.Lock()
_registered: Simulator | None = None


def register(simulator: Simulator) -> None:
    """Make ``simulator`` the one behind ``--nvml simulated:<machine>`` in this process (a later one replaces it)."""
    global _registered
    with _lock:
        _registered = simulator


def unregister() -> None:
    """No simulator again (tests of an install without one)."""
    global _registered
    with _lock:
        _registered = None


def registered() -> Simulator | None:
    return _registered


def get() -> Simulator:
    """The registered simulator; :class:`SimulatorMissing` when there is none."""
    simulator = _registered
    if simulator is None:
        raise SimulatorMissing(MISSING)
    return simulator
