"""The simulated machines, read through the facade (and so through real nvidia-ml-py calls)."""

from __future__ import annotations

import pytest

from node_agent.nvml import NvmlBackend, TopologyLevel, normalize_bus_id, open_nvml
from nvgpu import catalogue
from nvml_sim import MACHINE_NAMES, MACHINES


@pytest.mark.parametrize("machine", MACHINE_NAMES)
def test_inventory_matches_machine_and_catalogue(machine: str) -> None:
    spec = MACHINES[machine]
    with open_nvml(f"simulated:{machine}") as nvml:
        driver = nvml.driver()
        inv = nvml.inventory()
    assert driver.driver_version == spec.driver_version
    assert driver.cuda_driver_version == (spec.cuda_driver_version // 1000, spec.cuda_driver_version % 1000 // 10)
    assert inv.lost == ()
    assert [g.index for g in inv.gpus] == list(range(spec.gpu_count))
    assert len({g.uuid for g in inv.gpus}) == spec.gpu_count
    listed = spec.model in catalogue.MODELS  # unlisted-x2's board is deliberately not in the catalogue
    for gpu in inv.gpus:
        model = spec.model
        assert catalogue.model_by_product_name(gpu.name) is (model if listed else None)
        assert catalogue.model_by_pci_device(gpu.pci_device_id) is (model if listed else None)
        assert gpu.memory_mib == model.memory_mib
        assert gpu.compute_capability == model.compute_capability
        assert gpu.architecture == model.architecture
        assert gpu.pci_bus_id == spec.bus_ids[gpu.index]
        assert gpu.numa_node == spec.numa_nodes[gpu.index]
        assert gpu.uuid.startswith("GPU-")
        assert (gpu.mig_mode is not None) == model.mig_capable


def test_uuids_are_stable_across_sessions() -> None:
    with open_nvml("simulated:dgx-a100-40gb") as nvml:
        first = [g.uuid for g in nvml.gpus()]
    with open_nvml("simulated:dgx-a100-40gb") as nvml:
        assert [g.uuid for g in nvml.gpus()] == first
    with open_nvml("simulated:dgx-a100-80gb") as nvml:
        assert not set(first) & {g.uuid for g in nvml.gpus()}


@pytest.mark.parametrize(("machine", "links"), [("dgx-a100-40gb", 12), ("dgx-h100", 18), ("hgx-h200", 18)])
def test_nvswitch_machines_join_every_pair(machine: str, links: int) -> None:
    with open_nvml(f"simulated:{machine}") as nvml:
        topo = nvml.topology()
    assert len(topo.pairs) == 28
    assert {p.nvlinks for p in topo.pairs} == {links}
    same_socket = topo.pair(0, 3)
    cross_socket = topo.pair(3, 4)
    assert same_socket is not None and cross_socket is not None
    assert same_socket.level < cross_socket.level == TopologyLevel.SYSTEM


def test_a30_bridges_join_pairs_only() -> None:
    with open_nvml("simulated:a30x4") as nvml:
        topo = nvml.topology()
    linked = {(p.a, p.b): p.nvlinks for p in topo.pairs if p.nvlinks}
    assert linked == {(0, 1): 4, (2, 3): 4}


def test_pcie_only_machine_has_no_nvlink() -> None:
    with open_nvml("simulated:l4x2") as nvml:
        topo = nvml.topology()
    assert [(p.a, p.b, p.nvlinks, p.level) for p in topo.pairs] == [(0, 1, 0, TopologyLevel.SYSTEM)]


def test_dgx_a100_pairs_share_a_pcie_switch() -> None:
    with open_nvml("simulated:dgx-a100-40gb") as nvml:
        topo = nvml.topology([0, 1, 2])
    assert [p.level for p in topo.pairs] == [TopologyLevel.MULTIPLE, TopologyLevel.NODE, TopologyLevel.NODE]


def test_bus_id_normalisation() -> None:
    assert normalize_bus_id("00000000:5D:00.0") == "0000:5d:00.0"


def test_backend_parse_names_allowed_values() -> None:
    assert NvmlBackend.parse("real").kind == "real"
    assert NvmlBackend.parse("simulated:t4x1").machine == "t4x1"
    with pytest.raises(ValueError, match="dgx-h100"):
        NvmlBackend.parse("simulated:dgx-z9")
    with pytest.raises(ValueError, match="real"):
        NvmlBackend.parse("fake")
