"""NVIDIA's DRA kubelet plugin and ours publish the same devices and prepare a claim alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import ControlPlane
from tests.compare import dra
from tests.compare.peers import MACHINES, Machine, machine, unlisted
from tests.kit.kubelet.common import short_root
from tests.kit.tools import required_bin

pytestmark = pytest.mark.compare


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(directory=tmp_path_factory.mktemp("cluster"), bin_dir=required_bin())
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module", params=sorted(MACHINES))
def host(request: pytest.FixtureRequest) -> Iterator[Machine]:
    # A short root: our plugin's sockets live under its --host-root.
    with short_root("nvc-") as root:
        yield machine(request.param, root)


@pytest.mark.parametrize("case", dra.CASES, ids=[c.name for c in dra.CASES])
def test_slices_and_prepare_match_nvidias_plugin(host: Machine, cluster: ControlPlane, case: dra.Case,
                                                 tmp_path: Path) -> None:
    seen = dra.compare(host, case, cluster.admin(), cluster.kubeconfig, tmp_path)
    assert seen["nvidia"]["slices"] != "0" and any(k.startswith("cdi.") for k in seen["nvidia"]), (
        "NVIDIA's plugin published or prepared nothing: the comparison would prove nothing")
    new = unlisted(dra.differences(f"{host.name}/{case.name}", seen["ours"], seen["nvidia"]))
    assert not new, "differences docs/compatibility.md does not list:\n" + "\n".join(d.row() for d in new)
