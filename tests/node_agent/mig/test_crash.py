"""Crash the manager at every step of a reconfiguration; a restarted manager must finish the job.

A "crash" is a BaseException raised inside a journal write, a Node patch or an NVML call, before the
operation lands — what a SIGKILL or an OOM kill does. The test enumerates every such point of a full
reconfiguration (mode change plus layout on a two-GPU A100, which needs a reset), restarts a fresh
manager over the same host, Node and GPUs, and checks the end state: the layout applied, the node back
in service, nothing paused or tainted, the journal gone.
"""

from __future__ import annotations

import pytest

from node_agent.mig.executor import DEPLOY_LABELS, RECONFIGURE_TAINT
from nvgpu import labels
from tests.node_agent.mig.fakes import Crash, FakeBackend
from tests.node_agent.mig.harness import Rig, mig_node

CONFIG = "all-balanced"
LAYOUT = {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}


def rig() -> Rig:
    r = mig_node(Rig(FakeBackend.of("A100-40GB", count=2)), CONFIG)
    r.node.labels[labels.GPU_DEPLOY_PREFIX + "device-plugin"] = "true"
    return r


def _count() -> tuple[int, int, dict[str, int]]:
    r = rig()
    r.converge()
    return r.files.writes, r.node.patches, dict(r.backend.calls)


WRITES, PATCHES, NVML_CALLS = _count()
POINTS = (
    [("journal-write", n) for n in range(1, WRITES + 1)]
    + [("node-patch", n) for n in range(1, PATCHES + 1)]
    + [(op, n) for op, total in NVML_CALLS.items() for n in sorted({1, 2, total // 2 or 1, total}) if n <= total]
)


def _check_done(r: Rig) -> None:
    assert [r.backend.layout(i) for i in range(2)] == [LAYOUT, LAYOUT]
    assert r.node.labels[labels.MIG_CONFIG_STATE] == "success"
    assert r.node.labels[labels.GPU_DEPLOY_PREFIX + "device-plugin"] == "true"
    assert all(r.node.labels.get(k) != labels.PAUSED_FOR_MIG_CHANGE for k in DEPLOY_LABELS)
    assert RECONFIGURE_TAINT not in r.node.taints
    assert not r.node.unschedulable and not r.node.annotations
    assert r.journal.load() is None


def test_the_flow_has_the_expected_steps() -> None:
    assert WRITES >= 8 and PATCHES >= 4
    assert NVML_CALLS == {"set_mig_mode": 2, "reset_gpus": 1, "destroy_all_instances": 2, "create_instance": 8}


@pytest.mark.parametrize(("where", "n"), POINTS, ids=[f"{w}-{n}" for w, n in POINTS])
def test_crash_then_restart_finishes(where: str, n: int) -> None:
    r = rig()
    if where == "journal-write":
        r.files.crash_on_write = n
    elif where == "node-patch":
        r.node.crash_on_patch = n
    else:
        r.backend.crash_on = {where: n}
    with pytest.raises(Crash):
        r.converge()
    r.files.crash_on_write = 0
    r.node.crash_on_patch = 0
    r.backend.crash_on = {}
    r.converge()
    _check_done(r)


def test_a_step_that_keeps_crashing_is_rolled_back() -> None:
    r = rig()
    r.backend.crash_on = {"create_instance": 1}
    for _ in range(2):  # two managers die in the same step
        with pytest.raises(Crash):
            r.converge()
        r.backend.calls.pop("create_instance")
    r.backend.crash_on = {}
    r.converge()
    assert [r.backend.mig_mode(i) for i in range(2)] == [(False, False)] * 2  # back to where it started
    assert [r.backend.layout(i) for i in range(2)] == [{}, {}]
    assert r.node.labels[labels.MIG_CONFIG_STATE] == "failed"
    assert "interrupted 2 times" in r.node.events[-1][1]
    assert RECONFIGURE_TAINT not in r.node.taints
