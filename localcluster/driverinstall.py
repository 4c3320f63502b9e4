"""Lay out an NVIDIA driver's user-space files under a root the way the driver's installer does.

Real shared objects built with the C compiler, each with the driver's soname (``libcuda.so.1``,
``libnvidia-nvvm.so.4``, ``libnvidia-gpucomp.so.<version>``), installed by version in the distribution's
library directory; the soname links and ``/etc/ld.so.cache`` made by the real ``ldconfig -r``; the dev
link ``libcuda.so``; the driver's tools, GSP firmware, and, when asked, an older driver's leftover
library that must not be picked up. NVML can be NVIDIA's mock library (``tools/mocknvml``), installed
as ``libnvidia-ml.so.<version>`` with the ``libnvidia-ml.so.1`` link the installer makes (the mock has
no soname, so ``ldconfig`` makes none).

Used by the tests (through :mod:`tests.kit.driverinstall`, which adds the simulated ``nvidia-smi``) and by a
real node's simulated GPU host (:mod:`localcluster.node`).

Two layouts: ``debian`` (``/usr/lib/x86_64-linux-gnu``, a host-installed driver) and ``rhel``
(``/usr/lib64``, as NVIDIA's driver containers are built, with absolute links that must resolve inside
the root).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Layout = Literal["debian", "rhel"]
LIB_DIRS: dict[str, str] = {"debian": "/usr/lib/x86_64-linux-gnu", "rhel": "/usr/lib64"}

#: library base name -> soname (``{v}`` is the driver version), as the 550 driver ships them.
LIBRARIES: dict[str, str] = {
    "libcuda.so": "libcuda.so.1",
    "libnvidia-ml.so": "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
    "libnvidia-gpucomp.so": "libnvidia-gpucomp.so.{v}",
    "libnvidia-allocator.so": "libnvidia-allocator.so.1",
    "libnvidia-cfg.so": "libnvidia-cfg.so.1",
    "libcudadebugger.so": "libcudadebugger.so.1",
    "libnvidia-opencl.so": "libnvidia-opencl.so.1",
}
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


@dataclass(frozen=True)
class InstalledDriver:
    root: Path
    version: str
    lib_dir: str  #: inside the root
    libraries: dict[str, str]  #: installed path inside the root -> soname


def shared_object(path: Path, soname: str, cc: str = "cc") -> None:
    """A real ELF shared object at ``path`` whose ``DT_SONAME`` is ``soname``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "lib.c"
        src.write_text("int nvidia_gpu_test_symbol(void) { return 0; }\n")
        subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src)], check=True,
                       capture_output=True)


def install_driver(root: Path, version: str, *, layout: Layout = "debian", nvml_library: Path | None = None,
                   leftover: str | None = None, nvidia_smi: str | None = None) -> InstalledDriver:
    """Install driver ``version``'s files under ``root`` (see the module docstring).

    ``nvidia_smi`` is the script installed as ``nvidia-smi`` (default: one that exits 0); ``leftover``
    installs an older driver's ``libcuda.so.<leftover>``.
    """
    lib_dir = LIB_DIRS[layout]
    lib = root / lib_dir.lstrip("/")
    lib.mkdir(parents=True, exist_ok=True)
    installed: dict[str, str] = {}
    for base, soname_t in LIBRARIES.items():
        soname = soname_t.format(v=version)
        target = lib / f"{base}.{version}"
        if base == "libnvidia-ml.so" and nvml_library is not None:
            shutil.copy(nvml_library, target)
        else:
            shared_object(target, soname)
        installed[f"{lib_dir}/{target.name}"] = soname
    if leftover:
        shared_object(lib / f"libcuda.so.{leftover}", "libcuda.so.1")
    conf = root / "etc/ld.so.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"{lib_dir}\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True, capture_output=True)
    # What the installer links itself: NVML's soname (the mock has none for ldconfig to read) and the
    # dev link. In the driver container layout the links are absolute, as in NVIDIA's images.
    prefix = f"{lib_dir}/" if layout == "rhel" else ""
    for link, target_name in (("libnvidia-ml.so.1", f"libnvidia-ml.so.{version}"), ("libcuda.so", "libcuda.so.1")):
        p = lib / link
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(prefix + target_name)
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        p = bin_dir / name
        if name == "nvidia-smi" and (p.exists() or p.is_symlink()) and nvidia_smi is None:
            continue  # keep a simulated nvidia-smi the fake host already has
        if p.is_symlink() or p.exists():
            p.unlink()
        p.write_text(nvidia_smi if name == "nvidia-smi" and nvidia_smi else "#!/bin/sh\nexit 0\n")
        p.chmod(0o755)
    fw = root / f"lib/firmware/nvidia/{version}"
    fw.mkdir(parents=True, exist_ok=True)
    for name in FIRMWARE:
        (fw / name).write_bytes(b"\0" * 16)
    return InstalledDriver(root, version, lib_dir, installed)
