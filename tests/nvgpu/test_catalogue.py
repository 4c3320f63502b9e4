"""The GPU catalogue and the MIG placement search, against NVIDIA's published layouts."""

from __future__ import annotations

import pytest

from nvgpu import catalogue
from nvgpu.catalogue import A30_24GB, A100_40GB, H100_80GB, H200_141GB, L4, T4
from nvgpu.mig import MigLayoutError, all_profile_layout, balanced_layout, place_layout


@pytest.mark.parametrize(
    ("model", "profile", "count"),
    [
        (A100_40GB, "1g.5gb", 7),
        (A100_40GB, "1g.10gb", 4),
        (A100_40GB, "2g.10gb", 3),
        (A100_40GB, "3g.20gb", 2),
        (A100_40GB, "4g.20gb", 1),
        (A100_40GB, "7g.40gb", 1),
        (A100_40GB, "1g.5gb+me", 1),
        (H100_80GB, "1g.10gb", 7),
        (H100_80GB, "1g.20gb", 4),
        (H200_141GB, "1g.18gb", 7),
        (H200_141GB, "3g.71gb", 2),
        (A30_24GB, "1g.6gb", 4),
        (A30_24GB, "2g.12gb", 2),
        (A30_24GB, "4g.24gb", 1),
    ],
)
def test_all_profile_counts_match_mig_parted_defaults(model: catalogue.GpuModel, profile: str, count: int) -> None:
    assert all_profile_layout(model, profile) == {profile: count}


def test_mixed_layout_placed_on_legal_slices() -> None:
    placements = place_layout(A100_40GB, {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2})
    spans = sorted((p.start, p.start + p.size) for p in placements)
    assert spans == [(0, 2), (2, 3), (3, 4), (4, 8)]


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ({"3g.20gb": 2, "1g.5gb": 1}, "9 memory slices"),
        ({"4g.20gb": 2}, "exceeds the 1 instance"),
        ({"2g.10gb": 3, "1g.5gb": 2}, "compute slices"),
        ({"9g.90gb": 1}, "unknown for A100-40GB"),
        ({"1g.5gb+me": 1, "1g.5gb.me": 1}, r"only one \+me"),
    ],
)
def test_impossible_layouts_say_why(layout: dict[str, int], why: str) -> None:
    with pytest.raises(MigLayoutError, match=why):
        place_layout(A100_40GB, layout, gpu="GPU 0")


def test_balanced_fits_every_mig_model() -> None:
    for model in catalogue.MODELS:
        if model.mig_capable:
            place_layout(model, balanced_layout(model))
    assert balanced_layout(A30_24GB) == {"1g.6gb": 2, "2g.12gb": 1}


def test_non_mig_models_refuse_layouts() -> None:
    for model in (L4, T4):
        with pytest.raises(MigLayoutError, match="does not support MIG"):
            place_layout(model, {"1g.5gb": 1})


def test_driver_versions() -> None:
    assert catalogue.parse_driver_version("550.67") == (550, 67, 0)
    assert catalogue.driver_at_least("550.54.14", H200_141GB.min_driver)
    assert not catalogue.driver_at_least("535.104.05", H200_141GB.min_driver)
    with pytest.raises(catalogue.DriverVersionError, match=r"MAJOR\.MINOR"):
        catalogue.parse_driver_version("r550")
    assert T4.effective_min_driver == catalogue.GLOBAL_MIN_DRIVER


def test_lookup_by_pci_and_name() -> None:
    assert catalogue.model_by_pci_device(0x2330) is H100_80GB
    assert catalogue.model_by_product_name("NVIDIA L4") is L4
    assert catalogue.family_for_compute_capability(8, 9) == "ada-lovelace"
    assert catalogue.family_for_compute_capability(7, 5) == "turing"
    with pytest.raises(catalogue.UnknownModelError, match="known models"):
        catalogue.get_model("V100")


def test_identify_model_by_pci_device_first() -> None:
    """The PCI device ID decides (names vary by driver and board); the name only when the ID is unknown."""
    assert catalogue.identify_model(0x20B0, "Mock NVIDIA A100-SXM4-40GB") is A100_40GB  # go-nvml's mock
    assert catalogue.identify_model(0x2330, "NVIDIA L4") is H100_80GB  # the ID wins over a name
    assert catalogue.identify_model(0x13F2, "NVIDIA L4") is L4  # unknown ID: by name
    assert catalogue.identify_model(None, "NVIDIA L4") is L4
    assert catalogue.identify_model(0x2333, "NVIDIA H200 141GB HBM3e") is None  # the mock's invented H200
