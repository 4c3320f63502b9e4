"""Fake host roots for the tests: the agent's simulated node (``nvml_sim.host``) with the
options that make the bad nodes the tests need, and a handle on the tree.

The tree matches a simulated machine (same bus IDs, minors, driver version) and carries the simulated
host's stand-in tools (``nvidia-smi`` backed by the same state file; ``modprobe``, ``kubectl`` and
``systemctl`` that record their calls), so the bash scripts and the agent can be run against the same
host and must agree. Options produce the bad nodes: no GPU, old driver, missing modules, no IOMMU,
containerd 1.x or 2.x layouts, Deckhouse-managed or plain containerd. Tests default to a Deckhouse node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from node_agent.host import HostRoot
from nvml_sim import SimulatedMachine
from nvml_sim.host import (
    CONTAINERD_V1_CONFIG,
    CONTAINERD_V2_CONFIG,
    DEFAULT_MODULES,
    GPU_CLASS,
    IOMMU_GROUPS,
    NVIDIA_VENDOR,
    PCI_DEVICES,
    PCI_DRIVERS,
    PCIE_ROOT,
    SYS_DEVICES,
    driver_version_text,
    lay_out,
    pci_config_space,
    pci_device,
    set_driver,
    sim_state_file,
)

__all__ = ["CONTAINERD_V1_CONFIG", "CONTAINERD_V2_CONFIG", "DEFAULT_MODULES", "GPU_CLASS", "IOMMU_GROUPS",
           "NVIDIA_VENDOR", "PCIE_ROOT", "PCI_DEVICES", "PCI_DRIVERS", "SYS_DEVICES", "FakeHost", "build_fake_host",
           "driver_version_text", "pci_config_space", "pci_device", "set_driver", "sim_state_file"]


@dataclass
class FakeHost:
    """A host root in a directory: host-absolute paths map under ``root``; ``machine`` is the simulated
    machine the tree was built for (:func:`build_fake_host`), if any.

    It is also the device plugin's ``HostFiles`` (``read_text_or_none`` ... ``remove``), each call handed
    to a :class:`~node_agent.host.HostRoot` over the tree (:attr:`host`): the one the agent passes, so the
    plugin tests read, refuse and write exactly as the agent would.
    """

    root: Path
    machine: SimulatedMachine | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def bin_dir(self) -> Path:
        """Where the fake tools live (first on :meth:`env`'s ``PATH``)."""
        return self.root / "usr/bin"

    @property
    def nvml_spec(self) -> str:
        return f"simulated:{self.machine.spec.name}" if self.machine else "simulated:t4x1"

    def env(self, **more: str) -> dict[str, str]:
        """Environment for running the bash scripts against this root."""
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}:{self.root / 'usr/sbin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env["NVIDIA_GPU_ROOT"] = str(self.root)
        env["NODE_NAME"] = "gpu-node-1"
        env.update(more)
        return env

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def snapshot(self, host_dir: str = "/etc") -> dict[str, bytes]:
        """Every file under a host dir, by relative path (for byte-for-byte comparisons)."""
        base = self.path(host_dir)
        out: dict[str, bytes] = {}
        for p in sorted(base.rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(base))] = p.read_bytes()
        return out

    def log(self, tool: str) -> list[str]:
        p = self.path(f"/var/log/simulated-{tool}.log")
        return p.read_text().splitlines() if p.exists() else []

    def put(self, host_path: str, text: str) -> None:
        """Write a file of the tree (parents created): how a test lays out what the node has."""
        _write(self.root, host_path, text)

    # -- the device plugin's HostFiles --
    @cached_property
    def host(self) -> HostRoot:
        """The agent's host layer over this tree."""
        return HostRoot(self.root)

    def read_text_or_none(self, host_path: str) -> str | None:
        return self.host.read_text_or_none(host_path)

    def exists(self, host_path: str) -> bool:
        return self.host.exists(host_path)

    def write_atomic(self, host_path: str, data: str) -> bool:
        return self.host.write_atomic(host_path, data)

    def remove(self, host_path: str) -> bool:
        return self.host.remove(host_path)


def build_fake_host(root: Path, machine: str | None = "dgx-h100", *, deckhouse: bool = True,
                    **options: Any) -> FakeHost:
    """:func:`nvml_sim.host.lay_out` (its options: ``containerd``, ``driver_loaded``, ``modules``...)
    with the tests' default, a Deckhouse node."""
    return FakeHost(root, lay_out(root, machine, deckhouse=deckhouse, **options))


def _write(root: Path, host_path: str, text: str, mode: int = 0o644) -> None:
    p = root / host_path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    p.chmod(mode)
