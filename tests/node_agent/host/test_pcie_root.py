"""``resource.kubernetes.io/pcieRoot`` from sysfs, resolved as Kubernetes' ``deviceattribute`` package does."""

from __future__ import annotations

from pathlib import Path

from node_agent.host.pci import nvidia_gpus, pcie_root
from node_agent.host.root import HostRoot
from tests.kit.fakehost import PCIE_ROOT, build_fake_host

ADDR = "0000:3b:00.0"


def _bus(root: Path) -> Path:
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True)
    return bus


def test_the_root_complex_is_the_first_directory_under_sys_devices(tmp_path: Path) -> None:
    device = tmp_path / "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"  # behind a root port
    device.mkdir(parents=True)
    (_bus(tmp_path) / ADDR).symlink_to(f"../../../devices/pci0000:3a/0000:3a:00.0/{ADDR}")
    assert pcie_root(HostRoot(tmp_path), "00000000:3B:00.0") == "pci0000:3a"  # NVML's spelling of the address


def test_no_link_or_a_link_elsewhere_gives_no_root(tmp_path: Path) -> None:
    bus = _bus(tmp_path)
    (bus / ADDR).mkdir()  # a plain directory (a host tree without the kernel's links)
    assert pcie_root(HostRoot(tmp_path), ADDR) is None
    (bus / "0000:3c:00.0").symlink_to("../../../devices/virtual/0000:3c:00.0")  # not under a root complex
    assert pcie_root(HostRoot(tmp_path), "0000:3c:00.0") is None
    (bus / "0000:3d:00.0").symlink_to("../../../devices/pci0000:3a/0000:3a:00.0/0000:3e:00.0")  # another device
    assert pcie_root(HostRoot(tmp_path), "0000:3d:00.0") is None
    assert pcie_root(HostRoot(tmp_path), "0000:99:00.0") is None  # absent


def test_a_fake_hosts_gpus_sit_under_their_root_complex(tmp_path: Path) -> None:
    """The kit lays PCI out as the kernel does (what the side-by-side machines share), so the agent reads the
    same root from a fake host as from a node; the NIC there too."""
    host = HostRoot(build_fake_host(tmp_path, "dgx-h100").root)
    gpus = nvidia_gpus(host)
    assert len(gpus) == 8 and {pcie_root(host, g.address) for g in gpus} == {PCIE_ROOT}
    assert gpus[0].driver == "nvidia" and gpus[0].iommu_group == 10 and gpus[0].numa_node == 0
    assert pcie_root(host, "0000:00:1f.6") == PCIE_ROOT
