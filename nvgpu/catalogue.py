"""The GPU catalogue: models, MIG profiles, placements and driver minima.

Facts come from NVIDIA's MIG user guide, the mig-parted default config and NVML's profile tables
(see ../shared/reference/nvidia-device-plugin-gfd-mig.md). Rows that could only be taken from
NVIDIA's mock tables, not confirmed on hardware, are marked ``confirmed=False``; placements follow
the guide's slice diagrams.

Profile memory is counted in *memory slices* (8 on A100/H100/H200/B200, 4 on A30 and RTX PRO 6000) and
compute in *compute slices* (7, or 4 on A30 and RTX PRO 6000). The current data-center models added for
issue 33 (H100 NVL to RTX PRO 6000, L40S, A10, ...) say where each field comes from at their definitions.
A placement is ``(start, size)`` in memory slices, as NVML's
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
# The RTX PRO 6000 Blackwell's attribute profiles (nvml.h NVML_GPU_INSTANCE_PROFILE_*; mig-parted's names).
GI_PROFILE_1_SLICE_GFX = 10  # 1g+gfx: graphics-capable
GI_PROFILE_2_SLICE_GFX = 11  # 2g+gfx
GI_PROFILE_4_SLICE_GFX = 12  # 4g+gfx
GI_PROFILE_1_SLICE_NO_ME = 13  # 1g-me: no media engines at all
GI_PROFILE_2_SLICE_NO_ME = 14  # 2g-me
GI_PROFILE_1_SLICE_ALL_ME = 15  # 1g+me.all: every media engine of the GPU
GI_PROFILE_2_SLICE_ALL_ME = 16  # 2g+me.all

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


#: mig-parted's positive profile attributes, longest first; the device plugin's resource names and
#: mig-parted's config names spell ``+`` as ``.`` (``1g.10gb.me``, ``all-1g.24gb.me.all``, ``1g.24gb.gfx``).
_PLUS_ATTRIBUTES = (".me.all", ".gfx", ".me")


def normalize_profile_name(name: str) -> str:
    """``1g.10gb.me`` -> ``1g.10gb+me`` (and ``.me.all``, ``.gfx``): mig-parted's spelling of a profile.

    mig-parted's profile grammar (pkg/types/mig_profile.go) is ``<G>g.<GB>gb`` plus ``+attr`` or ``-attr``
    with attributes ``me``, ``me.all`` and ``gfx``; only ``+`` is respelled by the resource names.
    """
    for attr in _PLUS_ATTRIBUTES:
        if name.endswith(attr) and not name.endswith("+" + attr[1:]):
            return name[: -len(attr)] + "+" + attr[1:]
    return name


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
        normalized = normalize_profile_name(name)
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

# --- Current data-center models (issue 33, item 5) ---------------------------------------------------------
#
# Sources, per field:
# - PCI device IDs and product names (what nvmlDeviceGetName returns): NVIDIA/open-gpu-kernel-modules
#   README.md, the supported-GPU table ("NVIDIA B200 | 2901 10DE 1999"), and the device-filter lists with their
#   model comments in NVIDIA's mig-parted config (deployments/systemd/config-default.yaml, v0.15.0, vendored in
#   tests/nvgpu/). Only IDs mig-parted filters on are listed for MIG models, so NVIDIA's layouts select exactly
#   the GPUs ours do (README IDs with no mig-parted entry, 0x2909 "NVIDIA B200" and 0x31C3 "NVIDIA GB300", are
#   left to the unknown-model path).
# - Compute capability: NVIDIA's CUDA GPUs page (developer.nvidia.com/cuda-gpus) and, for MIG parts, the MIG
#   User Guide's "Supported GPUs" table. The architecture is the GFD family word for it
#   (:func:`family_for_compute_capability`, as k8s-device-plugin's internal/lm derives ``nvidia.com/gpu.family``).
# - Total memory: the "MiB" nvidia-smi prints for the board in public GitHub issue/CI logs (ECC on), where found;
#   otherwise the upper bound mig-parted's names imply (its full-GPU profile is named ceil(total GiB), so
#   7g.269gb means at most 269 GiB), marked below.
# - MIG profile names and instance counts: the mig-parted config above (every ``all-<profile>`` entry and the
#   ``all-balanced`` entry for the model's device filter; tests/nvgpu/test_catalogue_nvidia_tables.py checks them
#   against the file). Placements follow the guide's 7-slice diagram as for the H100. Profile MiB, SM counts and
#   nvidia-smi -lgip IDs are not published for these parts: MiB and SMs are derived (_derived_memory,
#   _scaled_sms), IDs are the H100's, so every such row is ``confirmed=False``.
# - Driver minima: the MIG User Guide's "Deployment Considerations" table (first driver of each GPU's MIG
#   support; for B200 also the GPU Operator's platform-support note "HGX B200 requires ... 570.133.20 or
#   later"). A model that table does not name keeps the global floor (GLOBAL_MIN_DRIVER, what the agent
#   applies to a GPU the catalogue does not know), said at the model.


def _derived_memory(total_mib: int, memory_slices: int = 8) -> dict[str, int]:
    """Profile MiB where NVIDIA publishes none: k/8 of the board less 1/64 of it for the driver's reserve.

    Not NVIDIA's figures (an H100-80GB's real 1g is 9984 MiB of 81559/8 = 10194). Chosen so that
    mig-parted's naming rule, round(ceil(8·MiB/total)/8 · ceil(total GiB)), still yields the profile names
    NVIDIA ships: ceil(8·(k/8 - 1/64)) = k.
    """
    reserve = total_mib // 64
    per = {"1g": 1, "2g": 2, "4g": 4, "7g": 8} if memory_slices == 8 else {"1g": 1, "2g": 2, "4g": 4}
    return {k: total_mib * n // memory_slices - reserve for k, n in per.items()}


def _scaled_sms(total_sms: int) -> dict[str, int]:
    """Per-profile SM counts scaled from the H100-80GB's real table to a GPU of ``total_sms`` (even counts,
    the whole GPU for 7g). A derivation, not NVIDIA's table."""
    out = {k: max(2, round(v * total_sms / _H100_SMS["7g"] / 2) * 2) for k, v in _H100_SMS.items()}
    out["7g"] = total_sms
    return out


#: Hopper boards with 94/96 GB: the MIG User Guide lists "H100-SXM5 94GB", "H100-PCIE 94GB", "H100 on GH200
#: 96GB" and "H20 96GB" with 7 instances; mig-parted names their profiles 1g.12gb ... 7g.94gb / 7g.96gb.
_H100_NVL_NAMES = {"1g": "1g.12gb", "1g2": "1g.24gb", "2g": "2g.24gb", "3g": "3g.47gb", "4g": "4g.47gb",
                   "7g": "7g.94gb"}
_H100_96GB_NAMES = {"1g": "1g.12gb", "1g2": "1g.24gb", "2g": "2g.24gb", "3g": "3g.48gb", "4g": "4g.48gb",
                    "7g": "7g.96gb"}
#: nvidia-smi: "NVIDIA GH200 480GB ... 97871MiB" and "NVIDIA H20 ... 97871MiB" (public issue logs).
_HOPPER_96GB_MIB = 97871
#: The MIG User Guide's H100 row: "H100, CUDA 12, R525 (>= 525.85.12)"; its Supported GPUs table counts the
#: 94 GB H100s and the H100 on GH200 as H100s.
_H100_MIG_DRIVER = "525.85.12"


def _hopper_96gb_mig(min_driver: str, sms: dict[str, int]) -> MigSpec:
    return MigSpec(compute_slices=7, memory_slices=8, min_driver=min_driver, profiles=_seven_slot_profiles(
        mem=_derived_memory(_HOPPER_96GB_MIB), sms=sms, names=_H100_96GB_NAMES, ids=_LGIP_IDS, confirmed=False))


H100_94GB = GpuModel(
    key="H100-94GB",
    # README: "NVIDIA H100 NVL | 2321", "NVIDIA H800 NVL | 233A"; mig-parted: "# H100 NVL, H800 NVL".
    product_names=("NVIDIA H100 NVL", "NVIDIA H800 NVL"),
    architecture="hopper",
    compute_capability=(9, 0),
    memory_mib=95830,  # nvidia-smi "NVIDIA H100 NVL ... 95830MiB" (public issue logs)
    pci_device_ids=(0x2321, 0x233A),
    min_driver=_H100_MIG_DRIVER,
    mig=MigSpec(compute_slices=7, memory_slices=8, min_driver=_H100_MIG_DRIVER, profiles=_seven_slot_profiles(
        mem=_derived_memory(95830), sms=_H100_SMS, names=_H100_NVL_NAMES, ids=_LGIP_IDS, confirmed=False)),
)

H100_96GB = GpuModel(
    key="H100-96GB",
    # mig-parted: "# H100-96GB, PG506-96GB, GH200, H20" over 0x2342, 0x233D, 0x20B6, 0x2329. README names
    # 0x20B6 "NVIDIA PG506-232"; 0x233D has no README row, so it is found by ID only.
    product_names=("NVIDIA PG506-232",),
    architecture="hopper",
    compute_capability=(9, 0),
    memory_mib=_HOPPER_96GB_MIB,  # not read off this board: the GH200's and H20's 96 GB figure
    pci_device_ids=(0x233D, 0x20B6),
    min_driver=_H100_MIG_DRIVER,
    mig=_hopper_96gb_mig(_H100_MIG_DRIVER, _H100_SMS),
)

GH200_96GB = GpuModel(
    key="GH200-96GB",
    # README: "NVIDIA GH200 120GB | 2342 10DE 16EB/1805", "NVIDIA GH200 480GB | 2342 10DE 1809" (the name counts
    # the Grace memory; the GPU has 96 GB).
    product_names=("NVIDIA GH200 480GB", "NVIDIA GH200 120GB"),
    architecture="hopper",
    compute_capability=(9, 0),
    memory_mib=_HOPPER_96GB_MIB,
    pci_device_ids=(0x2342,),
    min_driver=_H100_MIG_DRIVER,
    mig=_hopper_96gb_mig(_H100_MIG_DRIVER, _H100_SMS),
)

H20 = GpuModel(
    key="H20",
    product_names=("NVIDIA H20",),  # README: "NVIDIA H20 | 2329 10DE 198B/198C"
    architecture="hopper",
    compute_capability=(9, 0),
    memory_mib=_HOPPER_96GB_MIB,
    pci_device_ids=(0x2329,),
    min_driver="535.161.07",  # MIG User Guide: "H20, CUDA 12, R535 (>= 535.161.07)"
    # 78 SMs (NVIDIA's H20 product brief), so the H100's per-profile SMs are scaled down.
    mig=_hopper_96gb_mig("535.161.07", _scaled_sms(78)),
)

GH200_144GB = GpuModel(
    key="GH200-144GB",
    product_names=("NVIDIA GH200 144G HBM3e",),  # README: "NVIDIA GH200 144G HBM3e | 2348 10DE 18D2"
    architecture="hopper",
    compute_capability=(9, 0),
    memory_mib=144 * 1024,  # upper bound from mig-parted's 7g.144gb; not read off hardware
    pci_device_ids=(0x2348,),
    # Not in the MIG User Guide's driver table (nor its Supported GPUs table): the global floor.
    min_driver=GLOBAL_MIN_DRIVER,
    mig=MigSpec(compute_slices=7, memory_slices=8, min_driver=GLOBAL_MIN_DRIVER, profiles=_seven_slot_profiles(
        mem=_derived_memory(144 * 1024), sms=_H100_SMS, ids=_LGIP_IDS, confirmed=False,
        names={"1g": "1g.18gb", "1g2": "1g.36gb", "2g": "2g.36gb", "3g": "3g.72gb", "4g": "4g.72gb",
               "7g": "7g.144gb"})),
)

#: MIG User Guide: "B200, GB200, CUDA 12, R570 (>= 570.133.20)"; GPU Operator platform support: "HGX B200
#: requires a driver container version of 570.133.20 or later".
_B200_DRIVER = "570.133.20"

B200 = GpuModel(
    key="B200",
    product_names=("NVIDIA B200",),  # README: "NVIDIA B200 | 2901 10DE 1999/199B/20DA"
    architecture="blackwell",
    compute_capability=(10, 0),
    memory_mib=183359,  # nvidia-smi "NVIDIA B200 ... 183359MiB" (8-GPU HGX B200 logs, driver 570/580)
    pci_device_ids=(0x2901,),
    min_driver=_B200_DRIVER,
    # Fifth-generation NVLink: 18 links per GPU (1.8 TB/s), NVIDIA's B200 datasheet; only the simulator uses it.
    nvlink_per_gpu=18,
    mig=MigSpec(compute_slices=7, memory_slices=8, min_driver=_B200_DRIVER, profiles=_seven_slot_profiles(
        mem=_derived_memory(183359), sms=_scaled_sms(148), ids=_LGIP_IDS, confirmed=False,  # 148 SMs: CUDA
        names={"1g": "1g.23gb", "1g2": "1g.45gb", "2g": "2g.45gb", "3g": "3g.90gb", "4g": "4g.90gb",
               "7g": "7g.180gb"})),
)

GB200 = GpuModel(
    key="GB200",
    product_names=("NVIDIA GB200",),  # README: "NVIDIA GB200 | 2941 10DE 2046/20CA/20D5/21C9/21CA"
    architecture="blackwell",
    compute_capability=(10, 0),
    memory_mib=189471,  # nvidia-smi "NVIDIA GB200 ... 189471MiB" (public issue logs)
    pci_device_ids=(0x2941,),
    min_driver=_B200_DRIVER,
    nvlink_per_gpu=18,
    mig=MigSpec(compute_slices=7, memory_slices=8, min_driver=_B200_DRIVER, profiles=_seven_slot_profiles(
        mem=_derived_memory(189471), sms=_scaled_sms(148), ids=_LGIP_IDS, confirmed=False,
        names={"1g": "1g.23gb", "1g2": "1g.47gb", "2g": "2g.47gb", "3g": "3g.93gb", "4g": "4g.93gb",
               "7g": "7g.186gb"})),
)

B300 = GpuModel(
    key="B300",
    product_names=("NVIDIA B300 SXM6 AC",),  # README: "NVIDIA B300 SXM6 AC | 3182 10DE 20E6"
    architecture="blackwell",
    compute_capability=(10, 3),  # CUDA GPUs page: B300 / GB300 10.3
    memory_mib=269 * 1024,  # upper bound from mig-parted's 7g.269gb; not read off hardware
    pci_device_ids=(0x3182,),
    min_driver="580.82.07",  # MIG User Guide: "B300, CUDA 12.9, R580 (>= 580.82.07)"
    nvlink_per_gpu=18,
    mig=MigSpec(compute_slices=7, memory_slices=8, min_driver="580.82.07", profiles=_seven_slot_profiles(
        mem=_derived_memory(269 * 1024), sms=_scaled_sms(148), ids=_LGIP_IDS, confirmed=False,
        names={"1g": "1g.34gb", "1g2": "1g.67gb", "2g": "2g.67gb", "3g": "3g.135gb", "4g": "4g.135gb",
               "7g": "7g.269gb"})),
)

GB300 = GpuModel(
    key="GB300",
    product_names=("NVIDIA GB300",),  # README: "NVIDIA GB300 | 31C2 10DE 21F1"
    architecture="blackwell",
    compute_capability=(10, 3),
    memory_mib=278 * 1024,  # upper bound from mig-parted's 7g.278gb; not read off hardware
    pci_device_ids=(0x31C2,),
    # The guide's only GB300 row is the DGX Station's (R595); the GB300 of 0x31C2 has none: the global floor.
    min_driver=GLOBAL_MIN_DRIVER,
    nvlink_per_gpu=18,
    mig=MigSpec(compute_slices=7, memory_slices=8, min_driver=GLOBAL_MIN_DRIVER, profiles=_seven_slot_profiles(
        mem=_derived_memory(278 * 1024), sms=_scaled_sms(148), ids=_LGIP_IDS, confirmed=False,
        # all-1g.35gb holds 7 on GB300 (its own device-filter entry): 1g.35gb is the 1-slice profile here.
        names={"1g": "1g.35gb", "1g2": "1g.70gb", "2g": "2g.70gb", "3g": "3g.139gb", "4g": "4g.139gb",
               "7g": "7g.278gb"})),
)


def _rtx_pro_6000_profiles() -> tuple[MigProfile, ...]:
    """The RTX PRO 6000 Blackwell's 4-slice MIG table, from mig-parted's config-default.yaml: every profile it
    creates there and the count it creates (1g x4, 2g x2, 4g x1; a +me or +me.all instance x1), in the shape
    of the A30's (placements as the guide draws a 4-slice GPU). Graphics (+gfx) and media-less (-me)
    variants take the plain ones' slices. +me.all holds every media engine, so it counts as this GPU's one
    media instance, with +me. Profile IDs are the NVML enum (as NVIDIA's mock numbers them); MiB and SMs
    (188 SMs) are derived. None of it is confirmed on hardware."""
    mem = _derived_memory(97887, memory_slices=4)
    sms = {"1g": 46, "2g": 94, "4g": 188}

    def row(name: str, enum: int, count: int, starts: tuple[int, ...], *, media: bool = False) -> MigProfile:
        g = int(name[0])  # compute = memory slices on this GPU: 1g, 2g, 4g
        return MigProfile(name, enum, enum, g, g, count, starts, mem[f"{g}g"], sms[f"{g}g"],
                          media_extensions=media, confirmed=False)

    return (
        row("1g.24gb", GI_PROFILE_1_SLICE, 4, (0, 1, 2, 3)),
        row("1g.24gb+me", GI_PROFILE_1_SLICE_REV1, 1, (0, 1, 2, 3), media=True),
        row("1g.24gb+gfx", GI_PROFILE_1_SLICE_GFX, 4, (0, 1, 2, 3)),
        row("1g.24gb+me.all", GI_PROFILE_1_SLICE_ALL_ME, 1, (0, 1, 2, 3), media=True),
        row("1g.24gb-me", GI_PROFILE_1_SLICE_NO_ME, 4, (0, 1, 2, 3)),
        row("2g.48gb", GI_PROFILE_2_SLICE, 2, (0, 2)),
        row("2g.48gb+gfx", GI_PROFILE_2_SLICE_GFX, 2, (0, 2)),
        row("2g.48gb+me.all", GI_PROFILE_2_SLICE_ALL_ME, 1, (0, 2), media=True),
        row("2g.48gb-me", GI_PROFILE_2_SLICE_NO_ME, 2, (0, 2)),
        row("4g.96gb", GI_PROFILE_4_SLICE, 1, (0,)),
        row("4g.96gb+gfx", GI_PROFILE_4_SLICE_GFX, 1, (0,)),
    )


RTX_PRO_6000 = GpuModel(
    key="RTX-PRO-6000",
    # README: "NVIDIA RTX PRO 6000 Blackwell Server Edition | 2BB5 10DE 204E/220B"; mig-parted filters 0x2BB5
    # ("# RTX PRO 6000 Blackwell"). The workstation editions (0x2BB1, 0x2BB4) are not data-center boards.
    product_names=("NVIDIA RTX PRO 6000 Blackwell Server Edition",),
    architecture="blackwell",
    compute_capability=(12, 0),  # MIG User Guide, Supported GPUs: GB202, 12.0, 96GB, 4 instances
    memory_mib=97887,  # nvidia-smi "RTX PRO 6000 Blackwell Server Edition ... 97,887 MiB total" (public log)
    pci_device_ids=(0x2BB5,),
    min_driver="575.51.03",  # MIG User Guide: "RTX PRO 6000 Blackwell (all editions), R575 (>= 575.51.03)"
    mig=MigSpec(compute_slices=4, memory_slices=4, min_driver="575.51.03", profiles=_rtx_pro_6000_profiles()),
)

# Data-center boards without MIG. Driver minima: no NVIDIA release note found naming the first driver of
# each, so the global floor applies (as to a GPU the catalogue does not know). Memory: nvidia-smi, ECC on.

L40S = GpuModel(
    key="L40S",
    product_names=("NVIDIA L40S",),  # README: "NVIDIA L40S | 26B9 10DE 1851/18CF"
    architecture="ada-lovelace",
    compute_capability=(8, 9),  # CUDA GPUs page: L40S 8.9
    memory_mib=46068,  # nvidia-smi "NVIDIA L40S ... 46068MiB"
    pci_device_ids=(0x26B9,),
    min_driver=GLOBAL_MIN_DRIVER,
)

L40 = GpuModel(
    key="L40",
    product_names=("NVIDIA L40",),  # README: "NVIDIA L40 | 26B5 10DE 169D/17DA"
    architecture="ada-lovelace",
    compute_capability=(8, 9),  # CUDA GPUs page: L40 8.9
    memory_mib=46068,  # nvidia-smi "NVIDIA L40 ... 46068MiB"
    pci_device_ids=(0x26B5,),
    min_driver=GLOBAL_MIN_DRIVER,
)

A40 = GpuModel(
    key="A40",
    product_names=("NVIDIA A40",),  # README: "NVIDIA A40 | 2235 10DE 145A"
    architecture="ampere",
    compute_capability=(8, 6),  # CUDA GPUs page: A40 8.6
    memory_mib=46068,  # nvidia-smi "NVIDIA A40 ... 46068MiB"
    pci_device_ids=(0x2235,),
    min_driver=GLOBAL_MIN_DRIVER,
)

A10 = GpuModel(
    key="A10",
    product_names=("NVIDIA A10",),  # README: "NVIDIA A10 | 2236 10DE 1482"
    architecture="ampere",
    compute_capability=(8, 6),  # CUDA GPUs page: A10 8.6
    memory_mib=23028,  # nvidia-smi "NVIDIA A10 ... 23028MiB"
    pci_device_ids=(0x2236,),
    min_driver=GLOBAL_MIN_DRIVER,
)

MODELS: tuple[GpuModel, ...] = (
    A100_40GB, A100_80GB, H100_80GB, H200_141GB, A30_24GB, L4, T4,
    H100_94GB, H100_96GB, GH200_96GB, H20, GH200_144GB, B200, GB200, B300, GB300, RTX_PRO_6000,
    L40S, L40, A40, A10,
)
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
