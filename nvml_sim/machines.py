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
    #: ``nvmlDeviceGetBrand`` (``nvmlBrandType_t``). Every data-center board NVIDIA ships now answers
    #: NVML_BRAND_NVIDIA (14), whatever its product name says: go-nvml's mock GPUs (A100, A30, H100, H200:
    #: ``pkg/nvml/mock/shared/gpus``) carry ``BRAND_NVIDIA``, and a "Tesla T4" reports "Product Brand: NVIDIA"
    #: (``nvidia-smi -q`` in NVIDIA/nvidia-docker#1628). NVML_BRAND_TESLA (2) is for pre-Ampere drivers' boards.
    brand: int = 14
    #: ``nvmlDeviceGetVbiosVersion``, nvidia-smi's "VBIOS Version" format. The T4's is the one in
    #: NVIDIA/nvidia-docker#1628; the others are plausible values of that format, not read off hardware.
    vbios_version: str = "00.00.00.00.00"
    #: ``nvmlDeviceGetPersistenceMode``: on, as nvidia-persistenced keeps it on DGX OS and on the T4 of
    #: NVIDIA/nvidia-docker#1628 ("Persistence Mode: Enabled").
    persistence_mode: bool = True

    @property
    def gpu_count(self) -> int:
        return len(self.bus_ids)

    @property
    def nvlinks_per_gpu(self) -> int:
        return self.model.nvlink_per_gpu if self.nvlink != "none" else 0

    def gpu_uuid(self, index: int) -> str:
        return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{self.name}/gpu/{index}"))

    def serial(self, index: int) -> str:
        """``nvmlDeviceGetSerial``: a 13-digit board serial like the T4's ``1323321072957``
        (NVIDIA/nvidia-docker#1628), derived from the machine name so it is stable across runs."""
        return str(uuid.uuid5(_UUID_NS, f"{self.name}/gpu/{index}/serial").int % 10**13).zfill(13)

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

#: A GPU the catalogue does not know, as every new board is until the catalogue catches up (issue 33): a
#: made-up but plausible next data-center PCIe board. Its PCI device ID, 0x2FF0, is in neither the catalogue
#: nor NVIDIA's mig-parted tables, and its name matches no catalogue name. MIG-capable with the H100's
#: shapes, which the simulated NVML reports through its own profile and placement queries: the agent must
#: learn them there, never from the catalogue. Deliberately not in ``nvgpu.catalogue.MODELS``.
UNLISTED_MODEL = GpuModel(
    key="Z100-80GB", product_names=("NVIDIA Z100 80GB PCIe",), architecture="hopper", compute_capability=(9, 0),
    memory_mib=catalogue.H100_80GB.memory_mib, pci_device_ids=(0x2FF0,), min_driver="570.86.15",
    mig=catalogue.H100_80GB.mig,
)

MACHINES: dict[str, MachineSpec] = {
    m.name: m
    for m in (
        MachineSpec(
            name="dgx-a100-40gb", vbios_version="92.00.19.00.10",
            model=catalogue.A100_40GB, product_name="NVIDIA A100-SXM4-40GB",
            pci_device_id=0x20B0, pci_subsystem_id=0x134F10DE, bus_ids=_DGX_A100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="535.183.06", cuda_driver_version=12020, dmi_product="DGXA100 920-23687-2530-000",
            nvlink="nvswitch", nvswitch_count=6, pcie_switch_groups=_pairs(8),
        ),
        MachineSpec(
            name="dgx-a100-80gb", vbios_version="92.00.36.00.02",
            model=catalogue.A100_80GB, product_name="NVIDIA A100-SXM4-80GB",
            pci_device_id=0x20B2, pci_subsystem_id=0x147F10DE, bus_ids=_DGX_A100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="535.183.06", cuda_driver_version=12020, dmi_product="DGXA100 920-23687-2531-000",
            nvlink="nvswitch", nvswitch_count=6, pcie_switch_groups=_pairs(8),
        ),
        MachineSpec(
            name="dgx-h100", vbios_version="96.00.74.00.1C",
            model=catalogue.H100_80GB, product_name="NVIDIA H100 80GB HBM3",
            pci_device_id=0x2330, pci_subsystem_id=0x16C110DE, bus_ids=_DGX_H100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="550.90.07", cuda_driver_version=12040, dmi_product="DGXH100",
            nvlink="nvswitch", nvswitch_count=4, pcie_switch_groups=tuple(range(8)),
        ),
        MachineSpec(
            name="hgx-h200", vbios_version="96.00.A5.00.01",
            model=catalogue.H200_141GB, product_name="NVIDIA H200",
            pci_device_id=0x2335, pci_subsystem_id=0x18BE10DE, bus_ids=_DGX_H100_BUS, numa_nodes=_TWO_SOCKETS_8,
            driver_version="550.127.05", cuda_driver_version=12040, dmi_product="HGX H200 8-GPU",
            nvlink="nvswitch", nvswitch_count=4, pcie_switch_groups=tuple(range(8)),
        ),
        # An 8-GPU HGX B200 as an `nvidia-smi` listing of one shows it (public GitHub log, driver 580.95.05,
        # CUDA 13.0): "NVIDIA B200", bus IDs 1B/43/52/61/9D/C3/D1/DF, 183359 MiB each. Subsystem 0x1999 is the
        # first of README's "NVIDIA B200 | 2901 10DE 1999" rows (NVIDIA/open-gpu-kernel-modules); the board's
        # two NVLink switch chips make one single-node fabric, as on the HGX H100.
        MachineSpec(
            name="hgx-b200",
            model=catalogue.B200, product_name="NVIDIA B200",
            pci_device_id=0x2901, pci_subsystem_id=0x199910DE,
            bus_ids=("00000000:1B:00.0", "00000000:43:00.0", "00000000:52:00.0", "00000000:61:00.0",
                     "00000000:9D:00.0", "00000000:C3:00.0", "00000000:D1:00.0", "00000000:DF:00.0"),
            numa_nodes=_TWO_SOCKETS_8, driver_version="580.95.05", cuda_driver_version=13000,
            dmi_product="HGX B200 8-GPU", nvlink="nvswitch", nvswitch_count=2, pcie_switch_groups=tuple(range(8)),
        ),
        MachineSpec(
            name="a30x4", vbios_version="92.00.25.00.08",
            model=catalogue.A30_24GB, product_name="NVIDIA A30",
            pci_device_id=0x20B7, pci_subsystem_id=0x153210DE,
            bus_ids=("00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0", "00000000:CA:00.0"),
            numa_nodes=(0, 0, 1, 1), driver_version="535.161.08", cuda_driver_version=12020,
            dmi_product="PowerEdge R750xa", nvlink="pairs", pcie_switch_groups=(0, 1, 2, 3),
        ),
        MachineSpec(
            name="l4x2", vbios_version="95.04.29.00.06",
            model=catalogue.L4, product_name="NVIDIA L4",
            pci_device_id=0x27B8, pci_subsystem_id=0x16CA10DE,
            bus_ids=("00000000:01:00.0", "00000000:81:00.0"), numa_nodes=(0, 1),
            driver_version="550.54.15", cuda_driver_version=12040, dmi_product="ProLiant DL380 Gen11",
            pcie_switch_groups=(0, 1),
        ),
        MachineSpec(
            name="unlisted-x2", model=UNLISTED_MODEL, product_name="NVIDIA Z100 80GB PCIe",
            pci_device_id=0x2FF0, pci_subsystem_id=0x1FF010DE,
            bus_ids=("00000000:41:00.0", "00000000:C1:00.0"), numa_nodes=(0, 1),
            driver_version="570.86.15", cuda_driver_version=12080, dmi_product="ProLiant DL380a Gen11",
            pcie_switch_groups=(0, 1),
        ),
        MachineSpec(
            name="t4x1", vbios_version="90.04.96.00.9F",
            model=catalogue.T4, product_name="Tesla T4",
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
