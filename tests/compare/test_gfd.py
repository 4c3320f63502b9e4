"""NVIDIA's GPU feature discovery and our labeller give the same labels on the same mock machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.host.pci import normalize_address
from tests.compare import gfd
from tests.compare.peers import MACHINES, Machine, label_differences, machine, unlisted, with_mig
from tests.kit.fakehost import PCI_DEVICES, pci_config_space

pytestmark = pytest.mark.compare


@pytest.fixture(scope="module", params=sorted(MACHINES))
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Machine:
    return machine(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("strategy", gfd.STRATEGIES)
@pytest.mark.parametrize("case", gfd.CASES, ids=[c.name for c in gfd.CASES])
def test_labels_match_nvidias_gfd(host: Machine, case: gfd.Case, strategy: str, tmp_path: Path) -> None:
    differences, written = gfd.compare(host, case, strategy, tmp_path)
    assert written > 10, "NVIDIA's GFD wrote (almost) no labels: the comparison would prove nothing"
    new = unlisted(differences)
    assert not new, "differences docs/compatibility.md does not list:\n" + "\n".join(d.row() for d in new)


#: A vGPU guest's host driver, as the hypervisor's vGPU manager writes it into the vendor capability.
HOST_DRIVER = ("550.90.05", "r550_00")


@pytest.mark.parametrize("config_space", ["vgpu-guest", "unreadable"])
def test_vgpu_labels_match_nvidias_gfd(config_space: str, tmp_path: Path) -> None:
    """GPU 0's PCI config space as a vGPU guest has it (both publish the host driver), or cut to the 64 bytes
    an unprivileged reader gets (both leave every ``vgpu.*`` label out)."""
    m = machine("dgxh100", tmp_path / "machine")
    gpu = m.inventory["gpus"][0]
    config = m.root / PCI_DEVICES.lstrip("/") / normalize_address(gpu["pci_bus_id"]) / "config"
    if config_space == "vgpu-guest":
        config.write_bytes(pci_config_space(int(gpu["pci_device_id"]), vgpu_host_driver=HOST_DRIVER))
    else:
        config.write_bytes(config.read_bytes()[:64])
    theirs = gfd.nvidia_labels(m, gfd.CASES[0], "none", tmp_path / "gfd")
    ours = gfd.our_labels(m, gfd.CASES[0], "none")
    vgpu = {k: v for k, v in theirs.items() if k.startswith("nvidia.com/vgpu.")}
    assert vgpu == ({"nvidia.com/vgpu.present": "true", "nvidia.com/vgpu.host-driver-version": HOST_DRIVER[0],
                     "nvidia.com/vgpu.host-driver-branch": HOST_DRIVER[1]} if config_space == "vgpu-guest" else {})
    new = unlisted(label_differences("gfd", f"{m.name}/{config_space}/none", ours, theirs))
    assert not new, "differences docs/compatibility.md does not list:\n" + "\n".join(d.row() for d in new)


#: A uniform layout (what ``single`` expects) and NVIDIA's balanced one, under each strategy.
MIG_CASES = [("all-1g", "single"), ("all-1g", "mixed"), ("all-balanced", "mixed"), ("all-balanced", "single"),
             ("all-balanced", "none")]


@pytest.mark.parametrize("name", sorted(MACHINES))
@pytest.mark.parametrize(("layout", "strategy"), MIG_CASES, ids=[f"{a}-{b}" for a, b in MIG_CASES])
def test_mig_labels_match_nvidias_gfd(name: str, layout: str, strategy: str, tmp_path: Path) -> None:
    """With a MIG layout NVIDIA's mig-parted applied (the mock keeps it for the next program): the
    per-profile labels, the ``single`` overrides and ``-MIG-INVALID`` for a mixed layout under ``single``."""
    m = with_mig(machine(name, tmp_path / "machine"), layout, tmp_path / "mig-state.json")
    differences, written = gfd.compare(m, gfd.CASES[0], strategy, tmp_path)
    assert written > 10, "NVIDIA's GFD wrote (almost) no labels: the comparison would prove nothing"
    new = unlisted(differences)
    assert not new, "differences docs/compatibility.md does not list:\n" + "\n".join(d.row() for d in new)
