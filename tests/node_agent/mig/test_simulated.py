"""The MIG manager on simulated machines, through nvidia-ml-py and the agent's NVML facade.

The same executor as production runs against the simulator installed underneath ``pynvml``; only the
API server is faked. Results are read back through the facade (``gpu(i).mig_devices``), as the device
plugin would see them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from node_agent.mig.executor import DEPLOY_LABELS, RECONFIGURE_TAINT
from node_agent.mig.hardware import MigHardwareError
from node_agent.mig.nvmlbackend import NvmlMigBackend, SimulatedReset
from node_agent.nvml import NvmlBackend, NvmlSession, open_nvml
from nvgpu import labels
from nvgpu.catalogue import MigProfile
from nvml_sim import SimulatedMachine
from nvml_sim.state import SimProcess
from tests.node_agent.mig.fakes import FakeNode
from tests.node_agent.mig.harness import Rig, mig_node

CASES = [
    ("dgx-a100-40gb", "all-1g.5gb", ["1g.5gb"] * 7),
    ("dgx-a100-80gb", "all-balanced", ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
    ("dgx-h100", "all-1g.20gb", ["1g.20gb"] * 4),
    ("hgx-h200", "all-3g.71gb", ["3g.71gb"] * 2),
    ("a30x4", "all-balanced", ["1g.6gb", "1g.6gb", "2g.12gb"]),
]


@contextmanager
def simulated(machine: str, state: Path) -> Iterator[tuple[SimulatedMachine, NvmlSession, NvmlMigBackend]]:
    sim = SimulatedMachine(machine, state)
    with open_nvml(NvmlBackend("simulated", machine, state)) as nvml:
        yield sim, nvml, NvmlMigBackend(nvml, SimulatedReset(machine, state))


def returned(node: FakeNode, state: str) -> None:
    assert node.labels.get(labels.MIG_CONFIG_STATE) == state
    assert all(node.labels.get(k) != labels.PAUSED_FOR_MIG_CHANGE for k in DEPLOY_LABELS)
    assert RECONFIGURE_TAINT not in node.taints and not node.unschedulable
    assert set(node.annotations) <= {labels.MIG_FAILURE_REASON}
    assert (labels.MIG_FAILURE_REASON in node.annotations) == (state == "failed")


@pytest.mark.parametrize(("machine", "config", "profiles"), CASES, ids=[c[0] for c in CASES])
def test_reconfigure_simulated_machine(tmp_path: Path, machine: str, config: str, profiles: list[str]) -> None:
    with simulated(machine, tmp_path / "sim.json") as (_, nvml, backend):
        rig = mig_node(Rig(backend), config)  # type: ignore[arg-type]
        rig.converge()
        returned(rig.node, "success")
        for gpu in nvml.gpus():
            assert gpu.mig_mode is not None and gpu.mig_mode.current
            assert sorted(d.profile for d in gpu.mig_devices) == sorted(profiles)
        # Then back to MIG off, as when the node group leaves MIG.
        rig.node.labels.update({labels.MIG_CONFIG: "all-disabled", labels.DEVICE_GPU_CONFIG: "Exclusive"})
        rig.converge()
        assert labels.MIG_CONFIG not in rig.node.labels
        assert all(not g.mig_enabled and not g.mig_devices for g in nvml.gpus())


def test_process_holding_a_gpu_fails_cleanly(tmp_path: Path) -> None:
    with simulated("dgx-h100", tmp_path / "sim.json") as (sim, nvml, backend):
        sim.set_processes(5, [SimProcess(pid=31337)])
        rig = mig_node(Rig(backend), "all-7g.80gb")  # type: ignore[arg-type]
        rig.converge(rounds=400)
        returned(rig.node, "failed")
        assert "GPU 5 (pid 31337)" in rig.node.events[-1][1]
        assert all(not g.mig_enabled for g in nvml.gpus())  # nothing half-applied


def test_reset_blocked_needs_reboot_and_resumes(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    with simulated("dgx-a100-80gb", state) as (sim, nvml, backend):
        for i in range(8):
            sim.block_reset(i)
        rig = mig_node(Rig(backend, allow_reboot=True), "all-2g.20gb")  # type: ignore[arg-type]
        rig.run_until_reboot()
        assert rig.rebooter.count == 1 and rig.node.labels[labels.MIG_CONFIG_STATE] == "rebooting"
        assert nvml.mig_mode(0) is not None and nvml.mig_mode(0).change_pending  # type: ignore[union-attr]
        for i in range(8):  # the reboot: the pending mode takes effect
            sim.block_reset(i, False)
            sim.reset_gpu(i)
        rig.boot[0] = "boot-2"
        rig.converge()
        returned(rig.node, "success")
        assert all(sorted(d.profile for d in g.mig_devices) == ["2g.20gb"] * 3 for g in nvml.gpus())


class FailingBackend(NvmlMigBackend):
    """NVML refuses the n-th instance creation, as it does when memory is fragmented or ECC trips."""

    def __init__(self, inner: NvmlMigBackend, fail_at: int) -> None:
        super().__init__(inner.nvml, inner.resetter)
        self.creates = 0
        self.fail_at = fail_at

    def create_instance(self, index: int, profile: MigProfile, start: int) -> None:
        self.creates += 1
        if self.creates == self.fail_at:
            raise MigHardwareError(f"GPU {index}: creating {profile.name} at slice {start}: Insufficient Resources")
        super().create_instance(index, profile, start)


def test_nvml_error_mid_apply_restores_the_previous_layout(tmp_path: Path) -> None:
    with simulated("a30x4", tmp_path / "sim.json") as (_, nvml, backend):
        rig = mig_node(Rig(backend), "all-2g.12gb")  # type: ignore[arg-type]
        rig.converge()
        before = [sorted(d.profile for d in g.mig_devices) for g in nvml.gpus()]
        rig.backend = FailingBackend(backend, fail_at=5)  # type: ignore[assignment]
        rig.node.labels[labels.MIG_CONFIG] = "all-1g.6gb"
        rig.converge()
        returned(rig.node, "failed")
        assert [sorted(d.profile for d in g.mig_devices) for g in nvml.gpus()] == before
        assert "Insufficient Resources" in rig.node.events[-1][1]


def test_lost_gpu_is_reported(tmp_path: Path) -> None:
    with simulated("dgx-a100-40gb", tmp_path / "sim.json") as (sim, _, backend):
        sim.lose_gpu(3)
        rig = mig_node(Rig(backend), "all-7g.40gb")  # type: ignore[arg-type]
        assert rig.converge() == ["reject", "idle"]
        assert "GPU 3" in rig.node.events[0][1]
