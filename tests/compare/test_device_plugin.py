"""NVIDIA's device plugin and ours show the kubelet the same thing on the same mock machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compare import deviceplugin as dp
from tests.compare.peers import MACHINES, Machine, machine, unlisted, with_mig

pytestmark = pytest.mark.compare


@pytest.fixture(scope="module", params=sorted(MACHINES))
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Machine:
    return machine(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("case", dp.CASES, ids=[c.name for c in dp.CASES])
def test_kubelet_sees_what_nvidias_plugin_shows(host: Machine, case: dp.Case, tmp_path: Path) -> None:
    ours, theirs = dp.ours(host, case, tmp_path), dp.nvidia(host, case, tmp_path)
    assert theirs.devices and theirs.allocate.get("envs"), "NVIDIA's plugin showed nothing to compare"
    new = unlisted(dp.differences(host, case, ours, theirs))
    assert not new, "differences docs/compatibility.md does not list:\n" + "\n".join(d.row() for d in new)


@pytest.mark.parametrize("name", sorted(MACHINES))
@pytest.mark.parametrize("case", dp.MIG_CASES, ids=[c.name for c in dp.MIG_CASES])
def test_kubelet_sees_the_same_mig_devices(name: str, case: dp.Case, tmp_path: Path) -> None:
    """On a MIG layout NVIDIA's mig-parted applied: the MIG resources, their device IDs and the Allocate
    response (the MIG device and its capability nodes) for each MIG strategy."""
    m = with_mig(machine(name, tmp_path / "machine"), str(case.mig_config), tmp_path / "mig-state.json")
    ours, theirs = dp.ours(m, case, tmp_path), dp.nvidia(m, case, tmp_path)
    assert theirs.devices and theirs.allocate.get("envs"), "NVIDIA's plugin showed nothing to compare"
    new = unlisted(dp.differences(m, case, ours, theirs))
    assert not new, "differences docs/compatibility.md does not list:\n" + "\n".join(d.row() for d in new)
