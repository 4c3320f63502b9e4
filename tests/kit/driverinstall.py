"""The driver layout of :mod:`localcluster.driverinstall`, with the simulated ``nvidia-smi`` the tests use:
``nvml_sim.smi`` over the installed NVML library, run by this interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import node_agent
from localcluster.driverinstall import (
    BINARIES,
    FIRMWARE,
    LIB_DIRS,
    LIBRARIES,
    InstalledDriver,
    Layout,
    shared_object,
)
from localcluster.driverinstall import install_driver as _install

__all__ = ["BINARIES", "FIRMWARE", "LIBRARIES", "LIB_DIRS", "InstalledDriver", "Layout", "install_driver",
           "shared_object", "sim_smi_script"]


def sim_smi_script(root: Path) -> str:
    """``nvidia-smi`` as ``nvml_sim.smi`` over the NVML library installed under ``root``."""
    repo = Path(node_agent.__file__).resolve().parent.parent
    return (f'#!/bin/sh\nPYTHONPATH="{repo}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
            f'-m nvml_sim.smi --driver-root "{root}" "$@"\n')


def install_driver(root: Path, version: str, *, layout: Layout = "debian", nvml_library: Path | None = None,
                   leftover: str | None = None, nvidia_smi: str | None = None) -> InstalledDriver:
    """:func:`localcluster.driverinstall.install_driver`; with ``nvml_library`` and no ``nvidia_smi``, the
    simulated ``nvidia-smi`` over it."""
    if nvidia_smi is None and nvml_library is not None:
        nvidia_smi = sim_smi_script(root)
    return _install(root, version, layout=layout, nvml_library=nvml_library, leftover=leftover,
                    nvidia_smi=nvidia_smi)
