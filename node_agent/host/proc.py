"""Driver facts the kernel publishes under /proc: driver version, loaded modules, GPU minors, MIG capability minors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from node_agent.host.root import HostError, HostRoot
from nvgpu.nodescripts.facts import (
    DRIVER_VERSION_FILE,
    NVIDIA_GPUS_PROC_DIR,
    PROC_DEVICES,
    PROC_MODULES,
    SYS_MODULE_DIR,
)

# The caps nodes' minors: a fact of node setup (gpu-devices.sh reads it too), re-exported for the host layer.
from nvgpu.nodescripts.facts import MIG_MINORS_PATH as MIG_MINORS_PATH  # noqa: PLC0414

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build  (...)"
DRIVER_VERSION_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")


class DriverVersionError(HostError):
    """The driver version file is absent (``missing``) or not in a known format."""

    def __init__(self, message: str, missing: bool) -> None:
        super().__init__(message, DRIVER_VERSION_FILE)
        self.missing = missing


def read_driver_version(host: HostRoot) -> str:
    text = host.read_text_or_none(DRIVER_VERSION_FILE)
    if text is None:
        raise DriverVersionError(f"{DRIVER_VERSION_FILE} is missing: the NVIDIA kernel driver is not loaded",
                                 missing=True)
    m = DRIVER_VERSION_RE.search(text + " ")
    if not m:
        first = text.strip().splitlines()[0] if text.strip() else "(empty)"
        raise DriverVersionError(
            f"{DRIVER_VERSION_FILE}: cannot find a driver version in {first!r} "
            "(expected 'NVRM version: ... Kernel Module  MAJOR.MINOR[.PATCH]  ...')",
            missing=False,
        )
    return m.group(1)


def loaded_modules(host: HostRoot) -> frozenset[str]:
    """The loaded kernel modules: ``/proc/modules``; on a kernel built without loadable-module support
    (``CONFIG_MODULES=n``: there is no ``/proc/modules`` at all, as on some VM kernels) the modules
    ``/sys/module`` lists as live (``initstate``, what kmod's ``modprobe`` reads). An unreadable
    ``/proc/modules`` is an error, not an empty list."""
    if not host.exists(PROC_MODULES):
        live = []
        for name in host.listdir(SYS_MODULE_DIR):
            state = host.read_text_or_none(f"{SYS_MODULE_DIR}/{name}/initstate")
            if state is not None and state.strip() == "live":
                live.append(name)
        return frozenset(live)
    text = host.read_text(PROC_MODULES)
    return frozenset(line.split()[0] for line in text.splitlines() if line.strip())


def gpu_minors(host: HostRoot) -> dict[str, int]:
    """Bus ID (``0000:07:00.0``) → device minor, from ``/proc/driver/nvidia/gpus/*/information``."""
    out: dict[str, int] = {}
    for bus in host.listdir(NVIDIA_GPUS_PROC_DIR):
        text = host.read_text_or_none(f"{NVIDIA_GPUS_PROC_DIR}/{bus}/information") or ""
        m = re.search(r"^Device Minor:\s*(\d+)", text, re.MULTILINE)
        if m:
            out[bus.lower()] = int(m.group(1))
    return out


_DEVICE_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s*$")


def parse_proc_devices(text: str) -> dict[str, int]:
    """Name -> major of the character devices in ``/proc/devices`` (fs/proc/devices.c: a ``Character devices:``
    section of ``%3d %s`` lines, a blank line, then ``Block devices:``, which is left out)."""
    out: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        if line.endswith(":") and not line[:1].isspace() and not line[:1].isdigit():
            section = line
            continue
        m = _DEVICE_LINE.match(line)
        if m and section == "Character devices:":
            out.setdefault(m.group(2), int(m.group(1)))
    return out


def char_majors(host: HostRoot) -> dict[str, int]:
    """The character-device majors the kernel has published (``/proc/devices``; none when it cannot be read)."""
    return parse_proc_devices(host.read_text_or_none(PROC_DEVICES) or "")


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class _Paths(Protocol):
    def path(self, host_path: str) -> Path: ...


def boot_id(host: _Paths) -> str:
    """The kernel's boot ID, "" when it cannot be read. State written in another boot (the MIG journal, the
    DRA checkpoint) describes GPUs as they were before a reboot and is not trusted."""
    try:
        return host.path(BOOT_ID_PATH).read_text().strip()
    except OSError:
        return ""


def parse_mig_minors(text: str) -> dict[str, int]:
    """``gpu0/gi1/access 12`` lines → ``{"gpu0/gi1/access": 12}`` (also ``config`` and ``monitor``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out
