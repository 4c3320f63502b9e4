"""The driver's user-space files a CUDA container needs, found under the driver root.

What NVIDIA's ``nvcdi`` (nvidia-container-toolkit) puts into a spec for ``compute,utility``, looked up the
way the driver installs them, never through the agent's own library path:

- **libraries**: every ``lib*.so.<driver version>`` in the directory ``libnvidia-ml.so.1`` resolves to
  (the driver installs all its libraries side by side, and the version suffix tells them from another
  driver's leftovers), each with its soname (``DT_SONAME``, else the ``lib*.so.N`` link beside it);
- **binaries**: ``nvidia-smi``, ``nvidia-debugdump``, ``nvidia-persistenced`` and the MPS control and
  server binaries, where the driver root has them;
- **firmware**: the GSP firmware under ``/lib/firmware/nvidia/<version>``;
- **sockets**: ``nvidia-persistenced``'s and ``nvidia-fabricmanager``'s, when those daemons run.

Paths are returned as seen *inside* the driver root (``/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15``),
resolved through its symlinks; :mod:`.driveredits` turns them into host paths under the node's driver root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from node_agent.cdi.elf import soname
from node_agent.host.driverroot import DRIVER_BINARIES, NVML_LIBRARY, DriverRoot

SOCKETS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket")
FIRMWARE_DIR = "/lib/firmware/nvidia"


@dataclass(frozen=True)
class DriverLibrary:
    path: str  #: the installed file, inside the driver root
    soname: str | None  #: the name the linker looks for (``libcuda.so.1``); None when it has none
    #: Whether the soname is the library's own ``DT_SONAME`` (then ``ldconfig`` makes its link) or only the
    #: name of the link beside it (then the link must be made explicitly).
    elf_soname: bool = True


@dataclass(frozen=True)
class DriverFiles:
    version: str
    libraries: tuple[DriverLibrary, ...] = ()
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    sockets: tuple[str, ...] = ()
    #: Why nothing was found (no NVML library under the root), for the log; empty when found.
    problem: str = ""

    @property
    def library_dirs(self) -> tuple[str, ...]:
        return tuple(sorted({lib.path.rsplit("/", 1)[0] for lib in self.libraries}))


def _in_root(root: DriverRoot, seen: Path) -> str:
    if root.is_own_root:
        return str(seen)
    return "/" + str(seen.relative_to(root.path))


def _soname_of(root: DriverRoot, directory: str, name: str, real: Path,
               entries: list[str]) -> tuple[str | None, bool]:
    found = soname(real)
    if found:
        return found, True
    # No DT_SONAME readable: the lib*.so.N link ldconfig made beside it names it.
    base = name.split(".so.", 1)[0] + ".so."
    links = [e for e in entries if e != name and e.startswith(base) and re.fullmatch(r"\d+", e[len(base):])
             and root.inside(f"{directory}/{e}") == real]
    return (min(links, key=len) if links else None), False


def discover(root: DriverRoot, version: str) -> DriverFiles:
    """The driver ``version``'s files under ``root`` (see the module docstring)."""
    nvml, searched = root.find_library(NVML_LIBRARY)
    if nvml is None:
        return DriverFiles(version, problem=f"no {NVML_LIBRARY} under driver root {root.path} "
                                            f"(searched {', '.join(searched)})")
    directory = _in_root(root, nvml.parent)
    suffix = f".so.{version}"
    entries = sorted(p.name for p in nvml.parent.iterdir())
    libraries = []
    for name in entries:
        if not (name.startswith("lib") and name.endswith(suffix)):
            continue
        real = root.inside(f"{directory}/{name}")
        if real.is_file():
            libraries.append(DriverLibrary(_in_root(root, real), *_soname_of(root, directory, name, real, entries)))
    binaries = tuple(_in_root(root, p) for b in DRIVER_BINARIES if (p := root.driver_binary(b)) is not None)
    fw_dir = root.inside(f"{FIRMWARE_DIR}/{version}")
    firmware = tuple(_in_root(root, p) for p in sorted(fw_dir.glob("gsp*.bin")) if p.is_file()) \
        if fw_dir.is_dir() else ()
    sockets = tuple(s for s in SOCKETS if root.inside(s).is_socket())
    return DriverFiles(version, tuple(libraries), binaries, firmware, sockets)
