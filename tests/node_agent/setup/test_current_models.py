"""A current data-center board the catalogue now knows (issue 33, item 5): the simulated ``hgx-b200`` (eight
"NVIDIA B200", PCI device ID 0x2901, as NVIDIA/open-gpu-kernel-modules lists it) passes ``check`` as a
catalogue model with no unknown-model notice and the B200's own driver floor, is labelled as GFD labels a
Blackwell GPU, and takes NVIDIA's shipped ``all-balanced`` layout for its device ID.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from node_agent.nvml import NvmlBackend, open_nvml
from nvgpu import catalogue
from nvml_sim.machines import get_machine
from tests.kit.fakehost import build_fake_host, sim_state_file
from tests.node_agent.agent_testkit import Cli

REPO = Path(__file__).resolve().parents[3]
MACHINE = "hgx-b200"
NVML = f"simulated:{MACHINE}"
NVIDIA_FILE = REPO / "tests" / "nvgpu" / "nvidia-mig-parted-config-default.yaml"  # NVIDIA's, unchanged


def test_the_simulated_board_is_the_catalogues_b200() -> None:
    spec = get_machine(MACHINE)
    assert catalogue.identify_model(spec.pci_device_id, spec.product_name) is catalogue.B200
    assert catalogue.model_by_product_name(spec.product_name) is catalogue.B200


def test_check_passes_a_b200_with_no_notice_and_its_own_driver_floor(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, MACHINE)
    code, doc = cli(host.root, NVML, "check", "--phase", "host")
    assert (code, doc["verdict"], doc["reasons"], doc["notices"]) == (0, "ok", [], []), doc
    assert [g["model"] for g in doc["gpus"]] == ["B200"] * 8
    assert doc["requiredDriver"] == "570.133.20"  # the MIG User Guide's first B200 driver


def test_a_b200_below_its_first_driver_fails_check(tmp_path: Path, cli: Cli) -> None:
    """570.124.06 is above the global floor but below NVIDIA's first B200 driver: refused as too old."""
    host = build_fake_host(tmp_path, MACHINE, driver_version="570.124.06")
    code, doc = cli(host.root, NVML, "check", "--phase", "host")
    assert (code, doc["reasons"]) == (1, ["driver-too-old"]), doc


def test_labels_say_blackwell(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, MACHINE)
    code, doc = cli(host.root, NVML, "labels", "--no-timestamp")
    assert code == 0 and doc["warnings"] == [], doc
    got = doc["labels"]
    assert (got["nvidia.com/gpu.product"], got["nvidia.com/gpu.count"], got["nvidia.com/gpu.family"]) == (
        "NVIDIA-B200", "8", "blackwell")
    assert (got["nvidia.com/gpu.compute.major"], got["nvidia.com/gpu.compute.minor"]) == ("10", "0")
    assert (got["nvidia.com/gpu.memory"], got["nvidia.com/mig.capable"]) == ("183359", "true")


def test_nvidias_all_balanced_applies_to_the_b200(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path / "host", MACHINE)
    done = subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(host.root), "--nvml", NVML,
                           "mig", "apply", "--config", str(NVIDIA_FILE), "--name", "all-balanced"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    with open_nvml(NvmlBackend("simulated", MACHINE, sim_state_file(host.root, MACHINE))) as nvml:
        inv = nvml.inventory()
    for gpu in inv.gpus:
        assert gpu.mig_enabled
        assert sorted(d.profile for d in gpu.mig_devices) == ["1g.23gb", "1g.23gb", "2g.45gb", "3g.90gb"]
