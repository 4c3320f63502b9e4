"""MIG operations through the facade, checked against the catalogue's profiles and placements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node_agent.nvml import (
    NvmlBackend,
    NvmlInsufficientResources,
    NvmlInUse,
    NvmlInvalidArgument,
    NvmlNotSupported,
    open_nvml,
)
from nvgpu.mig import all_profile_layout
from nvml_sim import MACHINES, SimulatedMachine
from nvml_sim.lib import FakeNvmlLibrary
from nvml_sim.state import SimProcess

MIG_MACHINES = [name for name, spec in MACHINES.items() if spec.model.mig is not None]


def _backend(machine: SimulatedMachine) -> NvmlBackend:
    return NvmlBackend("simulated", machine.spec.name, machine.store.path)


@pytest.mark.parametrize("machine", MIG_MACHINES)
def test_profiles_match_the_catalogue(machine: str) -> None:
    mig = MACHINES[machine].model.mig
    assert mig is not None
    with open_nvml(f"simulated:{machine}") as nvml:
        profiles = {p.name: p for p in nvml.gpu_instance_profiles(0)}
        for p in mig.profiles:
            got = profiles[p.name]
            assert (got.id, got.profile, got.slice_count, got.instance_count, got.memory_mib) == (
                p.profile_id, p.gi_profile, p.compute_slices, p.max_instances, p.memory_mib)
            assert nvml.possible_placements(0, p.profile_id) == tuple(
                (type(nvml.possible_placements(0, p.profile_id)[0]))(s, p.memory_slices) for s in p.placement_starts)


@pytest.mark.parametrize("machine", MIG_MACHINES)
def test_every_all_profile_layout_can_be_created(machine: str) -> None:
    model = MACHINES[machine].model
    assert model.mig is not None
    with open_nvml(f"simulated:{machine}") as nvml:
        assert nvml.set_mig_mode(1, True).current
        for profile in model.mig.profiles:
            count = all_profile_layout(model, profile.name)[profile.name]
            for _ in range(count):
                gi = nvml.create_gpu_instance(1, profile.profile_id)
                nvml.create_compute_instance(1, gi.id)
            assert nvml.remaining_capacity(1, profile.profile_id) == 0
            with pytest.raises(NvmlInsufficientResources):
                nvml.create_gpu_instance(1, profile.profile_id)
            devices = nvml.gpu(1).mig_devices
            assert [d.profile for d in devices] == [profile.name] * count
            assert {d.memory_mib for d in devices} == {profile.memory_mib}
            assert len({d.uuid for d in devices}) == count
            for gi in nvml.gpu_instances(1):
                for ci in nvml.compute_instances(1, gi.id):
                    nvml.destroy_compute_instance(1, gi.id, ci.id)
                nvml.destroy_gpu_instance(1, gi.id)
            assert nvml.gpu(1).mig_devices == ()
        assert not nvml.set_mig_mode(1, False).current


def test_placement_rules() -> None:
    with open_nvml("simulated:dgx-a100-40gb") as nvml:
        nvml.set_mig_mode(0, True)
        with pytest.raises(NvmlInvalidArgument):
            nvml.create_gpu_instance(0, 9, start=2)  # 3g.20gb starts at 0 or 4 only
        gi = nvml.create_gpu_instance(0, 9, start=4)
        assert (gi.placement.start, gi.placement.size) == (4, 4)
        with pytest.raises(NvmlInsufficientResources):
            nvml.create_gpu_instance(0, 14, start=4)  # 2g.10gb overlaps
        nvml.create_gpu_instance(0, 14, start=0)
        nvml.create_gpu_instance(0, 19, start=2)
        assert nvml.create_gpu_instance(0, 19).placement.start == 3  # the balanced layout: 3g + 2g + 2 x 1g
        with pytest.raises(NvmlInsufficientResources):
            nvml.create_gpu_instance(0, 19)
        with pytest.raises(NvmlInUse):
            nvml.set_mig_mode(0, False)


def test_partial_compute_instances() -> None:
    with open_nvml("simulated:dgx-h100") as nvml:
        nvml.set_mig_mode(0, True)
        gi = nvml.create_gpu_instance(0, 9)
        nvml.create_compute_instance(0, gi.id, slices=1)
        nvml.create_compute_instance(0, gi.id, slices=2)
        profiles = sorted(d.profile for d in nvml.gpu(0).mig_devices)
        assert profiles == ["1c.3g.40gb", "2c.3g.40gb"]
        with pytest.raises(NvmlNotSupported):
            nvml.create_compute_instance(0, gi.id, slices=7)
        with pytest.raises(NvmlInUse):
            nvml.destroy_gpu_instance(0, gi.id)


def test_mig_not_supported_on_l4() -> None:
    with open_nvml("simulated:l4x2") as nvml:
        assert nvml.gpu(0).mig_mode is None
        with pytest.raises(NvmlNotSupported):
            nvml.set_mig_mode(0, True)


def test_mode_change_stays_pending_while_gpu_is_held(tmp_path: Path) -> None:
    a100 = SimulatedMachine("dgx-a100-80gb", tmp_path / "a100.json")
    a100.set_processes(2, [SimProcess(pid=77)])
    with open_nvml(_backend(a100)) as nvml:
        mode = nvml.set_mig_mode(2, True)
        assert (mode.current, mode.pending, mode.change_pending) == (False, True, True)
        a100.set_processes(2, [])
        a100.reset_gpu(2)
        assert nvml.mig_mode(2) == type(mode)(True, True)


def test_state_file_is_shared_with_another_process(tmp_path: Path) -> None:
    state = tmp_path / "h200.json"
    h200 = SimulatedMachine("hgx-h200", state)
    with open_nvml(_backend(h200)) as nvml:
        nvml.set_mig_mode(3, True)
        gi = nvml.create_gpu_instance(3, 9)
        nvml.create_compute_instance(3, gi.id)
    code = (
        "from pathlib import Path\n"
        "from node_agent.nvml import NvmlBackend, open_nvml\n"
        "from nvml_sim import provider\n"
        "provider.register()\n"
        f"b = NvmlBackend('simulated', 'hgx-h200', Path({str(state)!r}))\n"
        "with open_nvml(b) as n:\n"
        "    print(','.join(d.profile for d in n.gpu(3).mig_devices))\n"
        "    g = n.create_gpu_instance(3, 19)\n"
        "    n.create_compute_instance(3, g.id)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "3g.71gb"
    with open_nvml(_backend(h200)) as nvml:
        assert sorted(d.profile for d in nvml.gpu(3).mig_devices) == ["1g.18gb", "3g.71gb"]


def test_old_driver_without_the_v2_profile_call_gets_catalogue_names(monkeypatch: pytest.MonkeyPatch) -> None:
    original = FakeNvmlLibrary.__getattr__

    def without_v2(self: FakeNvmlLibrary, name: str) -> object:
        if name == "nvmlDeviceGetGpuInstanceProfileInfoV":
            raise AttributeError(name)
        return original(self, name)

    monkeypatch.setattr(FakeNvmlLibrary, "__getattr__", without_v2)
    with open_nvml("simulated:dgx-a100-40gb") as nvml:
        nvml.set_mig_mode(0, True)
        names = {p.name for p in nvml.gpu_instance_profiles(0)}
        gi = nvml.create_gpu_instance(0, 15)
        nvml.create_compute_instance(0, gi.id)
        devices = nvml.gpu(0).mig_devices
    assert names == {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}
    assert [d.profile for d in devices] == ["1g.10gb"]
