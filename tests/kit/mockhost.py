"""A host root laid out to match what NVIDIA's mock NVML reports (the mock models no host of its own).

Shared by the mock-NVML comparisons (``tests/compare/test_mock_nvml.py``), the side-by-side machines
(``tests/compare``) and the dev-node containers (``tests/cluster``); the machine's inventory comes from the mock
itself, through the ``nvml`` probe of that module run in a subprocess (the mock is loaded per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from node_agent.host.pci import normalize_address
from tests.kit.fakehost import (
    DEFAULT_MODULES,
    GPU_CLASS,
    NVIDIA_VENDOR,
    build_fake_host,
    driver_version_text,
    pci_config_space,
    pci_device,
)

REPO = Path(__file__).resolve().parents[2]


def mock_env(mock_bin: Path, machine: str, **extra: str) -> dict[str, str]:
    """A process environment that loads the mock from ``mock_bin`` as ``machine`` (and finds this repo)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "MOCK_NVML_MACHINE")}
    env.update(PYTHONPATH=str(REPO), LD_LIBRARY_PATH=str(mock_bin), MOCK_NVML_MACHINE=machine, **extra)
    return env


def probe_mock(mock_bin: Path, machine: str, root: Path) -> dict[str, Any]:
    """The mock machine's inventory (``test_mock_nvml.probe_main``'s ``nvml`` probe), in a subprocess."""
    env = mock_env(mock_bin, machine)
    code = "from tests.compare.test_mock_nvml import probe_main; probe_main()"
    done = subprocess.run([sys.executable, "-c", code, str(root), "real", "nvml"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _bars(i: int) -> str:
    """``resource`` as sysfs writes it (start, end, flags per region): a data-center GPU's 16 MiB BAR0, its
    large prefetchable 64-bit BAR1 and 32 MiB BAR3, the other regions unused; each GPU at its own addresses."""
    bar0 = 0xE000_0000 + i * 0x0100_0000
    bar1 = 0x200_0000_0000 + i * 0x40_0000_0000
    regions = [(bar0, bar0 + 0xFF_FFFF, 0x40200), (bar1, bar1 + 0x1F_FFFF_FFFF, 0x14220C), (0, 0, 0),
               (bar1 + 0x20_0000_0000, bar1 + 0x20_01FF_FFFF, 0x14220C)] + [(0, 0, 0)] * 9
    return "".join(f"0x{a:016x} 0x{b:016x} 0x{f:016x}\n" for a, b, f in regions)


def mock_host(root: Path, probe: dict[str, Any]) -> None:
    """A host whose PCI bus, /proc and /dev match what the mock's NVML reports (the mock models no host).

    Each GPU's PCI directory (under its root complex, as the fake hosts lay PCI out) has what sysfs always
    has: ``numa_node`` (``-1``: the mock models no NUMA placement, so none is claimed) and a 256-byte
    ``config`` space with the IDs and class and no capability list (so no vendor capability: not a vGPU).
    No DMI product: the mock has no model of one.
    """
    host = build_fake_host(root, None)  # the machine-independent parts: another PCI device, containerd, sysctl
    write = host.put
    for i, g in enumerate(probe["gpus"]):
        addr = normalize_address(g["pci_bus_id"])
        device_id = int(g["pci_device_id"])
        sysfs = pci_device(root, addr, vendor=NVIDIA_VENDOR, device=device_id, pci_class=GPU_CLASS, driver="nvidia",
                           numa_node=-1, config=pci_config_space(device_id))
        (sysfs / "resource").write_text(_bars(i))
        write(f"/proc/driver/nvidia/gpus/{addr}/information",
              f"Model: \t\t {g['name']}\nGPU UUID: \t {g['uuid']}\nBus Location: \t {addr}\n"
              f"Device Minor: \t {g['minor']}\n")
        write(f"/dev/nvidia{g['minor']}", "")
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        write(f"/dev/{node}", "")
    write("/proc/driver/nvidia/version", driver_version_text(probe["driver"][0]))
    write("/proc/modules", "".join(f"{m} 1234567 0 - Live 0x0000000000000000\n" for m in DEFAULT_MODULES))
    for m in DEFAULT_MODULES:
        (root / "sys/module" / m).mkdir(parents=True, exist_ok=True)
