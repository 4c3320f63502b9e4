"""A host root laid out to match what NVIDIA's mock NVML reports (the mock models no host of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def probe_mock(mock_bin: Path, machine: str, root: Path) -> dict[str, Any]:
    """The mock machine's inventory (``test_mock_nvml.probe_main``'s ``nvml`` probe), in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "MOCK_NVML_MACHINE")}
    env.update(PYTHONPATH=str(REPO), LD_LIBRARY_PATH=str(mock_bin), MOCK_NVML_MACHINE=machine)
    code = "from tests.nvml_mock.test_mock_nvml import probe_main; probe_main()"
    done = subprocess.run([sys.executable, "-c", code, str(root), "real", "nvml"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def mock_host(root: Path, probe: dict[str, Any]) -> None:
    """A host whose PCI bus, /proc and /dev match what the mock's NVML reports (the mock models no host).

    The host-side facts the mock has no model of stay absent: no NUMA node files, no DMI product.
    """
    from node_agent.host.pci import normalize_address
    from node_agent.testing.fakehost import DEFAULT_MODULES, build_fake_host, driver_version_text

    build_fake_host(root, None)  # the machine-independent parts: another PCI device, containerd, sysctl

    def write(path: str, text: str) -> None:
        p = root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    for g in probe["gpus"]:
        addr = normalize_address(g["pci_bus_id"])
        base = f"/sys/bus/pci/devices/{addr}"
        write(f"{base}/vendor", "0x10de\n")
        write(f"{base}/device", f"0x{g['pci_device_id']:04x}\n")
        write(f"{base}/class", "0x030200\n")
        (root / base.lstrip("/") / "driver").symlink_to("../../drivers/nvidia")
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
