"""The GPU catalogue: models, MIG profiles, placements and driver minima.

Facts come from NVIDIA's MIG user guide, the mig-parted default config and NVML's profile tables
(see ../shared/reference/nvidia-device-plugin-gfd-mig.md). Rows that could only be taken from
NVIDIA's mock tables, not confirmed on hardware, are marked ``confirmed=False``; placements follow
the guide's slice diagrams.

Profile memory is counted in *memory slices* (8 on A100/H100/H200, 4 on A30) and compute in *compute
slices* (7, or 4 on A30). A placement is ``(start, size)`` in memory slices, as NVML's
``nvmlDeviceGetGpuInstancePossiblePlacements`` reports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

from nvgpu.errortext import shown

#: Deckhouse's check and NVIDIA's container toolkit both require at least this driver.
GLOBAL_MIN_DRIVER = "450.80.02"
#: Below this compute capability the device plugin refuses a GPU (Pascal is the oldest supported).
MIN_COMPUTE_CAPABILITY = (6, 0)
NVIDIA_PCI_VENDOR = 0x10DE

# NVML GPU-instance profile enum values (nvmlDeviceGetGpuInstanceProfileInfo's `profile` argument).
GI_PROFILE_1_SLICE = 0
GI_PROFILE_2_SLICE = 1
GI_PROFILE_3_SLICE = 2
GI_PROFILE_4_SLICE = 3
GI_PROFILE_7_SLICE = 4
GI_PROFILE_8_SLICE = 5
GI_PROFILE_6_SLICE = 6
GI_PROFILE_1_SLICE_REV1 = 7  # +me: one media-extension instance per GPU
GI_PROFILE_2_SLICE_REV1 = 8  # 2g+me
GI_PROFILE_1_SLICE_REV2 = 9  # 1g with twice the memory (e.g. 1g.10gb on A100-40GB)

# NVML compute-instance profile enum values, keyed by compute slices.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 6: 5, 8: 6}

#: ``fullmatch``ed (``$`` with ``re.match`` also takes a trailing newline); ASCII digits, at most six each.
_VERSION_RE = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})(?:\.([0-9]{1,6}))?")


class DriverVersionError(ValueError):
    """A driver version string that is not ``MAJOR.MINOR[.PATCH]``."""


def parse_driver_version(text: str) -> tuple[int, int, int]:
    """Parse ``550.54.14`` or ``550.67`` (two- and three-part versions both exist in the wild)."""
    m = _VERSION_RE.fullmatch(text.strip())
    if not m:
        raise DriverVersionError(
            f"driver version {shown(text)} is not in the form MAJOR.MINOR[.PATCH] (for example 550.54.14)"
        )
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def driver_at_least(version: str, minimum: str) -> bool:
    return parse_driver_version(version) >= parse_driver_version(minimum)


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile a model supports (compute instance = whole GI)."""

    name: str  #: mig-parted/nvidia-smi name, e.g. ``1g.10gb`` or ``1g.10gb+me``
    gi_profile: int  #: NVML GPU_INSTANCE_PROFILE_* enum value
    profile_id: int  #: NVML profileInfo.id (the ID ``nvidia-smi mig -lgip`` prints)
    compute_slices: int
    memory_slices: int
    max_instances: int
    placement_starts: tuple[int, ...]  #: legal starts, in memory slices; size = memory_slices
    memory_mib: int
    multiprocessors: int
    media_extensions: bool = False
    confirmed: bool = True

    @property
    def resource_suffix(self) -> str:
        """The device plugin's resource name part: ``+`` becomes ``.`` (``mig-1g.10gb.me``)."""
        return self.name.replace("+", ".")

    @property
    def placements(self) -> tuple[tuple[int, int], ...]:
        return tuple((s, self.memory_slices) for s in self.placement_starts)


@dataclass(frozen=True)
class MigSpec:
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]
    min_driver: str

    def profile(self, name: str) -> MigProfile | None:
        normalized = name.replace(".me", "+me") if name.endswith(".me") else name
        for p in self.profiles:
            if p.name == normalized:
                return p
        return None

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)


@dataclass(frozen=True)
class GpuModel:
    key: str  #: catalogue key used in stack config, e.g. ``H100-80GB``
    product_names: tuple[str, ...]  #: names NVML reports (nvmlDeviceGetName)
    architecture: str  #: GFD family label value
    compute_capability: tuple[int, int]
    memory_mib: int
    pci_device_ids: tuple[int, ...]  #: PCI device IDs (vendor 0x10de)
    min_driver: str
    mig: MigSpec | None = None
    nvlink_per_gpu: int = 0
    aliases: tuple[str, ...] = field(default=())

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None

    @property
    def effective_min_driver(self) -> str:
        """The model's minimum, never below the global floor; MIG raises it when enabled."""
        return max(self.min_driver, GLOBAL_MIN_DRIVER, key=parse_driver_version)

    @property
    def mig_parted_filters(self) -> tuple[str, ...]:
        """mig-parted ``device-filter`` IDs: ``0xDDDDVVVV`` (device then vendor)."""
        return tuple(f"0x{d:04X}{NVIDIA_PCI_VENDOR:04X}" for d in self.pci_device_ids)


def _seven_slot_profiles(
    mem: dict[str, int], sms: dict[str, int], names: dict[str, str], ids: dict[str, int], confirmed: bool
) -> tuple[MigProfile, ...]:
    """Profiles of a 7-compute / 8-memory-slice GPU (A100, H100, H200): one shape, many sizes."""
    return (
        MigProfile(names["1g"], GI_PROFILE_1_SLICE, ids["1g"], 1, 1, 7, (0, 1, 2, 3, 4, 5, 6), mem["1g"], sms["1g"],
                   confirmed=confirmed),
        MigProfile(names["1g"] + "+me", GI_PROFILE_1_SLICE_REV1, ids["1g+me"], 1, 1, 1, (0, 1, 2, 3, 4, 5, 6),
                   mem["1g"], sms["1g"], media_extensions=True, confirmed=confirmed),
        MigProfile(names["1g2"], GI_PROFILE_1_SLICE_REV2, ids["1g2"], 1, 2, 4, (0, 2, 4, 6), mem["2g"], sms["1g2"],
                   confirmed=confirmed),
        MigProfile(names["2g"], GI_PROFILE_2_SLICE, ids["2g"], 2, 2, 3, (0, 2, 4), mem["2g"], sms["2g"],
                   confirmed=confirmed),
        MigProfile(names["3g"], GI_PROFILE_3_SLICE, ids["3g"], 3, 4, 2, (0, 4), mem["4g"], sms["3g"],
                   confirmed=confirmed),
        MigProfile(names["4g"], GI_PROFILE_4_SLICE, ids["4g"], 4, 4, 1, (0,), mem["4g"], sms["4g"],
                   confirmed=confirmed),
        MigProfile(names["7g"], GI_PROFILE_7_SLICE, ids["7g"], 7, 8, 1, (0,), mem["7g"], sms["7g"],
                   confirmed=confirmed),
    )


# nvidia-smi -lgip IDs, verified on H100-80GB and shared by A100/H200.
_LGIP_IDS = {"7g": 0, "4g": 5, "3g": 9, "2g": 14, "1g2": 15, "1g": 19, "1g+me": 20}
_A100_SMS = {"1g": 14, "1g2": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
_H100_SMS = {"1g": 16, "1g2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}

A100_40GB = GpuModel(
    key="A100-40GB",
    product_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"),
    architecture="ampere",
    compute_capability=(8, 0),
    memory_mib=40960,
    pci_device_ids=(0x20B0, 0x20B1, 0x20F1, 0x20F6),
    min_driver="450.80.02",
    nvlink_per_gpu=12,
    mig=MigSpec(
        compute_slices=7,
        memory_slices=8,
        min_driver="450.80.02",
        profiles=_seven_slot_profiles(
            mem={"1g": 4864, "2g": 9856, "4g": 19968, "7g": 40192},
            sms=_A100_SMS,
            names={"1g": "1g.5gb", "1g2": "1g.10gb", "2g": "2g.10gb", "3g": "3g.20gb", "4g": "4g.20gb",
                   "7g": "7g.40gb"},
            ids=_LGIP_IDS,
            confirmed=True,
        ),
    ),
)

A100_80GB = GpuModel(
    key="A100-80GB",
    product_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"),
    architecture="ampere",
    compute_capability=(8, 0),
    memory_mib=81920,
    pci_device_ids=(0x20B2, 0x20B5, 0x20F3, 0x20F5),
    min_driver="450.80.02",
    nvlink_per_gpu=12,
    mig=MigSpec(
        compute_slices=7,
        memory_slices=8,
        min_driver="450.80.02",
        profiles=_seven_slot_profiles(
            mem={"1g": 9728, "2g": 19968, "4g": 40192, "7g": 80384},
            sms=_A100_SMS,
            names={"1g": "1g.10gb", "1g2": "1g.20gb", "2g": "2g.20gb", "3g": "3g.40gb", "4g": "4g.40gb",
                   "7g": "7g.80gb"},
            ids=_LGIP_IDS,
            confirmed=False,
        ),
    ),
)

H100_80GB = GpuModel(
    key="H100-80GB",
    product_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100"),
    architecture="hopper",
    compute_capability=(9, 0),
    memory_mib=81559,
    pci_device_ids=(0x2330, 0x2331, 0x2322, 0x2324),
    min_driver="525.60.13",
    nvlink_per_gpu=18,
    mig=MigSpec(
        compute_slices=7,
        memory_slices=8,
        min_driver="525.60.13",
        profiles=_seven_slot_profiles(
            # From a real `nvidia-smi mig -lgip` dump: 9.75 / 19.62 / 39.50 / 79.25 GiB.
            mem={"1g": 9984, "2g": 20096, "4g": 40448, "7g": 81152},
            sms=_H100_SMS,
            names={"1g": "1g.10gb", "1g2": "1g.20gb", "2g": "2g.20gb", "3g": "3g.40gb", "4g": "4g.40gb",
                   "7g": "7g.80gb"},
            ids=_LGIP_IDS,
            confirmed=True,
        ),
    ),
)

H200_141GB = GpuModel(
    key="H200-141GB",
    product_names=("NVIDIA H200", "NVIDIA H200 NVL"),
    architecture="hopper",
    compute_capability=(9, 0),
    memory_mib=143771,
    pci_device_ids=(0x2335, 0x233B),
    min_driver="550.54.14",
    nvlink_per_gpu=18,
    mig=MigSpec(
        compute_slices=7,
        memory_slices=8,
        min_driver="550.54.14",
        profiles=_seven_slot_profiles(
            mem={"1g": 18432, "2g": 35840, "4g": 72704, "7g": 144384},
            sms=_H100_SMS,
            names={"1g": "1g.18gb", "1g2": "1g.35gb", "2g": "2g.35gb", "3g": "3g.71gb", "4g": "4g.71gb",
                   "7g": "7g.141gb"},
            ids=_LGIP_IDS,
            confirmed=False,
        ),
    ),
)

A30_24GB = GpuModel(
    key="A30-24GB",
    product_names=("NVIDIA A30",),
    architecture="ampere",
    compute_capability=(8, 0),
    memory_mib=24576,
    pci_device_ids=(0x20B7,),
    min_driver="460.32.03",
    nvlink_per_gpu=4,
    mig=MigSpec(
        compute_slices=4,
        memory_slices=4,
        min_driver="460.32.03",
        profiles=(
            # Instance counts confirmed in the MIG user guide; profile IDs and MiB are NVIDIA mock values.
            MigProfile("1g.6gb", GI_PROFILE_1_SLICE, 14, 1, 1, 4, (0, 1, 2, 3), 5836, 14),
            MigProfile("1g.6gb+me", GI_PROFILE_1_SLICE_REV1, 21, 1, 1, 1, (0, 1, 2, 3), 5836, 14,
                       media_extensions=True),
            MigProfile("2g.12gb", GI_PROFILE_2_SLICE, 5, 2, 2, 2, (0, 2), 11672, 28),
            MigProfile("2g.12gb+me", GI_PROFILE_2_SLICE_REV1, 6, 2, 2, 1, (0, 2), 11672, 28,
                       media_extensions=True),
            MigProfile("4g.24gb", GI_PROFILE_4_SLICE, 0, 4, 4, 1, (0,), 23344, 56),
        ),
    ),
)

L4 = GpuModel(
    key="L4",
    product_names=("NVIDIA L4",),
    architecture="ada-lovelace",
    compute_capability=(8, 9),
    memory_mib=23034,
    pci_device_ids=(0x27B8,),
    min_driver="525.60.13",
)

T4 = GpuModel(
    key="T4",
    product_names=("Tesla T4", "NVIDIA T4"),
    architecture="turing",
    compute_capability=(7, 5),
    memory_mib=15360,
    pci_device_ids=(0x1EB8,),
    min_driver="450.80.02",
)

MODELS: tuple[GpuModel, ...] = (A100_40GB, A100_80GB, H100_80GB, H200_141GB, A30_24GB, L4, T4)
MODEL_KEYS: tuple[str, ...] = tuple(m.key for m in MODELS)


class UnknownModelError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0])


def get_model(key: str) -> GpuModel:
    for m in MODELS:
        if m.key == key:
            return m
    raise UnknownModelError(f"unknown GPU model {key!r}; known models: {', '.join(MODEL_KEYS)}")


@cache
def _by_pci() -> dict[int, GpuModel]:
    return {d: m for m in MODELS for d in m.pci_device_ids}


def model_by_pci_device(device_id: int) -> GpuModel | None:
    return _by_pci().get(device_id)


def model_by_product_name(name: str) -> GpuModel | None:
    for m in MODELS:
        if name in m.product_names:
            return m
    return None


def identify_model(pci_device_id: int | None, name: str) -> GpuModel | None:
    """The catalogue model of a GPU: by its PCI device ID first, by its product name only failing that.

    The device ID is the hardware's own; the name is the driver's text and varies by driver, board and
    vendor (NVIDIA's mock A100 reports "Mock NVIDIA A100-SXM4-40GB" with the A100's ID 0x20B0), so a
    name-only lookup refused GPUs whose ID the catalogue lists. ``None`` for an ID not known (or absent).
    """
    by_pci = model_by_pci_device(pci_device_id) if pci_device_id is not None else None
    return by_pci or model_by_product_name(name)


def family_for_compute_capability(major: int, minor: int) -> str:
    """GPU feature discovery's ``nvidia.com/gpu.family`` value for a compute capability."""
    if major == 1:
        return "tesla"
    if major == 2:
        return "fermi"
    if major == 3:
        return "kepler"
    if major == 5:
        return "maxwell"
    if major == 6:
        return "pascal"
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ada-lovelace" if minor == 9 else "ampere"
    if major == 9:
        return "hopper"
    if major in (10, 12):
        return "blackwell"
    if major == 13:
        return "rubin"
    return "undefined"
