"""gpu-iommu.sh against fake host roots: vendor detection, the GRUB drop-in, idempotence, reboot request."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nvidia_gpu.components.manifests.dra import iommu_script
from tests.kit.tools import missing

SCRIPT = iommu_script().content


def run(root: Path) -> str:
    proc = subprocess.run(["bash", "-c", SCRIPT], env={"NVIDIA_GPU_ROOT": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout


def fake_root(tmp_path: Path, vendor: str, cmdline: str) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {vendor}\n")
    (tmp_path / "proc/cmdline").write_text(cmdline + "\n")
    return tmp_path


@pytest.mark.parametrize(("vendor", "param"), [("GenuineIntel", "intel_iommu=on"), ("AuthenticAMD", "amd_iommu=on")])
def test_missing_parameters_write_the_dropin_and_ask_for_a_reboot(tmp_path: Path, vendor: str, param: str) -> None:
    root = fake_root(tmp_path, vendor, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro")
    out = run(root)
    assert f"lacks {param} iommu=pt: reboot required" in out
    dropin = root / "etc/default/grub.d/90-nvidia-gpu-iommu.cfg"
    assert dropin.read_text() == f'GRUB_CMDLINE_LINUX_DEFAULT="${{GRUB_CMDLINE_LINUX_DEFAULT:-}} {param} iommu=pt"\n'
    before = dropin.stat().st_mtime_ns
    run(root)
    assert dropin.stat().st_mtime_ns == before  # idempotent: nothing rewritten


def test_active_parameters_need_no_reboot(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "GenuineIntel", "root=/dev/sda1 intel_iommu=on iommu=pt quiet")
    assert "IOMMU parameters active (intel_iommu=on iommu=pt)" in run(root)


def test_unknown_vendor_is_left_alone(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "ARM", "root=/dev/sda1")
    assert "unknown CPU vendor" in run(root)
    assert not (root / "etc").exists()


def test_shellcheck_clean(tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        missing("shellcheck is not installed (make deps installs it)")
    script = tmp_path / "gpu-iommu.sh"
    script.write_text(SCRIPT)
    subprocess.run(["shellcheck", str(script)], check=True, timeout=60)
