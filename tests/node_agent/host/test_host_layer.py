"""The host layer against fake roots: path confinement, atomic writes, commands, /proc and sysfs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node_agent.host import (
    CommandNotFound,
    CommandTimeout,
    DriverVersionError,
    HostError,
    HostRoot,
    gpu_minors,
    loaded_modules,
    normalize_address,
    nvidia_gpus,
    read_device,
    read_driver_version,
)
from node_agent.host.driverroot import DriverRoot, current_driver_root, set_driver_root
from node_agent.host.exec import HostExec
from tests.kit.fakehost import build_fake_host, driver_version_text


def test_paths_stay_inside_the_root(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    assert host.path("/etc/containerd/config.toml") == tmp_path / "etc/containerd/config.toml"
    with pytest.raises(HostError, match="absolute"):
        host.path("etc/passwd")
    with pytest.raises(HostError, match=r"\.\."):
        host.path("/etc/../../outside")


def test_atomic_write_skips_identical_content(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    assert host.write_atomic("/etc/a/b.conf", "x = 1\n")
    inode = os.stat(tmp_path / "etc/a/b.conf").st_ino
    assert not host.write_atomic("/etc/a/b.conf", "x = 1\n")
    assert os.stat(tmp_path / "etc/a/b.conf").st_ino == inode
    assert host.write_atomic("/etc/a/b.conf", b"x = 2\n", mode=0o600)
    assert (tmp_path / "etc/a/b.conf").read_text() == "x = 2\n"
    assert (tmp_path / "etc/a/b.conf").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "etc/a").iterdir()] == ["b.conf"]  # no temp files left behind
    assert host.remove("/etc/a/b.conf") and not host.remove("/etc/a/b.conf")


def test_kernel_files_are_written_in_place_and_never_created(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    (tmp_path / "proc/sys/net/core").mkdir(parents=True)
    (tmp_path / "proc/sys/net/core/bpf_jit_harden").write_text("2\n")
    host.write_kernel("/proc/sys/net/core/bpf_jit_harden", "1\n")
    assert host.read_text("/proc/sys/net/core/bpf_jit_harden") == "1\n"
    with pytest.raises(HostError, match="cannot open"):
        host.write_kernel("/sys/bus/pci/drivers/vfio-pci/bind", "0000:01:00.0")


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    with pytest.raises(HostError, match="/proc/modules"):
        host.read_text("/proc/modules")
    assert host.read_text_or_none("/proc/modules") is None
    assert host.listdir("/sys/nothing") == []


def test_missing_is_none_but_refused_or_unreadable_raises(tmp_path: Path) -> None:
    """What the services' narrow protocols rely on: only a missing file reads as absent."""
    host = HostRoot(tmp_path)
    assert host.read_bytes_or_none("/var/lib/x/state.json") is None
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/hostname").write_text("n\n")
    assert host.read_bytes_or_none("/etc/hostname/below") is None  # a file where a directory would be
    assert not host.exists("/etc/hostname/below")
    with pytest.raises(HostError, match="cannot read /etc: Is a directory"):
        host.read_bytes_or_none("/etc")
    (tmp_path / "etc/latin1").write_bytes(b"caf\xe9\n")
    assert host.read_bytes_or_none("/etc/latin1") == b"caf\xe9\n"
    with pytest.raises(HostError, match="/etc/latin1 is not UTF-8 text"):
        host.read_text_or_none("/etc/latin1")
    for call in (host.exists, host.is_dir, host.read_bytes_or_none, host.read_text_or_none):
        with pytest.raises(HostError, match=r"may not contain '\.\.'"):
            call("/etc/../../outside")


def test_commands_resolve_inside_the_root_and_time_out(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    tool = tmp_path / "usr/bin/hello"
    tool.parent.mkdir(parents=True)
    tool.write_text('#!/bin/sh\necho "root=$HOST_ROOT args=$*"\n')
    tool.chmod(0o755)
    result = host.run(["hello", "a", "b"], timeout_s=10)
    assert result.ok and result.stdout == f"root={tmp_path} args=a b\n"
    with pytest.raises(CommandNotFound):
        host.run(["ls"], timeout_s=10)  # the agent's own PATH is never used for a fake root
    slow = tmp_path / "usr/bin/slow"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"0\.2s"):
        host.run(["slow"], timeout_s=0.2, kill_after_s=0.5)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (driver_version_text("550.90.07"), "550.90.07"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.06  Wed Jun 26 06:46:07 UTC 2024\n", "535.183.06"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.67  Tue Mar 12 23:54:15 UTC 2024\n", "550.67"),
    ],
)
def test_driver_version_formats(tmp_path: Path, text: str, version: str) -> None:
    host = build_fake_host(tmp_path, "t4x1", driver_text=text)
    assert read_driver_version(HostRoot(host.root)) == version


def test_driver_version_errors(tmp_path: Path) -> None:
    missing = build_fake_host(tmp_path / "a", "t4x1", driver_loaded=False)
    with pytest.raises(DriverVersionError, match="not loaded") as info:
        read_driver_version(HostRoot(missing.root))
    assert info.value.missing
    odd = build_fake_host(tmp_path / "b", "t4x1", driver_text="NVRM version: something else entirely\n")
    with pytest.raises(DriverVersionError, match="something else entirely") as info:
        read_driver_version(HostRoot(odd.root))
    assert not info.value.missing


def test_modules_minors_and_pci(tmp_path: Path) -> None:
    fake = build_fake_host(tmp_path, "dgx-a100-40gb")
    host = HostRoot(fake.root)
    assert {"nvidia", "nvidia_uvm"} <= loaded_modules(host)
    minors = gpu_minors(host)
    assert minors["0000:07:00.0"] == 0 and minors["0000:bd:00.0"] == 7
    gpus = nvidia_gpus(host)
    assert [g.address for g in gpus] == sorted(minors)
    first = read_device(host, "00000000:07:00.0")
    assert (first.vendor, first.device, first.driver, first.iommu_group, first.numa_node) == (
        0x10DE, 0x20B0, "nvidia", 10, 0)
    assert read_device(host, "0000:00:1f.6").is_nvidia_gpu is False
    with pytest.raises(HostError, match="does not exist"):
        read_device(host, "0000:99:00.0")
    with pytest.raises(ValueError, match="DOMAIN:BUS"):
        normalize_address("07:00")


def test_state_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    with host.lock("runtime"), pytest.raises(HostError, match="another agent process"):
        other = HostRoot(tmp_path)
        with other.lock("runtime", timeout_s=0.1):
            pass
    with host.lock("runtime", timeout_s=0.1):
        pass
    assert (tmp_path / "var/lib/nvidia-gpu-agent/runtime.lock").exists()


def test_driver_tools_come_from_the_driver_root_when_the_host_root_has_none(tmp_path: Path) -> None:
    """The DRA plugin's container (host root = its own /) runs the driver's nvidia-smi inside the driver
    root, the way NVIDIA's MIG manager runs a driver container's tools; a host that has it wins."""
    host, driver = tmp_path / "host", tmp_path / "driver-root"
    (driver / "usr/bin").mkdir(parents=True)
    smi = driver / "usr/bin/nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    (host / "usr/bin").mkdir(parents=True)
    before = current_driver_root()
    try:
        set_driver_root(driver)
        exe = HostExec(HostRoot(host))
        assert exe.command(["nvidia-smi", "-i", "GPU-1", "-c", "EXCLUSIVE_PROCESS"]) == [
            "chroot", str(driver), "/usr/bin/nvidia-smi", "-i", "GPU-1", "-c", "EXCLUSIVE_PROCESS"]
        with pytest.raises(CommandNotFound, match="'nvidia-cuda-mps-control' not found"):
            exe.command(["nvidia-cuda-mps-control", "-d"])
        (host / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
        (host / "usr/bin/nvidia-smi").chmod(0o755)
        assert exe.command(["nvidia-smi", "-r"]) == [str(host / "usr/bin/nvidia-smi"), "-r"]
        (driver / "usr/bin/modprobe").write_text("#!/bin/sh\n")
        (driver / "usr/bin/modprobe").chmod(0o755)
        with pytest.raises(CommandNotFound):
            exe.command(["modprobe", "vfio-pci"])  # only the driver's own tools come from the driver root
        set_driver_root(DriverRoot())  # the agent's own /: never a source of tools for another host root
        with pytest.raises(CommandNotFound):
            HostExec(HostRoot(tmp_path / "empty")).command(["nvidia-smi"])
    finally:
        set_driver_root(before)
