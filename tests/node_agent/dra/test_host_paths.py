"""The DRA driver resolves every host path through the agent's ``HostRoot``, which refuses ``..``: a claim
UID that would take its MPS directories out of the host root fails the claim, and a directory read back
from the checkpoint that climbs out is reported by the undo, with nothing created or removed outside the
root. (The claim's CDI spec name cannot climb: ``/`` in a UID becomes ``_``.)"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from node_agent.dra.checkpoint import AppliedSharing, CheckpointStore, ClaimState, PreparedClaim, PreparedDevice
from node_agent.dra.claims import ClaimRef
from node_agent.host import HostRoot
from tests.kit.dra_builders import claim, gpu_config
from tests.node_agent.dra.conftest import Env
from tests.node_agent.dra.test_plugin import checkpoint, put_claim

CHECKPOINT = "/var/lib/nvidia-gpu-agent/dra/checkpoint.json"


def _escaped(root: Path, name: str) -> list[Path]:
    """Anything called ``name`` (or ``name.json``) from the host root's parent up to ``/``."""
    return [p / n for p in root.resolve().parents for n in (name, f"{name}.json") if (p / n).exists()]


def test_a_claim_uid_climbing_out_of_the_root_gets_no_mps_directories(env: Env) -> None:
    env.driver.start()
    name = f"escape-{uuid.uuid4().hex[:8]}"
    uid = "../../../../" + name  # /run/nvidia-gpu-agent/mps/<uid> would be the root's sibling
    ref = ClaimRef(*put_claim(env, claim("mps-up", uid, [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", [], {"strategy": "MPS"})])))
    out = env.driver.prepare([ref])[uid]
    assert "may not contain '..'" in out.error and "internal error" not in out.error
    assert _escaped(env.root, name) == []
    # Rolled back: what was changed is undone (no daemon was started in a directory the root refuses).
    assert ("compute-mode", env.source.snapshot().gpus[0].uuid, "DEFAULT") in env.sharing.calls
    assert uid not in checkpoint(env)


def test_an_escaping_mps_directory_in_the_checkpoint_is_reported_not_removed(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.driver.start()
    outside = env.root.resolve().parent / f"outside-{uuid.uuid4().hex[:8]}"
    (outside / "pipe").mkdir(parents=True)
    (outside / "pipe/keep").write_text("not the driver's\n")
    try:
        store = CheckpointStore(HostRoot(env.root), CHECKPOINT)
        data = store.load().data  # a journal with a valid checksum naming a directory above the root
        data.prepared_claims["uid-odd"] = PreparedClaim(
            state=ClaimState.PREPARE_COMPLETED, namespace="team-a", name="odd",
            devices=[PreparedDevice(device="gpu-0")],
            sharing=[AppliedSharing(strategy="MPS",
                                    mps_directory=f"/run/nvidia-gpu-agent/mps/../../../{outside.name}")])
        store.save(data)
        with caplog.at_level(logging.WARNING):
            assert env.driver.unprepare([ClaimRef("team-a", "odd", "uid-odd")])["uid-odd"] == ""  # finishes
        assert any("event=sharing-undo-failed claim_uid=uid-odd problem=remove the MPS directories: host path"
                   in r.getMessage() and "may not contain '..'" in r.getMessage() for r in caplog.records)
        assert (outside / "pipe/keep").read_text() == "not the driver's\n"
        assert "uid-odd" not in checkpoint(env)
    finally:
        for p in sorted(outside.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        outside.rmdir()
