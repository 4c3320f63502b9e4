"""MIG mode changes that need a GPU reset, done as NVIDIA's mig-parted does them (issue 33, item 7).

mig-parted shuts NVML down before ``nvidia-smi -r`` (``cmd/nvidia-mig-parted/apply/mode.go``), its hooks stop
the host's GPU clients around the change (``deployments/systemd/hooks.sh``: ``nvsm.service``,
``nvidia-dcgm.service``), and its script asserts the mode afterwards. The simulated machines hold an A100's
mode pending while anything holds the GPU (a running host client included), refuse the reset while any
process has NVML open or a host client runs, and change a Hopper GPU's mode without a reset.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node_agent.cli import main
from node_agent.host import HostRoot
from node_agent.mig.hostfiles import HostCommandRunner, HostGpuClients
from node_agent.mig.nvmlbackend import NvidiaSmiReset, NvmlMigBackend, SimulatedReset
from node_agent.nvml import NvmlBackend, open_nvml
from nvgpu import labels
from nvgpu.migparted import build_config
from nvml_sim import SimulatedMachine
from tests.kit.fakehost import build_fake_host, sim_state_file
from tests.node_agent.mig.harness import Rig, mig_node

DCGM = "nvidia-dcgm.service"
EXIT_REBOOT = 5


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "mig.yaml"
    path.write_text(build_config().to_yaml())
    return path


def _host(tmp_path: Path, machine: str) -> tuple[Path, SimulatedMachine]:
    fake = build_fake_host(tmp_path / "host", machine)
    assert fake.machine is not None
    return fake.root, fake.machine


def _apply(capsys: pytest.CaptureFixture[str], root: Path, machine: str, config: Path, name: str
           ) -> tuple[int, dict[str, object]]:
    code = main(["--json", "--host-root", str(root), "--host-exec", "direct", "--nvml", f"simulated:{machine}",
                 "mig", "apply",
                 "--config", str(config), "--name", name])
    return code, json.loads(capsys.readouterr().out)


def _systemctl_log(root: Path) -> list[str]:
    log = root / "var/log/simulated-systemctl.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a100_mode_change_stops_the_host_clients_and_nvml_for_the_reset(
        tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DCGM running on the host keeps the A100s' new mode pending; the reset works once DCGM is stopped and
    the manager's own NVML session is shut down, and DCGM runs again afterwards."""
    root, sim = _host(tmp_path, "dgx-a100-40gb")
    sim.set_host_service(DCGM, True)
    code, doc = _apply(capsys, root, "dgx-a100-40gb", config_file, "all-1g.5gb")
    assert code == 0, doc
    assert all(g.mig_current and g.mig_pending for g in sim.state.gpus), "enabled, nothing left pending"
    assert all(len(g.instances) == 7 for g in sim.state.gpus)
    assert sim.state.host_services == {DCGM: True}, "started again after the reset"
    calls = _systemctl_log(root)
    assert f"stop {DCGM}" in calls and calls.index(f"stop {DCGM}") < calls.index(f"start {DCGM}")


def test_hopper_changes_mode_without_a_reset_and_leaves_the_host_clients_alone(
        tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, sim = _host(tmp_path, "dgx-h100")
    sim.set_host_service(DCGM, True)
    code, doc = _apply(capsys, root, "dgx-h100", config_file, "all-1g.10gb")
    assert code == 0, doc
    assert all(g.mig_current for g in sim.state.gpus)
    assert not [c for c in _systemctl_log(root) if c.startswith("stop")]


def test_a_mode_still_pending_after_the_reset_fails_with_that_reason(
        tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An A100 passed through to a VM keeps its mode pending across a GPU reset (nvml.h: a VM reboot is
    required): the apply fails saying so, asks for a reboot, and puts the GPUs back as they were."""
    root, sim = _host(tmp_path, "dgx-a100-40gb")
    sim.set_virtualization_mode(1)
    code, doc = _apply(capsys, root, "dgx-a100-40gb", config_file, "all-1g.5gb")
    assert code == EXIT_REBOOT, doc
    assert "MIG mode still pending on GPU 0, 1, 2, 3, 4, 5, 6, 7 after the GPU reset" in str(doc["error"])
    assert all(not g.mig_pending for g in sim.state.gpus), "the mode change was withdrawn"


def test_the_reset_is_refused_while_another_process_has_nvml_open(
        tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another NVML client (a device plugin left running) holds the GPUs: nvidia-smi -r refuses."""
    root, sim = _host(tmp_path, "dgx-a100-40gb")
    sim.set_host_service(DCGM, True)
    state = sim_state_file(root, "dgx-a100-40gb")
    with open_nvml(NvmlBackend("simulated", "dgx-a100-40gb", state)):
        code, doc = _apply(capsys, root, "dgx-a100-40gb", config_file, "all-1g.5gb")
    assert code == EXIT_REBOOT and "In use by another client (a process has NVML open)" in str(doc["error"])
    assert sim.state.host_services == {DCGM: True}, "started again although the reset failed"


def test_the_manager_converges_an_a100_with_dcgm_running(tmp_path: Path) -> None:
    """The MIG manager's own loop, with the production host clients over the fake host's systemctl."""
    root, sim = _host(tmp_path, "dgx-a100-40gb")
    sim.set_host_service(DCGM, True)
    state = sim_state_file(root, "dgx-a100-40gb")
    with open_nvml(NvmlBackend("simulated", "dgx-a100-40gb", state)) as nvml:
        backend = NvmlMigBackend(nvml, SimulatedReset("dgx-a100-40gb", state), HostGpuClients(HostRoot(root)))
        rig = mig_node(Rig(backend), "all-1g.5gb")  # type: ignore[arg-type]
        rig.converge()
        assert rig.node.labels.get(labels.MIG_CONFIG_STATE) == "success", rig.node.annotations
        assert all(len(g.mig_devices) == 7 for g in nvml.gpus())
    assert sim.state.host_services == {DCGM: True}


def test_sim_service_command_runs_a_host_client(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, sim = _host(tmp_path, "dgx-a100-40gb")
    assert main(["--json", "--host-root", str(root), "--nvml", "simulated:dgx-a100-40gb", "sim", "service", DCGM,
                 "on"]) == 0
    assert json.loads(capsys.readouterr().out)["host_services"] == {DCGM: True}
    assert sim.reset_refusal([0]) == f"In use by another client (host services: {DCGM})"


def test_the_production_reset_runs_the_hosts_nvidia_smi(tmp_path: Path) -> None:
    """``nvidia-smi -r -i <bus>`` as a host command (the simulated host's own nvidia-smi, another process):
    it succeeds only because this process shut its NVML down and DCGM was stopped for it."""
    root, sim = _host(tmp_path, "dgx-a100-40gb")
    sim.set_host_service(DCGM, True)
    host = HostRoot(root, exec_mode="direct")
    with open_nvml(NvmlBackend("simulated", "dgx-a100-40gb", sim_state_file(root, "dgx-a100-40gb"))) as nvml:
        nvml.set_mig_mode(3, True)
        mode = nvml.mig_mode(3)
        assert mode is not None and (mode.current, mode.pending) == (False, True), "DCGM holds the A100"
        NvmlMigBackend(nvml, NvidiaSmiReset(HostCommandRunner(host)), HostGpuClients(host)).reset_gpus([3])
        mode = nvml.mig_mode(3)
        assert mode is not None and mode.current, "NVML answers again after the reset"
    assert sim.state.host_services == {DCGM: True}
    assert f"stop {DCGM}" in _systemctl_log(root)
