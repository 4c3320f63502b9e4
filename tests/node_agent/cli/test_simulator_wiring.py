"""The simulated machines are wired in by the CLI only, through ``node_agent.nvml.simulator``.

``nvml_sim`` is a package beside the agent that the agent image may leave out: production modules never
import it (``.importlinter`` says so statically; here a fresh process shows none loads it), the CLI
registers it for ``--nvml simulated:<machine>``, and where it is missing a simulated machine is a usage
error naming why, and ``sim`` is not available, instead of a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.cli import exitcodes
from node_agent.nvml import NvmlBackend, open_nvml, simulator
from nvml_sim import provider

REPO = Path(__file__).resolve().parents[3]
#: Runs the agent's command line as an install without the simulator would (its import fails).
WITHOUT_SIMULATOR = ("import sys; sys.modules['nvml_sim'] = None\n"
                     "from node_agent.cli import main\n"
                     "sys.exit(main(sys.argv[1:]))\n")


def _python(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.fixture
def no_simulator() -> Iterator[None]:
    """This process without a registered simulator (the suite registers one for every test)."""
    simulator.unregister()
    try:
        yield
    finally:
        provider.register()


def test_production_modules_load_no_simulator() -> None:
    """The modules that used to import it (the NVML session, the MIG backend, the CLI's context and ``mig``)."""
    done = _python("-c", "import sys\n"
                   "import node_agent.nvml, node_agent.mig.nvmlbackend, node_agent.cli.context, node_agent.cli.mig\n"
                   "import node_agent.host, node_agent.cli\n"
                   "print(sorted(m for m in sys.modules if m.split('.')[0] == 'nvml_sim'))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_simulated_machine_without_a_registered_simulator_is_refused(no_simulator: None) -> None:
    with pytest.raises(ValueError, match=r"simulated machines are not available.*nvml_sim"):
        NvmlBackend.parse("simulated:dgx-h100")
    with pytest.raises(simulator.SimulatorMissing), open_nvml(NvmlBackend("simulated", "dgx-h100")):
        pass
    assert NvmlBackend.parse("real").kind == "real"


def test_the_cli_registers_the_simulator_for_a_simulated_machine(tmp_path: Path) -> None:
    """A fresh process (no test wiring): ``--nvml simulated:<machine>`` finds the machine's GPUs."""
    done = _python("-m", "node_agent", "--host-root", str(tmp_path / "node"), "--nvml", "simulated:a30x4",
                   "check", "--json")
    assert done.returncode in (exitcodes.OK, exitcodes.FAILED), done.stderr  # FAILED: no runtime configured yet
    assert len(json.loads(done.stdout)["gpus"]) == 4


def test_without_the_simulator_a_simulated_machine_is_a_usage_error(tmp_path: Path) -> None:
    done = _python("-c", WITHOUT_SIMULATOR, "--host-root", str(tmp_path), "--nvml", "simulated:dgx-h100", "check")
    assert done.returncode == exitcodes.USAGE, done.stderr
    assert "simulated machines are not available" in done.stderr and "Traceback" not in done.stderr
    assert not any(tmp_path.iterdir()), "nothing is laid out"


def test_without_the_simulator_sim_is_not_available(tmp_path: Path) -> None:
    done = _python("-c", WITHOUT_SIMULATOR, "--host-root", str(tmp_path), "--nvml", "simulated:dgx-h100", "sim",
                   "status")
    assert done.returncode == exitcodes.USAGE, done.stderr
    assert "command 'sim' is not available" in done.stderr and "Traceback" not in done.stderr
