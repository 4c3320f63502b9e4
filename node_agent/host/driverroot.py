"""The NVIDIA driver root: where the driver's user-space files (``libnvidia-ml.so.1``, ``nvidia-smi``) live.

NVIDIA's semantics (``nvidiaDriverRoot``): ``/`` for a driver installed on the host, ``/run/nvidia/driver``
for a driver container. The path here is the driver root *as the agent process sees it*, not a path
under ``--host-root``: in the DaemonSets the host's root is mounted at ``/host`` (``--host-root``) and
the driver root, read-only, at ``/driver-root`` (``--driver-root /driver-root``), so the agent finds the
driver even before the container runtime is configured to inject it. Run directly on a host, the
default ``/`` is the host's own root.

Files are looked up inside the root only: the library directories a distribution uses (Debian
multiarch, ``lib64``, plain ``lib``) and the root's own ``/etc/ld.so.cache`` (glibc's
``glibc-ld.so.cache1.1`` format), symlinks resolved inside the root, so an absolute link in a driver
container does not escape to the agent's own filesystem. Never the agent's library path.
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: The NVML library's soname.
NVML_LIBRARY = "libnvidia-ml.so.1"
#: The driver's own programs a container may need (what the CDI specs mount), and the only commands the
#: agent looks up in the driver root (``node_agent.host.exec``).
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                   "nvidia-cuda-mps-server")
#: Environment variable NVIDIA's tools read for the driver root; the ``--driver-root`` default.
DRIVER_ROOT_ENV = "NVIDIA_DRIVER_ROOT"

_LIB_DIRS: dict[str, tuple[str, ...]] = {
    "x86_64": ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib64", "/lib"),
    "aarch64": ("/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/aarch64-linux-gnu", "/lib64", "/lib"),
}
_BIN_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")
LD_SO_CACHE = "/etc/ld.so.cache"

# glibc elf/cache.h: the new cache format and the flags telling which ABI an entry is for.
_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
_CACHE_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, extension_offset
_CACHE_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_FLAG_ELF_LIBC6 = 0x0003
_FLAG_TYPE_MASK = 0x00FF
_FLAG_REQUIRED_MASK = 0xFF00
_ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00}
_MAX_LINKS = 40


def machine_arch() -> str:
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def default_driver_root(env: dict[str, str] | None = None) -> str:
    """``$NVIDIA_DRIVER_ROOT``, else ``/``."""
    return (os.environ if env is None else env).get(DRIVER_ROOT_ENV) or "/"


def read_ld_so_cache(data: bytes, arch: str | None = None) -> dict[str, list[str]]:
    """soname → paths from an ``ld.so.cache`` image (entries for another ABI left out).

    Handles the new format alone (glibc ≥ 2.32's default) and after the old ``ld.so-1.7.0`` table (the
    compat format); string offsets count from the new header. Anything unreadable gives ``{}``.
    """
    start = data.find(_CACHE_MAGIC)
    if start < 0 or len(data) < start + _CACHE_HEADER.size:
        return {}
    _, nlibs, _, _, _ = _CACHE_HEADER.unpack_from(data, start)
    want = _ARCH_FLAGS.get(arch or machine_arch())
    out: dict[str, list[str]] = {}

    def text(offset: int) -> str | None:
        at = start + offset
        end = data.find(b"\0", at)
        return data[at:end].decode("utf-8", "replace") if 0 <= at < len(data) and end >= 0 else None

    for i in range(nlibs):
        at = start + _CACHE_HEADER.size + i * _CACHE_ENTRY.size
        if at + _CACHE_ENTRY.size > len(data):
            break
        flags, key, value, _, _ = _CACHE_ENTRY.unpack_from(data, at)
        if flags & _FLAG_TYPE_MASK != _FLAG_ELF_LIBC6:
            continue
        if want is not None and flags & _FLAG_REQUIRED_MASK != want:
            continue
        name, path = text(key), text(value)
        if name and path:
            out.setdefault(name, []).append(path)
    return out


@dataclass(frozen=True)
class DriverRoot:
    """A driver root as the agent process sees it (``/`` = the agent's own root)."""

    path: Path = Path("/")

    @property
    def is_own_root(self) -> bool:
        return str(self.path) == "/"

    def inside(self, path: str) -> Path:
        """``path`` (as seen inside the root) as the agent sees it, symlinks resolved inside the root.

        Returns the unresolved path when a link loops or leaves nothing to resolve.
        """
        parts = list(PurePosixPath("/", path).parts[1:])
        done: list[str] = []
        links = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            real = self.path.joinpath(*done, part)
            if real.is_symlink():
                links += 1
                if links > _MAX_LINKS:
                    return self.path.joinpath(path.lstrip("/"))
                target = os.readlink(real)
                if target.startswith("/"):
                    done = []
                parts = [p for p in PurePosixPath(target).parts if p != "/"] + parts
                continue
            done.append(part)
        return self.path.joinpath(*done)

    def library_dirs(self, arch: str | None = None) -> tuple[str, ...]:
        return _LIB_DIRS.get(arch or machine_arch(), _LIB_DIRS["x86_64"])

    def find_library(self, soname: str = NVML_LIBRARY, arch: str | None = None) -> tuple[Path | None, list[str]]:
        """``(path the agent can load, what was searched)``; path None when the root has no such library.

        The searched list names the candidates as the agent sees them (directories first, then the
        root's ``ld.so.cache``), for the error message.
        """
        searched: list[str] = []
        for d in self.library_dirs(arch):
            candidate = self.path.joinpath(d.lstrip("/"), soname)
            searched.append(str(candidate))
            resolved = self.inside(f"{d}/{soname}")
            if resolved.is_file():
                return resolved, searched
        cache = self.path.joinpath(LD_SO_CACHE.lstrip("/"))
        searched.append(f"{cache} (ld.so.cache)")
        try:
            data = self.inside(LD_SO_CACHE).read_bytes()
        except OSError:
            return None, searched
        for entry in read_ld_so_cache(data, arch).get(soname, []):
            resolved = self.inside(entry)
            if resolved.is_file():
                return resolved, searched
        return None, searched

    def driver_binary(self, name: str) -> Path | None:
        """``name`` (``nvidia-smi``, ...) under the root's ``/usr/bin``, ``/bin``, ``/usr/sbin`` or ``/sbin``."""
        for d in _BIN_DIRS:
            resolved = self.inside(f"{d}/{name}")
            if resolved.is_file() and os.access(resolved, os.X_OK):
                return resolved
        return None


#: The process's driver root, set once from ``--driver-root`` (``node_agent.cli``); ``/`` until then.
_current = DriverRoot()


def set_driver_root(root: DriverRoot | str | Path) -> DriverRoot:
    """Make ``root`` the process's driver root (what ``driver_binary`` and ``open_nvml("real")`` use)."""
    global _current
    _current = root if isinstance(root, DriverRoot) else DriverRoot(Path(root))
    return _current


def current_driver_root() -> DriverRoot:
    return _current


def driver_binary(name: str, root: DriverRoot | None = None) -> Path | None:
    """Where the driver's ``name`` (e.g. ``nvidia-smi``) is, as the agent sees it; None when the root has none."""
    return (root or _current).driver_binary(name)
