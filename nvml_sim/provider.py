"""The simulated machines as the agent asks for them: ``node_agent.nvml.simulator.Simulator``, implemented.

The agent never imports this package: ``node_agent.cli`` (for ``--nvml simulated:<machine>``), the tests'
``conftest.py``, the benchmarks and the simulated ``nvidia-smi`` call :func:`register`, and from then on
``open_nvml``, ``NvmlBackend.parse``, the MIG manager's ``SimulatedReset`` and the CLI's simulated hosts find
the machines through the protocol. Each method is a thin call into the package's own modules, where the
behaviour (and its source citations) lives.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from node_agent.nvml import simulator
from nvml_sim import DEFAULT_STATE_DIR, MACHINE_NAMES, FakeNvmlLibrary, SimStore, SimulatedMachine, install, uninstall
from nvml_sim import host as sim_host


class NvmlSimulator:
    """:class:`node_agent.nvml.simulator.Simulator` over this package's machines and simulated hosts."""

    machine_names: tuple[str, ...] = MACHINE_NAMES
    state_dir: str = DEFAULT_STATE_DIR

    def install(self, machine: str, state_file: Path | None) -> object:
        return install(SimStore(machine, state_file))

    def uninstall(self, installed: object) -> None:
        if isinstance(installed, FakeNvmlLibrary):
            uninstall(installed)

    def reset(self, machine: str, state_file: Path | None, indices: Iterable[int]) -> None:
        SimulatedMachine(machine, state_file).smi_reset(indices)

    def is_simulated_host(self, root: Path) -> bool:
        return sim_host.is_simulated_host(root)

    def machine_of(self, root: Path) -> str | None:
        return sim_host.machine_of(root)

    def lay_out(self, root: Path, machine: str) -> None:
        sim_host.lay_out(root, machine)

    def device_node_stand_in(self, local: Path, major: int, minor: int, mode: int) -> None:
        sim_host.device_node_stand_in(local, major, minor, mode)


#: The one instance registered; the protocol is stateless here (each machine's state is in its store).
SIMULATOR = NvmlSimulator()


def register() -> NvmlSimulator:
    """Make these machines the ones behind ``--nvml simulated:<machine>`` in this process; answers the simulator."""
    simulator.register(SIMULATOR)
    return SIMULATOR
