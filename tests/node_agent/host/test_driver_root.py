"""``--driver-root``: finding the driver's NVML library and binaries inside a driver root, never elsewhere."""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from node_agent.cli import main
from node_agent.cli.context import AgentContext
from node_agent.host.driverroot import (
    NVML_LIBRARY,
    DriverRoot,
    current_driver_root,
    default_driver_root,
    driver_binary,
    read_ld_so_cache,
    set_driver_root,
)

REPO = Path(__file__).resolve().parents[3]


def _cache(entries: list[tuple[int, str, str]]) -> bytes:
    """A ``glibc-ld.so.cache1.1`` image with ``(flags, soname, path)`` entries."""
    header_size, entry_size = 48, 24
    strings = b""
    offsets = []
    base = header_size + entry_size * len(entries)
    for _, name, path in entries:
        k = base + len(strings)
        strings += name.encode() + b"\0"
        v = base + len(strings)
        strings += path.encode() + b"\0"
        offsets.append((k, v))
    out = struct.pack("<20sIIB3xI12x", b"glibc-ld.so.cache1.1", len(entries), len(strings), 2, 0)
    for (flags, _, _), (k, v) in zip(entries, offsets, strict=True):
        out += struct.pack("<iIIIQ", flags, k, v, 0, 0)
    return out + strings


def test_ld_so_cache_new_format_and_abi_filter() -> None:
    data = _cache([(0x0303, "libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
                   (0x0003, "libnvidia-ml.so.1", "/usr/lib/i386-linux-gnu/libnvidia-ml.so.1"),
                   (0x0A03, "libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1")])
    assert read_ld_so_cache(data, "x86_64") == {"libnvidia-ml.so.1": ["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]}
    assert read_ld_so_cache(data, "aarch64") == {
        "libnvidia-ml.so.1": ["/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"]}
    # The compat layout: an old "ld.so-1.7.0" table in front; offsets count from the new header.
    assert read_ld_so_cache(b"ld.so-1.7.0\0" + bytes(12) + data, "x86_64") == read_ld_so_cache(data, "x86_64")
    assert read_ld_so_cache(b"garbage") == {}
    assert read_ld_so_cache(data[:60], "x86_64") == {}


def test_real_ld_so_cache_parses() -> None:
    cache = Path("/etc/ld.so.cache")
    if not cache.exists():
        pytest.skip("no /etc/ld.so.cache here")
    found = read_ld_so_cache(cache.read_bytes())
    if not found:
        pytest.skip("this machine's ld.so.cache is in a format the parser does not read")
    assert any(name.startswith("libc.so") for name in found)


def test_library_found_in_a_distribution_directory(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64" / NVML_LIBRARY
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    path, searched = DriverRoot(tmp_path).find_library(arch="x86_64")
    assert path == lib
    assert searched == [str(tmp_path / "usr/lib/x86_64-linux-gnu" / NVML_LIBRARY), str(lib)]


def test_library_found_through_the_roots_ld_so_cache_with_absolute_links(tmp_path: Path) -> None:
    """A driver container: the cache names /opt/driver/...; an absolute link stays inside the root."""
    real = tmp_path / "opt/driver/lib/libnvidia-ml.so.550.90.07"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"\x7fELF")
    link = tmp_path / "opt/driver/lib" / NVML_LIBRARY
    link.symlink_to("/opt/driver/lib/libnvidia-ml.so.550.90.07")  # absolute: must resolve under the root
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.cache").write_bytes(_cache([(0x0303, NVML_LIBRARY, f"/opt/driver/lib/{NVML_LIBRARY}")]))
    path, searched = DriverRoot(tmp_path).find_library(arch="x86_64")
    assert path == real
    assert searched[-1] == f"{tmp_path / 'etc/ld.so.cache'} (ld.so.cache)"


def test_empty_root_names_every_path_searched(tmp_path: Path) -> None:
    path, searched = DriverRoot(tmp_path).find_library(arch="aarch64")
    assert path is None
    assert str(tmp_path / "usr/lib/aarch64-linux-gnu" / NVML_LIBRARY) in searched
    assert str(tmp_path / "lib64" / NVML_LIBRARY) in searched
    assert all(s.startswith(str(tmp_path)) for s in searched)


def test_driver_binary(tmp_path: Path) -> None:
    smi = tmp_path / "usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\n")
    root = DriverRoot(tmp_path)
    assert root.driver_binary("nvidia-smi") is None  # not executable
    smi.chmod(0o755)
    assert root.driver_binary("nvidia-smi") == smi
    assert driver_binary("nvidia-smi", root) == smi
    assert root.driver_binary("nvidia-debugdump") is None


def test_cli_sets_the_process_driver_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        main(["--driver-root", str(tmp_path), "--nvml", "simulated:t4x1", "--json", "sim", "status"])
        assert current_driver_root() == DriverRoot(tmp_path)
        monkeypatch.setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")
        assert default_driver_root() == "/run/nvidia/driver"
        assert default_driver_root({}) == "/"
    finally:
        set_driver_root("/")


def test_context_carries_the_driver_root(tmp_path: Path) -> None:
    args = argparse.Namespace(host_root=str(tmp_path), nvml="real", driver_root="/driver-root")
    ctx = AgentContext.from_args(args)
    assert ctx.nvml_backend.driver_root == Path("/driver-root")
    assert ctx.driver_root == DriverRoot(Path("/driver-root"))


def test_empty_driver_root_is_nvml_unavailable_naming_the_paths(tmp_path: Path) -> None:
    """In a fresh process (no NVML loaded yet): the clear error, and NVML_ERROR_LIBRARY_NOT_FOUND."""
    code = ("import sys; from pathlib import Path\n"
            "from node_agent.nvml import NvmlBackend, NvmlUnavailable, open_nvml\n"
            "try:\n    open_nvml(NvmlBackend('real', driver_root=Path(sys.argv[1]))).__enter__()\n"
            "except NvmlUnavailable as e:\n    print(e.code); print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    first, message = done.stdout.split("\n", 1)
    assert first == "12"
    assert f"no {NVML_LIBRARY} under driver root {tmp_path}" in message
    assert str(tmp_path / "usr/lib/x86_64-linux-gnu" / NVML_LIBRARY) in message or "aarch64" in message
    assert f"{tmp_path / 'etc/ld.so.cache'}" in message
