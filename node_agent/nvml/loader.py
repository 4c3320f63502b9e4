"""Load the driver's ``libnvidia-ml.so.1`` from the driver root and hand it to nvidia-ml-py.

nvidia-ml-py's ``_LoadNvmlLibrary`` only does ``CDLL("libnvidia-ml.so.1")`` when ``pynvml.nvmlLib`` is
still None, i.e. the process's own library path: in an agent container that has no NVML (the image
ships none and the NVIDIA runtime may not be configured yet). So before ``nvmlInit`` the library is
found under the driver root (``node_agent.host.driverroot``), loaded with ctypes and set as
``pynvml.nvmlLib`` under nvidia-ml-py's own ``libLoadLock``; ``nvmlInit`` then uses it as is.

With the driver root ``/`` (the agent's own root: run directly on a host) the dynamic linker's own
lookup is tried first, as nvidia-ml-py would (so ``LD_LIBRARY_PATH`` still works there), then the
directories. Any other root is searched only inside it. A library, once loaded, stays for the
process (a shared library cannot be unloaded safely); a simulated machine installed over it
(``nvml_sim``) is left alone.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import pynvml

from node_agent.host.driverroot import NVML_LIBRARY, DriverRoot, current_driver_root
from node_agent.nvml.errors import NvmlUnavailable

log = logging.getLogger(__name__)

_loaded_from: str | None = None


def loaded_from() -> str | None:
    """Path of the NVML library this module loaded (None: none yet, or loaded by someone else)."""
    return _loaded_from


def _not_found(root: DriverRoot, searched: list[str], extra: str = "") -> NvmlUnavailable:
    return NvmlUnavailable(
        f"NVML Shared Library Not Found: no {NVML_LIBRARY} under driver root {root.path}{extra} (searched "
        f"{', '.join(searched)}); pass --driver-root (or set $NVIDIA_DRIVER_ROOT) to where the driver's "
        "files are, e.g. / for a driver installed on the host or /run/nvidia/driver for a driver container",
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def load_nvml(root: DriverRoot | Path | str | None = None) -> None:
    """Make sure ``pynvml.nvmlLib`` is set, from ``root`` (default: the process's driver root).

    Raises ``NvmlUnavailable`` (code NVML_ERROR_LIBRARY_NOT_FOUND) naming every path searched when
    the root has no loadable library.
    """
    droot = root if isinstance(root, DriverRoot) else (
        current_driver_root() if root is None else DriverRoot(Path(root)))
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is not None:
            if _loaded_from is not None and droot.find_library()[0] not in (None, Path(_loaded_from)):
                log.warning("event=nvml-already-loaded path=%s driver_root=%s", _loaded_from, droot.path)
            return
        searched: list[str] = []
        if droot.is_own_root:
            try:
                lib = ctypes.CDLL(NVML_LIBRARY)
            except OSError:
                searched.append(f"{NVML_LIBRARY} (dynamic linker)")
            else:
                _install(lib, NVML_LIBRARY)
                return
        path, tried = droot.find_library(NVML_LIBRARY)
        searched += tried
        if path is None:
            raise _not_found(droot, searched)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise _not_found(droot, searched, f" that loads ({path}: {e})") from e
        _install(lib, str(path))


def _install(lib: ctypes.CDLL, where: str) -> None:
    """Called with ``libLoadLock`` held."""
    global _loaded_from
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    _loaded_from = where
    log.info("event=nvml-loaded path=%s", where)
