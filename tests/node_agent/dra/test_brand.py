"""The DRA ``brand`` attribute is NVML's (``nvmlDeviceGetBrand``), spelt as NVIDIA's DRA driver spells it
(go-nvlib's ``GetBrandAsString``), never guessed from the product name (issue 33, item 10)."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from node_agent.dra.devices import allocatable_devices
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.host.root import HostRoot
from node_agent.nvml.session import NvmlBackend
from nvml_sim import SimulatedMachine


def _brands(machine: SimulatedMachine, host_root: Path) -> list[str]:
    source = NvmlInventorySource(NvmlBackend("simulated", machine.spec.name, machine.store.path), HostRoot(host_root))
    try:
        return [str(d.attributes["brand"].value) for d in allocatable_devices(source.snapshot())]
    finally:
        source.close()


def test_a_tesla_t4_is_branded_nvidia_as_nvml_says(host_root: Path, tmp_path: Path) -> None:
    """A "Tesla T4" answers NVML_BRAND_NVIDIA ("Product Brand: NVIDIA", NVIDIA/nvidia-docker#1628)."""
    assert _brands(SimulatedMachine("t4x1", tmp_path / "sim.json"), host_root) == ["Nvidia"]


@pytest.mark.parametrize(("brand", "spelt"), [(pynvml.NVML_BRAND_TESLA, "Tesla"),
                                              (pynvml.NVML_BRAND_NVIDIA_RTX, "NvidiaRTX"),
                                              (pynvml.NVML_BRAND_UNKNOWN, "Unknown")])
def test_the_attribute_follows_nvml_not_the_name(host_root: Path, tmp_path: Path, brand: int, spelt: str) -> None:
    machine = SimulatedMachine("l4x2", tmp_path / "sim.json")
    machine.set_brand(1, brand)
    assert _brands(machine, host_root) == ["Nvidia", spelt]


def test_a_driver_without_the_call_publishes_unknown(host_root: Path, tmp_path: Path) -> None:
    machine = SimulatedMachine("l4x2", tmp_path / "sim.json")
    machine.remove_functions(["nvmlDeviceGetBrand"])
    assert _brands(machine, host_root) == ["Unknown", "Unknown"]
