"""mig-parted's config format: strict parsing, NVIDIA's shipped file, generated sets, per-model checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nvgpu import catalogue, migparted
from nvgpu.catalogue import A30_24GB, A100_40GB, A100_80GB, H100_80GB, H200_141GB, L4
from nvgpu.migparted import (
    CustomGpuLayout,
    CustomSlice,
    MigConfigSpec,
    MigPartedError,
    PciFilter,
    build_config,
    custom_config_name,
    custom_specs,
    fit_problems,
    load_config_text,
    parse_config,
    validate_for_model,
)

#: NVIDIA's deployments/systemd/config-default.yaml (mig-parted v0.15), vendored byte for byte.
NVIDIA_FILE = Path(__file__).with_name("nvidia-mig-parted-config-default.yaml")


@pytest.fixture(scope="module")
def nvidia() -> migparted.MigPartedConfig:
    return load_config_text(NVIDIA_FILE.read_text(), str(NVIDIA_FILE))


def test_nvidia_file_parses_unchanged(nvidia: migparted.MigPartedConfig) -> None:
    raw = yaml.safe_load(NVIDIA_FILE.read_text())
    assert set(nvidia.mig_configs) == set(raw["mig-configs"])
    # Round trip: what we would write back is what NVIDIA shipped (same entries, same values).
    assert parse_config(nvidia.to_yaml_dict()) == nvidia
    for name, specs in raw["mig-configs"].items():
        assert [s.to_yaml_dict() for s in nvidia.mig_configs[name]] == specs


@pytest.mark.parametrize("model", [m for m in catalogue.MODELS if m.mig], ids=lambda m: m.key)
def test_generated_sets_match_nvidia_layouts(nvidia: migparted.MigPartedConfig, model: catalogue.GpuModel) -> None:
    ours = build_config([model])
    for name in ours.mig_configs:
        if name in (migparted.ALL_DISABLED, migparted.ALL_ENABLED):
            continue
        theirs = validate_for_model(nvidia, name, model)  # NVIDIA's entry validates on our catalogue
        mine = validate_for_model(ours, name, model)
        assert [layout for _, layout in mine] == [layout for _, layout in theirs], name


def test_nvidia_configs_validate_on_the_models_they_name(nvidia: migparted.MigPartedConfig) -> None:
    expect = {
        "all-1g.5gb": {"A100-40GB"},
        "all-1g.10gb": {"A100-40GB", "A100-80GB", "H100-80GB"},
        "all-1g.18gb": {"H200-141GB", "GH200-144GB"},  # NVIDIA's comment: "H200-141GB, GH200 144G HBM3e"
        "all-2g.12gb": {"A30-24GB"},
        # Every GPU NVIDIA's comment over all-balanced names (H800/A800 are IDs of the H100/A100 models).
        "all-balanced": {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "A30-24GB", "H100-94GB", "H100-96GB",
                         "GH200-96GB", "H20", "GH200-144GB", "B200", "GB200", "B300", "GB300", "RTX-PRO-6000"},
        "all-4g.96gb": {"RTX-PRO-6000"},
    }
    for name, models in expect.items():
        assert {m.key for m in migparted.models_for_config(nvidia, name)} == models, name


def test_all_10gb_means_seven_on_80gb_and_four_on_40gb(nvidia: migparted.MigPartedConfig) -> None:
    ours = build_config()
    for cfg in (nvidia, ours):
        assert validate_for_model(cfg, "all-1g.10gb", H100_80GB)[0][1] == {"1g.10gb": 7}
        assert validate_for_model(cfg, "all-1g.10gb", A100_40GB)[0][1] == {"1g.10gb": 4}


def test_generated_config_is_valid_yaml_for_mig_parted() -> None:
    cfg = build_config()
    again = load_config_text(cfg.to_yaml())
    assert again == cfg
    assert cfg.mig_configs["all-balanced"][0].device_filter == list(A100_40GB.mig_parted_filters)
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.5gb.me", "all-7g.141gb"} <= set(cfg.mig_configs)


BAD = [
    ({"version": "v2", "mig-configs": {}}, "version must be 'v1'"),
    ({"version": "v1", "mig-configs": {}, "extra": 1}, "extra: unknown key"),
    ({"version": "v1", "mig-configs": {"a": []}}, "at least 1 item"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all"}]}}, "mig-enabled: Field required"),
    ({"version": "v1", "mig-configs": {"a": [{"mig-enabled": False}]}}, "devices: Field required"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "some", "mig-enabled": False}]}}, "'all' or a list"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": [0, "x"], "mig-enabled": False}]}}, "indices"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": [], "mig-enabled": False}]}}, "list is empty"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True}]}}, "mig-devices is required"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False,
                                             "mig-devices": {"1g.5gb": 1}}]}}, "must be empty"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True,
                                             "mig-devices": {"1g.5gb": 0}}]}}, "all zero"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True,
                                             "mig-devices": {"1g.5gb": -1}}]}}, "greater than or equal to 0"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": True,
                                             "mig-devices": {"big": 1}}]}}, "not a MIG profile name"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False,
                                             "device-filter": "0x20B0"}]}}, "0xDDDDVVVV"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False, "colour": 1}]}},
     "colour: unknown key"),
]


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_configs_are_refused_with_the_path(doc: dict[str, object], message: str) -> None:
    with pytest.raises(MigPartedError) as e:
        parse_config(doc, "cfg.yaml")
    assert message in str(e.value)
    assert str(e.value).startswith("cfg.yaml: ")


def test_enabled_with_empty_devices_and_filters_parse() -> None:
    cfg = parse_config({"version": "v1", "mig-configs": {"x": [
        {"devices": [0, 2], "mig-enabled": True, "mig-devices": {}, "device-filter": "0x20B010DE:0x134F10DE"},
    ]}})
    spec = cfg.mig_configs["x"][0]
    assert spec.filters == (PciFilter(0x20B0, 0x10DE, 0x134F, 0x10DE),)
    assert spec.matches(2, 0x20B0, subsystem=0x134F10DE)
    assert not spec.matches(2, 0x20B0, subsystem=0x000010DE)
    assert not spec.matches(1, 0x20B0, subsystem=0x134F10DE)
    assert parse_config(None) == parse_config({})


@pytest.mark.parametrize(
    ("model", "layout", "why"),
    [
        (A100_40GB, {"1g.10gb": 5}, "exceeds the 4 instance"),
        (H100_80GB, {"1g.5gb": 1}, "profile '1g.5gb' is unknown for H100-80GB"),
        (A30_24GB, {"2g.12gb": 1, "1g.6gb": 3}, "needs 5 compute slices"),
        (H200_141GB, {"3g.71gb": 2, "1g.18gb": 1}, "needs 9 memory slices"),
        (A100_80GB, {"1g.10gb+me": 2}, "exceeds the 1 instance"),
    ],
)
def test_validation_names_config_gpu_profile_and_why(
    model: catalogue.GpuModel, layout: dict[str, int], why: str
) -> None:
    cfg = build_config([model], {"custom-x": [MigConfigSpec(devices=[3], mig_enabled=True, mig_devices=layout)]})
    with pytest.raises(MigPartedError) as e:
        validate_for_model(cfg, "custom-x", model)
    assert "MIG config 'custom-x': GPU 3" in str(e.value)
    assert why in str(e.value)


def test_wrong_model_and_unknown_name_and_non_mig_gpu() -> None:
    cfg = build_config([A100_40GB])
    with pytest.raises(MigPartedError, match="no entry for the H100-80GB"):
        validate_for_model(cfg, "all-1g.5gb", H100_80GB)
    with pytest.raises(MigPartedError, match=r"unknown MIG config 'all-9g\.1gb'"):
        validate_for_model(cfg, "all-9g.1gb", A100_40GB)
    with pytest.raises(MigPartedError, match="L4 does not support MIG"):
        validate_for_model(cfg, "all-enabled", L4)
    assert validate_for_model(cfg, "all-disabled", L4) == [(cfg.mig_configs["all-disabled"][0], {})]


def test_custom_name_matches_deckhouse_hook() -> None:
    # deckhouse modules/040-node-manager/hooks/gpu/mig_custom_config_name_test.go: order-insensitive.
    shuffled = [
        CustomGpuLayout(1, (CustomSlice("1g.10gb", 2), CustomSlice("2g.20gb"))),
        CustomGpuLayout(0, (CustomSlice("2g.20gb"), CustomSlice("1g.10gb"))),
    ]
    assert custom_config_name("shuffled-ng", shuffled) == "custom-shuffled-ng-0d5f67c7"
    assert custom_config_name("shuffled-ng", list(reversed(shuffled))) == "custom-shuffled-ng-0d5f67c7"
    long_name = custom_config_name("n" * 60, shuffled)
    assert len(long_name) <= 63 and long_name.startswith("custom-nnn") and long_name.endswith("-0d5f67c7")


def test_custom_specs_validate_per_gpu() -> None:
    layouts = [CustomGpuLayout(0, (CustomSlice("3g.40gb"), CustomSlice("1g.10gb", 4))),
               CustomGpuLayout(1, (CustomSlice("7g.80gb"),))]
    name = custom_config_name("h100", layouts)
    cfg = build_config([H100_80GB], {name: custom_specs(layouts, H100_80GB)})
    got = validate_for_model(cfg, name, H100_80GB)
    assert [layout for _, layout in got] == [{"3g.40gb": 1, "1g.10gb": 4}, {"7g.80gb": 1}]
    with pytest.raises(MigPartedError, match="clashes"):
        build_config([H100_80GB], {"all-balanced": custom_specs(layouts)})


# --- fit_problems: the one MIG layout check (stack config, MigProfile component, policy pack) -------------

UNLISTED = "0x2FF010DE"  # a PCI ID the catalogue does not know (the simulator's unlisted-x2 board)
A30 = "0x20B710DE"


def _one(name: str, *specs: MigConfigSpec) -> migparted.MigPartedConfig:
    return migparted.MigPartedConfig(version="v1", mig_configs={name: list(specs)})


def _entry(layout: dict[str, int], device_filter: str | None = None) -> MigConfigSpec:
    return MigConfigSpec(device_filter=device_filter, devices="all", mig_enabled=True, mig_devices=layout)


def test_fit_with_a_model_is_validate_for_model() -> None:
    cfg = _one("x", _entry({"7g.80gb": 2}))
    assert fit_problems(cfg, "x", H100_80GB) == [
        "MIG config 'x': every GPU: 2 x 7g.80gb exceeds the 1 instance(s) a H100-80GB can hold"]
    assert fit_problems(cfg, "nope", H100_80GB) == ["unknown MIG config 'nope'; the config defines: x"]
    assert fit_problems(build_config(None), "all-1g.10gb", H100_80GB) == []


def test_a_standard_name_for_another_model_says_which_profiles_the_model_has() -> None:
    (problem,) = fit_problems(build_config(None), "all-1g.5gb", H100_80GB)
    assert problem.startswith("MIG config 'all-1g.5gb' has no entry for the H100-80GB (profile '1g.5gb' is "
                              "unknown for H100-80GB; allowed: 1g.10gb, ")
    (problem,) = fit_problems(build_config(None), "all-9g.5gb", H100_80GB)
    assert problem.startswith("unknown MIG config 'all-9g.5gb': profile '9g.5gb' is unknown for H100-80GB")
    (problem,) = fit_problems(build_config(None), "all-1g.10gb", L4)
    assert problem == "MIG config 'all-1g.10gb' has no entry for the L4 (the L4 does not support MIG)"


def test_without_a_model_every_model_a_filter_names_must_fit() -> None:
    cfg = _one("x", _entry({"1g.6gb": 5}, A30), _entry({"1g.10gb": 7}, H100_80GB.mig_parted_filters[0]))
    expected = ["MIG config 'x': every GPU: 5 x 1g.6gb exceeds the 4 instance(s) a A30-24GB can hold"]
    assert fit_problems(cfg, "x", None, chosen=False) == expected
    # Chosen, it fits the H100 but that is not enough: the A30 nodes it names would fail.
    assert fit_problems(cfg, "x", None) == expected


def test_without_a_model_unfiltered_entries_need_known_profiles() -> None:
    cfg = _one("odd", _entry({"1g.11gb": 1}))
    expected = ["MIG config 'odd': profile '1g.11gb' is not a MIG profile of any catalogue GPU"]
    assert fit_problems(cfg, "odd", None, chosen=False) == expected
    assert fit_problems(cfg, "odd", None) == expected


def test_a_defined_config_for_unknown_gpus_is_left_to_mig_parted_but_a_chosen_one_must_fit_some_gpu() -> None:
    cfg = _one("blackwell", _entry({"1g.23gb": 7}, UNLISTED))
    assert fit_problems(cfg, "blackwell", None, chosen=False) == []
    assert fit_problems(cfg, "blackwell", None) == ["MIG config 'blackwell' fits none of the catalogue's GPU models"]


def test_a_chosen_config_of_known_profiles_must_still_be_placeable_on_some_gpu() -> None:
    cfg = _one("three-halves", _entry({"3g.40gb": 3}))
    assert fit_problems(cfg, "three-halves", None, chosen=False) == []
    assert fit_problems(cfg, "three-halves", None) == [
        "MIG config 'three-halves' fits none of the catalogue's GPU models"]
    assert fit_problems(_one("ok", _entry({"3g.40gb": 2})), "ok", None) == []


def test_custom_layouts_take_both_media_extension_spellings_and_refuse_misspelt_profiles() -> None:
    (spec,) = custom_specs([CustomGpuLayout(0, (CustomSlice("1g.10gb.me"), CustomSlice("1g.10gb", 2)))])
    assert spec.mig_devices == {"1g.10gb+me": 1, "1g.10gb": 2}
    with pytest.raises(MigPartedError) as e:
        custom_specs([CustomGpuLayout(3, (CustomSlice("1g10gb"),))])
    assert e.value.problems[0].startswith("GPU 3: ") and "'1g10gb' is not a MIG profile name" in e.value.problems[0]
