"""A GPU the catalogue does not know is still a GPU: ``check`` passes it with a notice (the global driver
minimum applies), the labeller and the inventory describe it from NVML, and the MIG manager plans its
layouts from NVML's own profile and placement queries. The simulated ``unlisted-x2`` machine carries a
made-up board (PCI device ID 0x2FF0) that is deliberately absent from ``nvgpu.catalogue``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from node_agent.labeller import inventory
from node_agent.labeller.inventory import InventoryContext
from node_agent.nvml import NvmlBackend, open_nvml
from nvgpu import catalogue
from nvidia_gpu.components.manifests.inventory import SCHEMA
from nvml_sim.machines import get_machine
from tests.kit.fakehost import FakeHost, build_fake_host, sim_state_file
from tests.node_agent.agent_testkit import Cli

REPO = Path(__file__).resolve().parents[3]
MACHINE = "unlisted-x2"
NVML = f"simulated:{MACHINE}"
OWN_CONFIG = """version: v1
mig-configs:
  z100-mixed:
    - device-filter: ["0x2FF010DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "3g.40gb": 1
  z100-wrong:
    - device-filter: ["0x2FF010DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.12gb": 1
"""


def test_the_simulated_board_is_unknown_to_the_catalogue() -> None:
    spec = get_machine(MACHINE)
    assert catalogue.identify_model(spec.pci_device_id, spec.product_name) is None
    assert spec.model.key not in catalogue.MODEL_KEYS


def test_check_passes_an_unknown_model_with_a_notice(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, MACHINE)
    code, doc = cli(host.root, NVML, "check", "--phase", "host")
    assert (code, doc["verdict"], doc["reasons"]) == (0, "ok", []), doc
    assert doc["requiredDriver"] == catalogue.GLOBAL_MIN_DRIVER
    assert [g["model"] for g in doc["gpus"]] == [None, None]
    assert len(doc["notices"]) == 2
    assert "GPU 0 'NVIDIA Z100 80GB PCIe' (PCI device ID 0x2FF0) is not in the catalogue" in doc["notices"][0]


def test_an_unknown_model_below_the_global_driver_floor_still_fails(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, MACHINE, driver_version="418.67")
    code, doc = cli(host.root, NVML, "check", "--phase", "host")
    assert (code, doc["reasons"]) == (1, ["driver-too-old"])


def test_labels_describe_it_from_nvml(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, MACHINE)
    code, doc = cli(host.root, NVML, "labels", "--no-timestamp")
    assert code == 0 and doc["warnings"] == []
    got = doc["labels"]
    assert got["nvidia.com/gpu.product"] == "NVIDIA-Z100-80GB-PCIe"
    assert (got["nvidia.com/gpu.count"], got["nvidia.com/gpu.family"], got["nvidia.com/mig.capable"]) == (
        "2", "hopper", "true")


def _mig_apply(host: FakeHost, config: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(host.root), "--nvml", NVML,
                           "mig", "apply", "--config", str(config), "--name", name],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)


def test_mig_layouts_come_from_nvmls_own_profiles(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path / "host", MACHINE)
    config = tmp_path / "mig.yaml"
    config.write_text(OWN_CONFIG)
    done = _mig_apply(host, config, "z100-mixed")
    assert done.returncode == 0, done.stdout + done.stderr
    with open_nvml(NvmlBackend("simulated", MACHINE, sim_state_file(host.root, MACHINE))) as nvml:
        inv, driver = nvml.inventory(), nvml.driver()
    for gpu in inv.gpus:
        assert gpu.mig_enabled and sorted(d.profile for d in gpu.mig_devices) == ["1g.10gb", "1g.10gb", "3g.40gb"]
        status = inventory.gpu_status(gpu, driver, InventoryContext(sharing="MIG"))
        assert status["model"] == "" and status["productName"] == "NVIDIA Z100 80GB PCIe"
        assert sorted(i["profile"] for i in status["mig"]["instances"]) == ["1g.10gb", "1g.10gb", "3g.40gb"]
        jsonschema.Draft202012Validator(SCHEMA).validate({"spec": {"node": "n", "index": gpu.index},
                                                          "status": status})


@pytest.mark.parametrize("name", ["z100-wrong"])
def test_a_profile_nvml_does_not_list_is_refused_clearly(tmp_path: Path, name: str) -> None:
    host = build_fake_host(tmp_path / "host", MACHINE)
    config = tmp_path / "mig.yaml"
    config.write_text(OWN_CONFIG)
    done = _mig_apply(host, config, name)
    assert done.returncode != 0
    assert "1g.12gb" in done.stdout + done.stderr and "1g.10gb" in done.stdout + done.stderr
