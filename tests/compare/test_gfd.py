"""NVIDIA's GPU feature discovery and our labeller give the same labels on the same mock machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compare import gfd
from tests.compare.peers import MACHINES, Machine, machine, unlisted

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
