"""NVIDIA's mig-parted and our MIG manager apply and judge NVIDIA's shipped MIG configs alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compare import migparted
from tests.compare.peers import MACHINES, Machine, machine, unlisted

pytestmark = pytest.mark.compare


@pytest.fixture(scope="module", params=sorted(MACHINES))
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Machine:
    return machine(request.param, tmp_path_factory.mktemp(request.param))


#: Every standard config (10+) applied and asserted by both programs: about 80 s on an idle 2-core machine,
#: past the default 120 s when the machine is busy.
@pytest.mark.timeout(360)
def test_each_config_is_applied_and_asserted_as_nvidias_mig_parted_does(host: Machine, tmp_path: Path) -> None:
    names = migparted.test_configs(host)
    assert len(names) >= 10, f"only {names} apply to {host.name}: the comparison would prove little"
    new, applied = [], []
    for name in names:
        differences, _, nvidia_verdict = migparted.compare(host, name, tmp_path)
        applied += [name] if nvidia_verdict == "applied" else []
        new += unlisted(differences)
    assert len(applied) >= 8, f"NVIDIA's mig-parted applied only {applied}: the layouts compared would prove little"
    assert not new, "differences docs/compatibility.md does not list:\n" + "\n".join(d.row() for d in new)
