"""The catalogue against NVIDIA's own tables (issue 33, item 5: widen the catalogue).

Two published sources are checked as data, not copied into the test:

- NVIDIA's shipped mig-parted config (``deployments/systemd/config-default.yaml``, mig-parted v0.15.0,
  vendored byte for byte in ``tests/node_agent/mig/``): every PCI device ID in its ``device-filter`` lists must be a
  catalogue model, and every MIG profile the catalogue gives a model must be a profile NVIDIA's file
  creates on that model with the same instance count; every profile NVIDIA's file names must belong to
  some catalogue model.
- NVIDIA/open-gpu-kernel-modules ``README.md`` (the supported-GPU table: NVML product name and PCI device
  ID): each data-center board below maps to its model by ID and by name.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from nvgpu import catalogue, migparted
from nvgpu.mig import all_profile_layout, balanced_layout, place_layout
from nvgpu.stackconfig import load_stack_config
from tests.nvgpu.stackconfig.test_stackconfig import VALID

NVIDIA_FILE = Path(__file__).with_name("nvidia-mig-parted-config-default.yaml")


@pytest.fixture(scope="module")
def nvidia() -> migparted.MigPartedConfig:
    return migparted.load_config_text(NVIDIA_FILE.read_text(), str(NVIDIA_FILE))


def _filtered_ids(config: migparted.MigPartedConfig) -> set[int]:
    return {f.device for specs in config.mig_configs.values() for s in specs for f in s.filters}


#: (catalogue key, PCI device ID, nvmlDeviceGetName) as NVIDIA/open-gpu-kernel-modules README.md lists them
#: (rows "NVIDIA H100 NVL | 2321 10DE 1839", "NVIDIA B200 | 2901 10DE 1999", ...). IDs without a README
#: row (0x233D, the H100 96GB) are checked by ID only in the mig-parted test below.
README_ROWS = [
    ("H100-94GB", 0x2321, "NVIDIA H100 NVL"),
    ("H100-94GB", 0x233A, "NVIDIA H800 NVL"),
    ("H100-96GB", 0x20B6, "NVIDIA PG506-232"),
    ("GH200-96GB", 0x2342, "NVIDIA GH200 480GB"),
    ("GH200-96GB", 0x2342, "NVIDIA GH200 120GB"),
    ("H20", 0x2329, "NVIDIA H20"),
    ("GH200-144GB", 0x2348, "NVIDIA GH200 144G HBM3e"),
    ("H200-141GB", 0x233B, "NVIDIA H200 NVL"),
    ("B200", 0x2901, "NVIDIA B200"),
    ("GB200", 0x2941, "NVIDIA GB200"),
    ("B300", 0x3182, "NVIDIA B300 SXM6 AC"),
    ("GB300", 0x31C2, "NVIDIA GB300"),
    ("RTX-PRO-6000", 0x2BB5, "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
    ("L40S", 0x26B9, "NVIDIA L40S"),
    ("L40", 0x26B5, "NVIDIA L40"),
    ("A10", 0x2236, "NVIDIA A10"),
    ("A40", 0x2235, "NVIDIA A40"),
]


@pytest.mark.parametrize(("key", "device", "name"), README_ROWS, ids=lambda v: hex(v) if isinstance(v, int) else v)
def test_data_center_boards_map_to_their_model(key: str, device: int, name: str) -> None:
    model = catalogue.get_model(key)
    assert catalogue.model_by_pci_device(device) is model
    assert catalogue.model_by_product_name(name) is model
    assert catalogue.identify_model(device, name) is model


def test_no_pci_id_or_product_name_belongs_to_two_models() -> None:
    ids = [d for m in catalogue.MODELS for d in m.pci_device_ids]
    names = [n for m in catalogue.MODELS for n in m.product_names]
    assert len(ids) == len(set(ids)), sorted(d for d in ids if ids.count(d) > 1)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    keys = [m.key for m in catalogue.MODELS]
    assert len(keys) == len(set(keys))


def test_every_id_nvidia_filters_on_is_a_catalogue_mig_model(nvidia: migparted.MigPartedConfig) -> None:
    missing = sorted(f"0x{d:04X}" for d in _filtered_ids(nvidia)
                     if (m := catalogue.model_by_pci_device(d)) is None or m.mig is None)
    assert missing == []


def test_every_filtered_entry_is_what_the_model_does(nvidia: migparted.MigPartedConfig) -> None:
    """Each entry NVIDIA aims at a device ID places on that ID's model; ``all-<profile>`` entries hold
    exactly the model's instance count, ``all-balanced`` entries are the model's balanced layout."""
    for name, specs in nvidia.mig_configs.items():
        for spec in specs:
            for f in spec.filters:
                model = catalogue.model_by_pci_device(f.device)
                assert model is not None and model.mig is not None, (name, hex(f.device))
                place_layout(model, spec.layout, gpu=f"{name} on {model.key}")
                if name == migparted.ALL_BALANCED:
                    assert balanced_layout(model) == spec.layout, (name, model.key)
                elif len(spec.layout) == 1:
                    (profile,) = spec.layout
                    assert all_profile_layout(model, profile) == spec.layout, (name, model.key)


def test_every_catalogue_profile_is_one_nvidia_creates_with_the_same_count(
    nvidia: migparted.MigPartedConfig,
) -> None:
    """The catalogue adds no profile NVIDIA's file lacks, and its instance counts are NVIDIA's: the entry of
    ``all-<profile>`` that selects the model (by filter, else the unfiltered one) holds max_instances."""
    wrong: list[str] = []
    for model in catalogue.MODELS:
        if model.mig is None:
            continue
        for p in model.mig.profiles:
            config = migparted.config_name_for_profile(p.name)
            specs = [s for s in nvidia.mig_configs.get(config, []) if s.matches_model(model)]
            layouts = [s.layout for s in specs]
            if layouts != [{p.name: p.max_instances}]:
                wrong.append(f"{model.key} {p.name} x{p.max_instances}: NVIDIA's {config} gives {layouts}")
    assert wrong == []


#: Profiles of a 189 GB part that NVIDIA's file names under no model comment and no device filter
#: (``all-3g.95gb``, ``all-4g.95gb``, ``all-7g.189gb``, between the B200's and the B300's): with no PCI ID to
#: select it, the catalogue cannot hold it; such a GPU takes the unknown-model path (NVML's own profiles).
UNATTRIBUTED = {"3g.95gb", "4g.95gb", "7g.189gb"}


def test_every_profile_nvidia_names_belongs_to_a_catalogue_model(nvidia: migparted.MigPartedConfig) -> None:
    known = {p.name for m in catalogue.MODELS if m.mig for p in m.mig.profiles}
    named = {p for specs in nvidia.mig_configs.values() for s in specs for p in s.layout}
    assert named - known == UNATTRIBUTED


@pytest.mark.parametrize(
    ("key", "architecture", "compute"),
    [("H100-94GB", "hopper", (9, 0)), ("GH200-96GB", "hopper", (9, 0)), ("H20", "hopper", (9, 0)),
     ("B200", "blackwell", (10, 0)), ("GB200", "blackwell", (10, 0)), ("B300", "blackwell", (10, 3)),
     ("RTX-PRO-6000", "blackwell", (12, 0)), ("L40S", "ada-lovelace", (8, 9)), ("A10", "ampere", (8, 6))],
)
def test_family_is_what_gfd_derives_from_the_compute_capability(
    key: str, architecture: str, compute: tuple[int, int]
) -> None:
    """GFD's ``nvidia.com/gpu.family`` comes from the compute capability (k8s-device-plugin
    internal/lm/resource.go); the catalogue's ``architecture`` must be the same word."""
    model = catalogue.get_model(key)
    assert (model.architecture, model.compute_capability) == (architecture, compute)
    assert catalogue.family_for_compute_capability(*compute) == architecture


@pytest.mark.parametrize(
    ("key", "minimum"),
    # NVIDIA MIG User Guide, "Deployment Considerations": the first driver of each GPU's MIG support.
    [("B200", "570.133.20"), ("GB200", "570.133.20"), ("B300", "580.82.07"), ("H20", "535.161.07"),
     ("RTX-PRO-6000", "575.51.03")],
)
def test_driver_minimum_is_nvidias(key: str, minimum: str) -> None:
    model = catalogue.get_model(key)
    assert model.mig is not None
    assert (model.min_driver, model.mig.min_driver, model.effective_min_driver) == (minimum, minimum, minimum)


@pytest.mark.parametrize("parted", ["all-1g.24gb.gfx", "all-1g.24gb.me.all", "all-1g.24gb-me", "all-balanced"])
def test_a_node_group_can_choose_nvidias_rtx_pro_6000_configs(parted: str) -> None:
    """NVIDIA's names for the RTX PRO 6000's attribute profiles (``+gfx``, ``+me.all``, ``-me``) are stack
    config values like any ``all-<profile>``, and they validate on the model they are for."""
    values = copy.deepcopy(VALID)
    values["nodeGroups"][0] = {"name": "rtx", "nodeGroup": "gpu-rtx",
                               "gpu": {"sharing": "MIG", "model": "RTX-PRO-6000", "mig": {"partedConfig": parted}}}
    assert load_stack_config(values).node_groups[0].mig_config_name == parted


def test_an_rtx_pro_6000_config_on_an_h100_is_refused() -> None:
    values = copy.deepcopy(VALID)
    values["nodeGroups"][0] = {"name": "h100", "nodeGroup": "gpu-h100", "gpu": {
        "sharing": "MIG", "model": "H100-80GB", "mig": {"partedConfig": "all-1g.24gb.gfx"}}}
    with pytest.raises(ValueError, match=r"1g\.24gb\.gfx.*unknown for H100-80GB"):
        load_stack_config(values)


@pytest.mark.parametrize(("spelled", "profile"), [
    ("1g.24gb.gfx", "1g.24gb+gfx"), ("1g.24gb.me.all", "1g.24gb+me.all"), ("2g.48gb.me.all", "2g.48gb+me.all"),
    ("1g.24gb.me", "1g.24gb+me"), ("1g.24gb-me", "1g.24gb-me"), ("4g.96gb+gfx", "4g.96gb+gfx"),
])
def test_resource_spellings_of_attribute_profiles_resolve(spelled: str, profile: str) -> None:
    """The device plugin's resource names spell ``+`` as ``.`` (``nvidia.com/mig-1g.24gb.me.all``); the catalogue
    reads every such spelling back as mig-parted's name, and the resource suffix round-trips."""
    spec = catalogue.RTX_PRO_6000.mig
    assert spec is not None
    found = spec.profile(spelled)
    assert found is not None and found.name == profile
    assert spec.profile(found.resource_suffix) is found


def test_one_media_instance_per_rtx_pro_6000() -> None:
    """+me and +me.all each take the GPU's media engines (mig-parted creates one of either): not both."""
    model = catalogue.RTX_PRO_6000
    place_layout(model, {"1g.24gb+me.all": 1, "1g.24gb-me": 3})
    with pytest.raises(ValueError, match=r"only one \+me"):
        place_layout(model, {"1g.24gb+me": 1, "1g.24gb+me.all": 1})
