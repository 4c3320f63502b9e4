"""The simulated machines: realistic GPU servers described as data, facts drawn from the catalogue.

Only what is *about the machine* lives here (how many GPUs, bus IDs, sockets, NVLink wiring, the
installed driver). What is *about the GPU model* (memory, compute capability, MIG profiles) comes
from ``nvgpu.catalogue``. Bus IDs and socket layouts follow the published DGX/HGX topologies; UUIDs
are derived from the machine name so they are stable across runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from nvgpu import catalogue
from nvgpu.catalogue import GpuModel

_UUID_NS = uuid.UUID("6f1c8a52-4a0e-4a53-9c34-5b2a8f0d7e11")


@dataclass(frozen=True)
class MachineSpec:
    name: str
    model: GpuModel
    product_name: str  #: what nvmlDeviceGetName reports
    pci_device_id: int
    pci_subsystem_id: int
    bus_ids: tuple[str, ...]  #: NVML form, one per GPU
    numa_nodes: tuple[int, ...]  #: one per GPU
    driver_version: str
    cuda_driver_version: int  #: NVML's encoding: 12040 = 12.4
    dmi_product: str
    #: NVLink wiring: "nvswitch" (every GPU's links go into the switch fabric), "pairs" (bridges
    #: between GPU 2k and 2k+1) or "none".
    nvlink: str = "none"
    nvswitch_count: int = 0
    #: PCIe tree: GPUs sharing a PCIe switch (same group) are MULTIPLE/SINGLE apart; same socket NODE.
    pcie_switch_groups: tuple[int, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.bus_ids)

    @property
    def nvlinks_per_gpu(self) -> int:
        return self.model.nvlink_per_gpu if self.nvlink != "none" else 0

    def gpu_uuid(self, index: int) -> str:
        return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{self.name}/gpu/{index}"))

    def mig_uuid(self, index: int, gi: int, ci: int) -> str:
        return "MIG-" + str(uuid.uuid5(_UUID_NS, f"{self.name}/gpu/{index}/gi/{gi}/ci/{ci}"))

    def nvswitch_bus_id(self, switch: int) -> str:
        return f"00000000:{0xC4 + switch:02X}:00.0"


def _pairs(n: int) -> tuple[int, ...]:
    return tuple(i // 2 for i in range(n))


_DGX_A100_BUS = ("00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0",
                 "00000000:87:00.0", "00000000:90:00.0", "00000000:B7:00.0", "00000000:BD:00.0")
_DGX_H100_BUS = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
                 "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0")
_TWO_SOCKETS_8 = (0, 0, 0, 0, 1, 1, 1, 1)

MACHINES: dict[str, MachineSpec] = {
    m.name: m
    for m in (
        MachineSpec(
            name="dgx-a100-40gb", model=catalogue.A100_40GB, product_name="NVIDIA A100-SXM4-40GB",
            pci_device_id=0x20B0, pci_subsystem_id=0x134F10DE, bus_ids=_DGX_A100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="535.183.06", cuda_driver_version=12020, dmi_product="DGXA100 920-23687-2530-000",
            nvlink="nvswitch", nvswitch_count=6, pcie_switch_groups=_pairs(8),
        ),
        MachineSpec(
            name="dgx-a100-80gb", model=catalogue.A100_80GB, product_name="NVIDIA A100-SXM4-80GB",
            pci_device_id=0x20B2, pci_subsystem_id=0x147F10DE, bus_ids=_DGX_A100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="535.183.06", cuda_driver_version=12020, dmi_product="DGXA100 920-23687-2531-000",
            nvlink="nvswitch", nvswitch_count=6, pcie_switch_groups=_pairs(8),
        ),
        MachineSpec(
            name="dgx-h100", model=catalogue.H100_80GB, product_name="NVIDIA H100 80GB HBM3",
            pci_device_id=0x2330, pci_subsystem_id=0x16C110DE, bus_ids=_DGX_H100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="550.90.07", cuda_driver_version=12040, dmi_product="DGXH100",
            nvlink="nvswitch", nvswitch_count=4, pcie_switch_groups=tuple(range(8)),
        ),
        MachineSpec(
            name="hgx-h200", model=catalogue.H200_141GB, product_name="NVIDIA H200",
            pci_device_id=0x2335, pci_subsystem_id=0x18BE10DE, bus_ids=_DGX_H100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="550.127.05", cuda_driver_version=12040, dmi_product="HGX H200 8-GPU",
            nvlink="nvswitch", nvswitch_count=4, pcie_switch_groups=tuple(range(8)),
        ),
        MachineSpec(
            name="a30x4", model=catalogue.A30_24GB, product_name="NVIDIA A30",
            pci_device_id=0x20B7, pci_subsystem_id=0x153210DE,
            bus_ids=("00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0", "00000000:CA:00.0"),
            numa_nodes=(0, 0, 1, 1), driver_version="535.161.08", cuda_driver_version=12020,
            dmi_product="PowerEdge R750xa", nvlink="pairs", pcie_switch_groups=(0, 1, 2, 3),
        ),
        MachineSpec(
            name="l4x2", model=catalogue.L4, product_name="NVIDIA L4",
            pci_device_id=0x27B8, pci_subsystem_id=0x16CA10DE,
            bus_ids=("00000000:01:00.0", "00000000:81:00.0"), numa_nodes=(0, 1),
            driver_version="550.54.15", cuda_driver_version=12040, dmi_product="ProLiant DL380 Gen11",
            pcie_switch_groups=(0, 1),
        ),
        MachineSpec(
            name="t4x1", model=catalogue.T4, product_name="Tesla T4",
            pci_device_id=0x1EB8, pci_subsystem_id=0x12A210DE, bus_ids=("00000000:00:1E.0",), numa_nodes=(0,),
            driver_version="470.239.06", cuda_driver_version=11040, dmi_product="g4dn.xlarge",
            pcie_switch_groups=(0,),
        ),
    )
}

MACHINE_NAMES: tuple[str, ...] = tuple(MACHINES)


class UnknownMachineError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def get_machine(name: str) -> MachineSpec:
    try:
        return MACHINES[name]
    except KeyError:
        raise UnknownMachineError(
            f"unknown simulated machine {name!r}; known: {', '.join(MACHINE_NAMES)}"
        ) from None
