"""The commands only real hardware runs, pinned by exact argv and order through the exec seam.

Every host command goes through ``HostRoot.run`` and its ``executor`` (``node_agent.host.exec``); here a
``RecordingExec`` stands in for the host, so a GPU reset that widens to every GPU, a reboot that becomes a
power-off, a wrong module or unit fails a test. The DRA sharing commands are pinned in
``tests/node_agent/dra/test_exec_pinned.py``, the device plugin's MPS daemons in ``tests/node_agent/deviceplugin``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from node_agent.cli.context import AgentContext
from node_agent.host import CommandResult, HostError, HostRoot
from node_agent.host.exec import HostExec
from node_agent.mig import apply
from node_agent.mig.hardware import GpuInfo, ResetUnavailable
from node_agent.mig.hostfiles import HostCommandRunner, HostRebooter
from node_agent.mig.journal import JournalError
from node_agent.mig.nvmlbackend import NvidiaSmiReset, NvmlMigBackend
from node_agent.nvml import NvmlBackend, open_nvml
from node_agent.setup import runtime, vfio
from nvgpu.nodescripts.facts import VFIO_MODULES
from nvml_sim import SimulatedMachine
from tests.kit.fakecrio import build_crio_host
from tests.kit.fakehost import DEFAULT_MODULES, build_fake_host
from tests.kit.recording_exec import Call, RecordingExec


def test_the_real_executor_is_the_default_and_keeps_the_exec_modes(tmp_path: Path) -> None:
    host = HostRoot(tmp_path, exec_mode="chroot")
    assert isinstance(host.executor, HostExec) and host.executor.host is host
    rec = RecordingExec()
    injected = HostRoot(tmp_path, executor=rec)
    assert injected.run(["anything", "-x"], timeout_s=3, stdin="in", env={"A": "1"}).ok
    assert rec.calls == [Call(("anything", "-x"), {"A": "1"}, "in", 3)]


def test_the_cli_options_select_the_real_executor_and_tests_inject_the_recorder(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()  # a host mounted somewhere: its commands run in it (chroot)
    args = argparse.Namespace(host_root=str(tmp_path), nvml="simulated:l4x2")
    ctx = AgentContext.from_args(args)
    assert isinstance(ctx.host.executor, HostExec) and ctx.host.exec_mode == "chroot"
    # An empty root is laid out as the simulated machine's node, which has no OS to chroot into.
    simulated = AgentContext.from_args(argparse.Namespace(host_root=str(tmp_path / "sim"), nvml="simulated:l4x2"))
    assert simulated.host.exec_mode == "direct"
    rec = RecordingExec()
    ctx = AgentContext.from_args(args, host_factory=lambda r, m: HostRoot(r, exec_mode=m, executor=rec))
    assert ctx.host.executor is rec


# -- MIG manager: GPU reset and reboot -----------------------------------------------------------------


def test_mig_reset_names_exactly_the_pending_gpus(tmp_path: Path) -> None:
    """``nvidia-smi -r -i <bus IDs>`` of the GPUs whose mode change is pending, and of no other GPU."""
    state = tmp_path / "sim.json"
    sim = SimulatedMachine("dgx-a100-80gb", state)
    for index in (2, 5):  # clients hold these two: their mode change stays pending until a reset
        sim.block_reset(index)
    rec = RecordingExec()
    with open_nvml(NvmlBackend("simulated", "dgx-a100-80gb", state)) as nvml:
        bus = {g.index: g.pci_bus_id for g in nvml.inventory().gpus}

        def reset(call: Call) -> None:  # the driver's side of the reset, on the simulated GPUs
            for index, address in bus.items():
                if address in call.argv[-1].split(","):
                    sim.block_reset(index, False)
                    sim.reset_gpu(index)

        rec.on("nvidia-smi", reset)
        backend = NvmlMigBackend(nvml, NvidiaSmiReset(HostCommandRunner(HostRoot(tmp_path, executor=rec))))
        result = apply.set_modes(backend, [(i, True) for i in range(8)])
    assert result.reset == (2, 5) and result.pending == ()
    assert rec.argvs == [["nvidia-smi", "-r", "-i", f"{bus[2]},{bus[5]}"]]
    assert len(set(bus.values())) == 8 and rec.calls[0].timeout_s == 120.0


def test_mig_reset_failure_is_reset_unavailable(tmp_path: Path) -> None:
    rec = RecordingExec({"nvidia-smi": lambda c: CommandResult(c.argv, 255, "", "In use by another client")})
    gpu = GpuInfo(3, "GPU-3", "NVIDIA A100-SXM4-80GB", 0x20B2, "00000000:47:00.0", 0x147F10DE)
    with pytest.raises(ResetUnavailable, match="exited 255: In use by another client"):
        NvidiaSmiReset(HostCommandRunner(HostRoot(tmp_path, executor=rec))).reset([gpu])
    assert rec.argvs == [["nvidia-smi", "-r", "-i", "00000000:47:00.0"]]


def test_reboot_is_systemctl_reboot_and_nothing_else(tmp_path: Path) -> None:
    rec = RecordingExec()
    HostRebooter(HostRoot(tmp_path, executor=rec)).reboot()
    assert rec.argvs == [["systemctl", "reboot"]]
    assert rec.calls[0].env == {} and rec.calls[0].stdin is None

    def absent(call: Call) -> None:
        raise HostError("command 'systemctl' not found on the host")

    with pytest.raises(JournalError, match="cannot reboot"):
        HostRebooter(HostRoot(tmp_path, executor=RecordingExec({"systemctl": absent}))).reboot()


# -- node setup: modprobe, service restarts --------------------------------------------------------------


def test_vfio_prepare_modprobes_each_missing_module_in_order(tmp_path: Path) -> None:
    fake = build_fake_host(tmp_path / "host", "a30x4", modules=DEFAULT_MODULES)
    rec = RecordingExec()
    vfio.prepare(HostRoot(fake.root, executor=rec))
    assert rec.argvs == [["modprobe", m] for m in VFIO_MODULES]
    assert rec.argvs == [["modprobe", "vfio"], ["modprobe", "vfio_pci"], ["modprobe", "vfio_iommu_type1"]]


def test_containerd_apply_restarts_containerd(tmp_path: Path) -> None:
    fake = build_fake_host(tmp_path / "host", "l4x2")
    rec = RecordingExec()
    result = runtime.apply_runtime(HostRoot(fake.root, executor=rec))
    assert result.restarted and result.restarted_units == ["containerd"]
    assert rec.argvs == [["systemctl", "restart", "containerd"]]


def test_crio_apply_restarts_crio(tmp_path: Path) -> None:
    fake = build_crio_host(tmp_path / "host")
    rec = RecordingExec({"crio": lambda c: CommandResult(c.argv, 0, "crio version 1.31.2\n", "")})
    result = runtime.apply_runtime(HostRoot(fake.root, executor=rec))
    assert result.restarted and result.restarted_units == ["crio"]
    assert [a for a in rec.argvs if a[0] != "crio"] == [["systemctl", "restart", "crio"]]
    assert all(a == ["crio", "--version"] for a in rec.argvs if a[0] == "crio")


def test_a_failed_restart_is_a_note(tmp_path: Path) -> None:
    fake = build_fake_host(tmp_path / "host", "l4x2")
    rec = RecordingExec({"systemctl": lambda c: CommandResult(c.argv, 1, "", "Unit containerd.service not found.")})
    result = runtime.apply_runtime(HostRoot(fake.root, executor=rec))
    assert not result.restarted and rec.argvs == [["systemctl", "restart", "containerd"]]
    assert any("Unit containerd.service not found." in n for n in result.notes)
