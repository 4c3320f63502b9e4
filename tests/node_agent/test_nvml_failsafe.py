"""Fail-safe NVML (issue 11, item 6): one GPU's NVML error degrades that GPU only, the in-use check
fails closed on drivers without the newest process-listing symbols, and a wedged GPU costs a bounded
number of threads. The faults come from the simulator (``fail_call``, ``remove_functions``, an old
``set_driver_version``), the same ones ``python -m node_agent sim fail|missing|driver`` injects."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import pytest

from node_agent.cli.context import AgentContext
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices
from node_agent.dra.devices import allocatable_devices
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.host import HostRoot, read_device
from node_agent.mig.hardware import MigHardwareError
from node_agent.mig.nvmlbackend import NvmlMigBackend, SimulatedReset
from node_agent.nvml import NvmlBackend, NvmlError, NvmlTimeout, open_nvml
from node_agent.setup import vfio
from nvgpu import labels
from nvml_sim import SimulatedMachine
from nvml_sim.state import SimProcess
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.fakekernel import FakeKernelHostRoot
from tests.node_agent.agent_testkit import Cli
from tests.node_agent.mig.harness import Rig, mig_node

#: Before 510.39.01: no ``_v3`` process-listing symbols (the t4x1 machine's own driver is one).
OLD_DRIVER = "470.239.06"
#: Before the ``_v2`` symbols too: only the unversioned (v1 struct) listing exists.
OLDER_DRIVER = "440.33.01"
ALL_LISTINGS = [f"nvmlDevice{k}RunningProcesses{v}" for k in ("GetCompute", "GetGraphics") for v in ("_v3", "_v2", "")]


def _backend(machine: SimulatedMachine) -> NvmlBackend:
    return NvmlBackend("simulated", machine.spec.name, machine.store.path)


@pytest.fixture
def h100(tmp_path: Path) -> SimulatedMachine:
    return SimulatedMachine("dgx-h100", tmp_path / "dgx-h100.json")


# -- 1. one GPU at NVML_ERROR_UNKNOWN -------------------------------------------------------------------


def test_inventory_leaves_out_only_the_gpu_at_error_999(h100: SimulatedMachine) -> None:
    h100.fail_call(2, "nvmlDeviceGetMemoryInfo")
    with open_nvml(_backend(h100)) as nvml:
        inv = nvml.inventory()
    assert [g.index for g in inv.gpus] == [0, 1, 3, 4, 5, 6, 7]
    assert [lost.index for lost in inv.lost] == [2]
    assert "999" in inv.lost[0].reason and "nvmlDeviceGetMemoryInfo(2)" in inv.lost[0].reason


def test_labels_with_one_gpu_at_error_999(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    host.machine.fail_call(2, "nvmlDeviceGetMemoryInfo")
    code, doc = cli(host.root, "simulated:dgx-h100", "labels")
    assert code == 0, doc
    assert doc["labels"]["nvidia.com/gpu.count"] == "7"
    assert doc["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    [warning] = doc["warnings"]
    assert warning.startswith("GPU 2 left out:") and "999" in warning


def test_device_plugin_serves_the_other_gpus(h100: SimulatedMachine) -> None:
    h100.fail_call(5, "nvmlDeviceGetUUID")
    with open_nvml(_backend(h100)) as nvml:
        node = NvmlNodeDevices(nvml)
        try:
            served = {g.index: g.uuid for g in node.gpus()}
            assert sorted(served) == [0, 1, 2, 3, 4, 6, 7]
            assert all(node.check(u) for u in served.values())
            # A GPU that starts failing after the plugin started turns unhealthy; the others stay healthy.
            h100.fail_call(3, "nvmlDeviceGetPciInfo")
            assert not node.check(served[3])
            assert all(node.check(u) for i, u in served.items() if i != 3)
        finally:
            node.close()


def test_device_plugin_topology_survives_one_gpus_nvlink_error(h100: SimulatedMachine) -> None:
    h100.fail_call(6, "nvmlDeviceGetNvLinkState")
    with open_nvml(_backend(h100)) as nvml:
        node = NvmlNodeDevices(nvml)
        try:
            gpus = node.gpus()
            assert len(gpus) == 8
            assert node.link(gpus[0], gpus[1]).score > node.link(gpus[0], gpus[6]).score
        finally:
            node.close()


def test_dra_publishes_the_other_gpus(h100: SimulatedMachine, tmp_path: Path) -> None:
    h100.fail_call(4, "nvmlDeviceGetMemoryInfo")
    source = NvmlInventorySource(_backend(h100), HostRoot(tmp_path / "root"))
    try:
        inv = source.snapshot()
        assert sorted(g.index for g in inv.gpus) == [0, 1, 2, 3, 5, 6, 7]
        assert [d.name for d in allocatable_devices(inv)] == [f"gpu-{i}" for i in (0, 1, 2, 3, 5, 6, 7)]
        # A published GPU that starts failing is withdrawn as lost, the others stay.
        h100.fail_call(1, "nvmlDeviceGetName", 999)
        inv = source.snapshot()
        assert [g.index for g in inv.gpus if g.unhealthy == "gpu-lost"] == [1]
        assert [d.name for d in allocatable_devices(inv)] == [f"gpu-{i}" for i in (0, 2, 3, 5, 6, 7)]
    finally:
        source.close()


# -- 2. the in-use check fails closed ----------------------------------------------------------------


A30 = "simulated:a30x4"
GPU1 = "0000:31:00.0"


def _vfio_host(tmp_path: Path) -> tuple[FakeHost, AgentContext]:
    host = build_fake_host(tmp_path, "a30x4")
    args = argparse.Namespace(host_root=str(host.root), host_exec="direct", nvml=A30, nvml_state=None)
    ctx = AgentContext.from_args(args, host_factory=lambda root, mode: FakeKernelHostRoot(root, exec_mode=mode))
    vfio.prepare(ctx.host)
    return host, ctx


@pytest.mark.parametrize("driver", [OLD_DRIVER, OLDER_DRIVER])
def test_processes_are_listed_on_an_old_driver(tmp_path: Path, driver: str) -> None:
    a30 = SimulatedMachine("a30x4", tmp_path / "a30.json")
    a30.set_driver_version(driver)
    a30.set_processes(1, [SimProcess(pid=31337, used_mib=2048)])
    with open_nvml(_backend(a30)) as nvml:
        assert nvml.processes(0) == ()
        assert [(p.pid, p.used_mib) for p in nvml.processes(1)] == [(31337, 2048)]


def test_processes_cannot_tell_without_any_listing_symbol(tmp_path: Path) -> None:
    a30 = SimulatedMachine("a30x4", tmp_path / "a30.json")
    a30.remove_functions(ALL_LISTINGS)
    with open_nvml(_backend(a30)) as nvml, pytest.raises(NvmlError, match="cannot tell whether GPU 0 is in use"):
        nvml.processes(0)


@pytest.mark.parametrize("driver", [OLD_DRIVER, OLDER_DRIVER])
def test_vfio_bind_refuses_a_busy_gpu_on_an_old_driver(tmp_path: Path, cli: Cli, driver: str) -> None:
    host, ctx = _vfio_host(tmp_path)
    assert host.machine is not None
    host.machine.set_driver_version(driver)
    host.machine.set_processes(1, [SimProcess(pid=31337, used_mib=2048)])
    with pytest.raises(vfio.Refused, match="31337"):  # bind waits for the process to exit, a short while here
        vfio.bind(ctx.host, ctx.nvml, GPU1, timeout_s=0.2, poll_s=0.05)
    assert read_device(ctx.host, GPU1).driver == "nvidia"
    code, doc = cli(host.root, A30, "vfio", "bind", GPU1, "--timeout", "0.2")
    assert (code, doc["refused"]) == (5, True)
    assert "31337" in doc["error"]
    assert read_device(ctx.host, GPU1).driver == "nvidia"


def test_vfio_bind_refuses_when_no_listing_symbol_answers(tmp_path: Path, cli: Cli) -> None:
    host, ctx = _vfio_host(tmp_path)
    assert host.machine is not None
    host.machine.remove_functions(ALL_LISTINGS)
    with pytest.raises(vfio.Refused, match="cannot tell whether GPU 1 is in use"):
        vfio.bind(ctx.host, ctx.nvml, GPU1)
    code, doc = cli(host.root, A30, "vfio", "bind", GPU1)
    assert (code, doc["refused"]) == (5, True)
    assert "cannot tell whether GPU 1 is in use" in doc["error"]
    assert read_device(ctx.host, GPU1).driver == "nvidia"


def _mig_rig(tmp_path: Path) -> tuple[SimulatedMachine, NvmlBackend]:
    state = tmp_path / "sim.json"
    return SimulatedMachine("dgx-a100-40gb", state), NvmlBackend("simulated", "dgx-a100-40gb", state)


def test_mig_manager_sees_a_busy_gpu_on_an_old_driver(tmp_path: Path) -> None:
    sim, backend = _mig_rig(tmp_path)
    sim.set_driver_version(OLD_DRIVER)
    sim.set_processes(5, [SimProcess(pid=31337)])
    with open_nvml(backend) as nvml:
        mig = NvmlMigBackend(nvml, SimulatedReset("dgx-a100-40gb", backend.state_file))
        assert list(mig.gpu_processes(5)) == [31337]
        rig = mig_node(Rig(mig), "all-1g.5gb")  # type: ignore[arg-type]
        rig.converge(rounds=400)
        assert rig.node.labels.get(labels.MIG_CONFIG_STATE) == "failed"
        assert "GPU 5 (pid 31337)" in rig.node.events[-1][1]
        assert all(not g.mig_enabled for g in nvml.gpus())  # refused: nothing was changed


def test_mig_manager_refuses_when_it_cannot_tell(tmp_path: Path) -> None:
    sim, backend = _mig_rig(tmp_path)
    sim.remove_functions(ALL_LISTINGS)
    with open_nvml(backend) as nvml:
        mig = NvmlMigBackend(nvml, SimulatedReset("dgx-a100-40gb", backend.state_file))
        with pytest.raises(MigHardwareError, match="cannot tell whether GPU 0 is in use"):
            mig.gpu_processes(0)
        rig = mig_node(Rig(mig), "all-1g.5gb")  # type: ignore[arg-type]
        rig.converge(rounds=400)
        assert rig.node.labels.get(labels.MIG_CONFIG_STATE) == "failed"
        assert "cannot tell whether GPU" in rig.node.events[-1][1]
        assert all(not g.mig_enabled for g in nvml.gpus())


# -- 3. a wedged GPU costs a bounded number of threads ------------------------------------------------


def test_wedged_gpu_does_not_leak_a_thread_per_call(h100: SimulatedMachine) -> None:
    with open_nvml(_backend(h100), timeout_s=0.2) as nvml:
        nvml.inventory()  # the worker thread exists before counting
        before = threading.active_count()
        h100.hang_gpu(2)
        try:
            started = time.monotonic()
            for _ in range(10):
                with pytest.raises(NvmlTimeout):
                    nvml.gpu(2)
            elapsed = time.monotonic() - started
            inv = nvml.inventory()
            # One thread stays behind with the hung call (plus a fresh worker for the other GPUs),
            # not one per timed-out call.
            assert threading.active_count() <= before + 2
            # Only the first call waited its budget; the others failed fast.
            assert elapsed < 0.2 + 10 * 0.25
            assert [lost.index for lost in inv.lost] == [2] and "wedged" in inv.lost[0].reason
            assert len(inv.gpus) == 7
        finally:
            h100.hang_gpu(2, False)
        deadline = time.monotonic() + 5
        while True:
            try:
                assert nvml.gpu(2).index == 2
                break
            except NvmlTimeout:
                assert time.monotonic() < deadline, "GPU 2 did not come back after the hang ended"
                time.sleep(0.05)
        assert len(nvml.inventory().gpus) == 8


# -- 4. the simulator's fault switches -------------------------------------------------------------


def test_sim_cli_injects_call_errors_and_missing_functions(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    code, doc = cli(host.root, "simulated:dgx-h100", "sim", "fail", "3", "nvmlDeviceGetMemoryInfo")
    assert code == 0 and doc["gpus"][3]["call_errors"] == {"nvmlDeviceGetMemoryInfo": 999}
    code, doc = cli(host.root, "simulated:dgx-h100", "sim", "missing", *ALL_LISTINGS)
    assert code == 0 and doc["missing_functions"] == ALL_LISTINGS
    with open_nvml(_backend(host.machine)) as nvml:
        assert [lost.index for lost in nvml.inventory().lost] == [3]
        with pytest.raises(NvmlError, match="cannot tell"):
            nvml.processes(0)
    assert cli(host.root, "simulated:dgx-h100", "sim", "fail", "3", "nvmlDeviceGetMemoryInfo", "none")[0] == 0
    assert cli(host.root, "simulated:dgx-h100", "sim", "missing")[0] == 0
    with open_nvml(_backend(host.machine)) as nvml:
        assert nvml.inventory().lost == ()
        assert nvml.processes(0) == ()
