"""The NVML facade against what real MIG GPUs do to an agent (issue 33, items 1, 8 and 10).

* A GPU in MIG mode refuses its memory and GPU-instance lookups to a process without the MIG monitor
  capability (NVML_ERROR_NO_PERMISSION: NVIDIA/gpu-feature-discovery#6, NVIDIA/k8s-device-plugin#1683): the
  GPU must stay in the inventory with the reason, not turn into a "lost" GPU.
* An empty MIG slot answers NOT_FOUND or INVALID_ARGUMENT; NVIDIA's go-nvlib skips both
  (``pkg/nvlib/device/device.go``, ``VisitMigDevices``): neither may cost the GPU.
* The GPU's brand is ``nvmlDeviceGetBrand``'s, not a guess from the product name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

import nvml_sim as sim
from node_agent.nvml import NvmlBackend, open_nvml
from nvml_sim import SimulatedMachine
from nvml_sim.lib import MIG_MONITOR_ENV

H200_MIG_GPUS = (2, 5)


def _backend(machine: SimulatedMachine) -> NvmlBackend:
    return NvmlBackend("simulated", machine.spec.name, machine.store.path)


@contextlib.contextmanager
def raw_nvml(machine: SimulatedMachine) -> Iterator[None]:
    """nvidia-ml-py itself on the simulated machine (the C API, no facade in between)."""
    lib = sim.install(machine.store)
    pynvml.nvmlInit()
    try:
        yield
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall(lib)


@pytest.fixture
def h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatedMachine]:
    """An HGX H200 whose GPUs 2 and 5 are in MIG mode with two 3g devices each, and whose NVML checks the
    caller's MIG monitor capability; the test process starts without it."""
    monkeypatch.delenv(MIG_MONITOR_ENV, raising=False)
    machine = SimulatedMachine("hgx-h200", tmp_path / "state.json")
    with open_nvml(_backend(machine)) as nvml:
        for index in H200_MIG_GPUS:
            nvml.set_mig_mode(index, True)
            for _ in range(2):
                gi = nvml.create_gpu_instance(index, 9)  # 3g.71gb
                nvml.create_compute_instance(index, gi.id)
    machine.require_mig_monitor()
    yield machine


def test_sim_refuses_mig_parent_reads_without_the_monitor_capability(h200: SimulatedMachine) -> None:
    """The simulator answers as the driver does: NO_PERMISSION on the MIG parent's memory and GPU-instance
    lookups, nothing refused on a GPU outside MIG mode, and everything answered once the caller has it."""
    with raw_nvml(h200):
        parent, plain = pynvml.nvmlDeviceGetHandleByIndex(2), pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NoPermission):
            pynvml.nvmlDeviceGetMemoryInfo(parent)
        with pytest.raises(pynvml.NVMLError_NoPermission):
            pynvml.nvmlDeviceGetGpuInstanceById(parent, 1)
        assert pynvml.nvmlDeviceGetMemoryInfo(plain).total > 0


def test_mig_gpus_without_the_monitor_capability_stay_counted_with_the_reason(h200: SimulatedMachine) -> None:
    with open_nvml(_backend(h200)) as nvml:
        inv = nvml.inventory()
    assert inv.lost == ()
    assert [g.index for g in inv.gpus] == list(range(8))
    for g in inv.gpus:
        if g.index in H200_MIG_GPUS:
            assert g.mig_enabled and g.mig_devices == ()
            assert [r.split(":")[0] for r in g.unreadable] == ["memory", "MIG devices"]
            assert all("Insufficient Permissions" in r and "NVIDIA_MIG_MONITOR_DEVICES=all" in r
                       for r in g.unreadable)
            assert g.memory_mib == h200.spec.model.memory_mib  # the catalogue's, said so by ``unreadable``
        else:
            assert g.unreadable == ()


def test_mig_gpus_read_fully_with_the_monitor_capability(h200: SimulatedMachine,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MIG_MONITOR_ENV, "all")
    with open_nvml(_backend(h200)) as nvml:
        inv = nvml.inventory()
        telemetry = nvml.telemetry(2)
    assert inv.lost == ()
    assert all(g.unreadable == () for g in inv.gpus)
    assert [len(inv.gpus[i].mig_devices) for i in H200_MIG_GPUS] == [2, 2]
    assert telemetry.fb_used_mib is not None


def test_telemetry_of_a_mig_gpu_without_the_capability_leaves_only_the_framebuffer_out(h200: SimulatedMachine) -> None:
    with open_nvml(_backend(h200)) as nvml:
        telemetry = nvml.telemetry(2)
        migs = nvml.mig_memory(2)
    assert (telemetry.fb_used_mib, telemetry.fb_free_mib) == (None, None)
    assert telemetry.gpu_temp_c is not None and telemetry.power_w is not None
    assert len(migs) == 2  # the MIG devices' own memory is theirs to read


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT])
def test_empty_mig_slots_are_skipped_whatever_the_driver_answers(tmp_path: Path, code: int) -> None:
    """Two MIG devices in seven slots: five empty ones, each answering ``code``; the GPU keeps both devices."""
    machine = SimulatedMachine("dgx-a100-80gb", tmp_path / "state.json")
    machine.set_mig_empty_slot_error(1, code)
    with open_nvml(_backend(machine)) as nvml:
        nvml.set_mig_mode(1, True)
        for _ in range(2):
            gi = nvml.create_gpu_instance(1, 9)  # 3g.40gb
            nvml.create_compute_instance(1, gi.id)
        inv = nvml.inventory()
        migs = nvml.mig_memory(1)
    assert inv.lost == ()
    assert [d.profile for d in inv.gpus[1].mig_devices] == ["3g.40gb", "3g.40gb"]
    assert len(migs) == 2


def test_sim_answers_empty_and_out_of_range_mig_slots_as_told(tmp_path: Path) -> None:
    machine = SimulatedMachine("dgx-a100-80gb", tmp_path / "state.json")
    machine.set_mig_empty_slot_error(0, pynvml.NVML_ERROR_INVALID_ARGUMENT)
    with open_nvml(_backend(machine)) as nvml:
        nvml.set_mig_mode(0, True)
        gi = nvml.create_gpu_instance(0, 19)  # 1g.10gb
        nvml.create_compute_instance(0, gi.id)
    with raw_nvml(machine):
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0) is not None
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
        machine.set_mig_empty_slot_error(0, pynvml.NVML_ERROR_NOT_FOUND)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past nvmlDeviceGetMaxMigDeviceCount (7)
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 7)
    with pytest.raises(ValueError, match="expected 6"):
        machine.set_mig_empty_slot_error(0, 999)


def test_brand_is_nvmls_not_the_product_names(tmp_path: Path) -> None:
    """A "Tesla T4" answers NVML_BRAND_NVIDIA (NVIDIA/nvidia-docker#1628); a GPU told otherwise answers that."""
    machine = SimulatedMachine("t4x1", tmp_path / "state.json")
    with open_nvml(_backend(machine)) as nvml:
        gpu = nvml.gpu(0)
    assert (gpu.name, gpu.brand) == ("Tesla T4", pynvml.NVML_BRAND_NVIDIA)
    machine.set_brand(0, pynvml.NVML_BRAND_TESLA)
    with open_nvml(_backend(machine)) as nvml:
        assert nvml.gpu(0).brand == pynvml.NVML_BRAND_TESLA
    machine.remove_functions(["nvmlDeviceGetBrand"])
    with open_nvml(_backend(machine)) as nvml:
        assert nvml.gpu(0).brand is None
