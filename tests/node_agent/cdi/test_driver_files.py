"""The driver's files under a driver root laid out by the real toolchain (cc, ldconfig), and their CDI edits."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from node_agent.cdi.driveredits import DriverEditsSource, HookTool, driver_edits, find_hook_tool
from node_agent.cdi.driverfiles import discover
from node_agent.cdi.elf import soname
from node_agent.host.driverroot import DriverRoot
from tests.kit.driverinstall import LIBRARIES, install_driver, shared_object

V = "550.54.15"


def test_soname_is_read_from_the_dynamic_section(tmp_path: Path) -> None:
    shared_object(tmp_path / "libx.so.1.2", "libx.so.1")
    assert soname(tmp_path / "libx.so.1.2") == "libx.so.1"
    (tmp_path / "text").write_text("not an ELF file, long enough to have a header of sixty-four bytes ......")
    assert soname(tmp_path / "text") is None
    assert soname(tmp_path / "missing") is None
    (tmp_path / "short").write_bytes(b"\x7fELF\x02\x01")
    assert soname(tmp_path / "short") is None


@pytest.mark.parametrize("layout", ["debian", "rhel"])
def test_discovery_takes_this_drivers_libraries_with_their_sonames(tmp_path: Path, layout: str) -> None:
    driver = install_driver(tmp_path / "root", V, layout=layout, leftover="535.104.05")  # type: ignore[arg-type]
    files = discover(DriverRoot(driver.root), V)
    assert files.problem == ""
    assert {lib.path: lib.soname for lib in files.libraries} == driver.libraries
    assert len(files.libraries) == len(LIBRARIES)
    assert all(lib.path.endswith(V) for lib in files.libraries)  # the 535 leftover is not mounted
    assert files.library_dirs == (driver.lib_dir,)
    assert files.binaries == ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced",
                              "/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server")
    assert files.firmware == (f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin", f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin")


def test_a_library_directory_known_only_to_the_roots_ld_cache(tmp_path: Path) -> None:
    """A driver container's libraries in a directory of its own, found through its ld.so.cache."""
    root = tmp_path / "root"
    lib = root / "opt/nvidia/lib"
    for base, name in (("libnvidia-ml.so", "libnvidia-ml.so.1"), ("libcuda.so", "libcuda.so.1")):
        shared_object(lib / f"{base}.{V}", name)
    (root / "etc").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("/opt/nvidia/lib\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    files = discover(DriverRoot(root), V)
    assert [lib.path for lib in files.libraries] == [f"/opt/nvidia/lib/libcuda.so.{V}",
                                                     f"/opt/nvidia/lib/libnvidia-ml.so.{V}"]


def test_no_driver_gives_no_edits_and_says_where_it_looked(tmp_path: Path) -> None:
    files = discover(DriverRoot(tmp_path), V)
    assert files.libraries == () and "no libnvidia-ml.so.1 under driver root" in files.problem
    assert str(tmp_path / "usr/lib64/libnvidia-ml.so.1") in files.problem
    assert driver_edits(files, "/", HookTool("/usr/bin/nvidia-cdi-hook")) is None


def test_edits_name_host_paths_under_the_nodes_driver_root_and_run_the_hooks(tmp_path: Path) -> None:
    driver = install_driver(tmp_path / "root", V, layout="rhel")
    files = discover(DriverRoot(driver.root), V)
    edits = driver_edits(files, "/run/nvidia/driver", HookTool("/usr/local/nvidia/toolkit/nvidia-cdi-hook"))
    assert edits is not None and edits.mounts and edits.hooks
    by_container = {m.container_path: m for m in edits.mounts}
    cuda = by_container[f"/usr/lib64/libcuda.so.{V}"]
    assert cuda.host_path == f"/run/nvidia/driver/usr/lib64/libcuda.so.{V}"
    assert cuda.options == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert "/usr/lib64/libcuda.so.1" not in by_container  # ldconfig in the container makes the sonames
    assert by_container["/usr/bin/nvidia-smi"].host_path == "/run/nvidia/driver/usr/bin/nvidia-smi"
    assert [(h.hook_name, h.path, h.args) for h in edits.hooks] == [
        ("createContainer", "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
         ["nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib64/libcuda.so"]),
        ("createContainer", "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
         ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"]),
    ]
    ctk = driver_edits(files, "/", HookTool("/usr/bin/nvidia-ctk"))
    assert ctk is not None and ctk.hooks
    assert [h.args[:3] for h in ctk.hooks if h.args] == [["nvidia-ctk", "hook", "create-symlinks"],
                                                          ["nvidia-ctk", "hook", "update-ldcache"]]


def test_without_the_hook_every_library_is_also_mounted_at_its_soname(tmp_path: Path) -> None:
    driver = install_driver(tmp_path / "root", V)
    edits = driver_edits(discover(DriverRoot(driver.root), V), "/", None)
    assert edits is not None and edits.mounts and edits.hooks is None
    lib = driver.lib_dir
    pairs = {(m.host_path, m.container_path) for m in edits.mounts}
    for path, name in driver.libraries.items():
        assert (path, f"{lib}/{name}") in pairs or name == path.rsplit("/", 1)[1]
    assert (f"{lib}/libcuda.so.{V}", f"{lib}/libcuda.so") in pairs
    assert (f"{lib}/libnvidia-nvvm.so.{V}", f"{lib}/libnvidia-nvvm.so.4") in pairs
    # gpucomp's soname is its versioned name: mounted once.
    assert sum(1 for _, c in pairs if c.startswith(f"{lib}/libnvidia-gpucomp.so")) == 1


def test_the_hook_is_used_only_when_seen_executable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    driver = install_driver(tmp_path / "root", V)
    hook_dir = tmp_path / "toolkit"
    hook_dir.mkdir()
    seen = hook_dir / "nvidia-cdi-hook"
    assert find_hook_tool("/usr/bin/nvidia-cdi-hook", seen) is None
    seen.write_text("#!/bin/sh\n")
    assert find_hook_tool("/usr/bin/nvidia-cdi-hook", seen) is None  # not executable
    source = DriverEditsSource(DriverRoot(driver.root), "/", "/usr/bin/nvidia-cdi-hook", seen)
    with caplog.at_level(logging.INFO, logger="node_agent.cdi.driveredits"):
        first = source.edits(V)
        assert first is not None and first.hooks is None
        assert "event=cdi-without-hooks" in caplog.text
        seen.chmod(0o755)  # the toolkit got installed after the agent started
        second = source.edits(V)
    assert second is not None and second.hooks and second.hooks[0].path == "/usr/bin/nvidia-cdi-hook"
    assert caplog.text.count("event=cdi-without-hooks") == 1 and "event=cdi-driver-files" in caplog.text
