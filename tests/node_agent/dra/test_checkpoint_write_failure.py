"""An unwritable DRA checkpoint: a clear per-claim error from prepare (nothing of the claim left applied)
and a clear start-up error, never a traceback. Tests run as root, so read-only is injected (``EROFS``,
``ENOSPC`` from the write) or made real with a state directory whose parent is a regular file."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node_agent.dra.checkpoint import CheckpointError
from node_agent.dra.claims import ClaimRef
from node_agent.host import atomic
from tests.kit.dra_builders import NODE, claim, gpu_config
from tests.node_agent.dra.conftest import Env
from tests.node_agent.dra.test_plugin import put_claim, spec_file

CHECKPOINT = "/var/lib/nvidia-gpu-agent/dra/checkpoint.json"
REPO = Path(__file__).resolve().parents[3]


def _fail_checkpoint_writes(monkeypatch: pytest.MonkeyPatch, code: int, after: int = 0) -> list[int]:
    """Checkpoint writes raise ``OSError(code)`` after ``after`` successful ones (other files unaffected), in
    the host layer's atomic write that ``HostRoot.write_atomic`` goes through."""
    real = atomic.write_atomic
    seen = [0]

    def write(path: Path, data: bytes, mode: int = 0o644) -> None:
        if path.name == "checkpoint.json":
            seen[0] += 1
            if seen[0] > after:
                raise OSError(code, os.strerror(code), str(path))
        real(path, data, mode)

    monkeypatch.setattr(atomic, "write_atomic", write)
    return seen


def _claim_specs(env: Env) -> list[Path]:
    return list((env.root / "var/run/cdi").glob("*claim*.json"))


@pytest.mark.parametrize(("code", "reason"), [(errno.EROFS, "Read-only file system (EROFS)"),
                                              (errno.ENOSPC, "No space left on device (ENOSPC)")])
def test_unwritable_checkpoint_fails_the_claim_and_leaves_no_cdi_spec(env: Env, monkeypatch: pytest.MonkeyPatch,
                                                                     code: int, reason: str) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("ro", "uid-ro", [("gpu", "gpu-0")])))
    _fail_checkpoint_writes(monkeypatch, code)
    out = env.driver.prepare([ref])["uid-ro"]
    assert out.devices == ()
    assert out.error == (f"claim team-a/ro: cannot write the DRA checkpoint {CHECKPOINT}: {reason}; "
                         "the kubelet will retry")
    assert "internal error" not in out.error
    assert not spec_file(env, "uid-ro").exists() and _claim_specs(env) == []
    monkeypatch.undo()  # the disk is writable again: the kubelet's retry succeeds
    assert env.driver.prepare([ref])["uid-ro"].error == ""
    assert spec_file(env, "uid-ro").exists()


def test_failure_after_sharing_was_applied_undoes_it(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("mps", "uid-mps", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", [], {"strategy": "MPS"})])))
    seen = _fail_checkpoint_writes(monkeypatch, errno.EROFS, after=1)  # PrepareStarted written, Completed not
    out = env.driver.prepare([ref])["uid-mps"]
    assert seen[0] >= 2 and CHECKPOINT in out.error and "Read-only file system" in out.error
    assert ("start-mps", "uid-mps", (env.source.snapshot().gpus[0].uuid,), None, {}) in env.sharing.calls
    assert ("stop-mps", "uid-mps") in env.sharing.calls  # rolled back at once
    assert _claim_specs(env) == [] and not (env.root / "run/nvidia-gpu-agent/mps/uid-mps").exists()
    # The journal on disk still says PrepareStarted: the next start rolls it back again, harmlessly.
    monkeypatch.undo()
    data = json.loads((env.root / CHECKPOINT.lstrip("/")).read_text())["data"]["preparedClaims"]
    assert data["uid-mps"]["state"] == "PrepareStarted"
    env.new_driver().start()
    assert json.loads((env.root / CHECKPOINT.lstrip("/")).read_text())["data"]["preparedClaims"] == {}


def test_failing_intent_record_changes_nothing(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("mps2", "uid-mps2", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", [], {"strategy": "MPS"})])))
    env.sharing.calls.clear()
    _fail_checkpoint_writes(monkeypatch, errno.EROFS)
    out = env.driver.prepare([ref])["uid-mps2"]
    assert CHECKPOINT in out.error and env.sharing.calls == [] and _claim_specs(env) == []


def test_unprepare_with_an_unwritable_checkpoint_is_a_clear_error(env: Env, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("un", "uid-un", [("gpu", "gpu-0")])))
    assert env.driver.prepare([ref])["uid-un"].error == ""
    _fail_checkpoint_writes(monkeypatch, errno.EROFS)
    error = env.driver.unprepare([ref])["uid-un"]
    assert CHECKPOINT in error and "Read-only file system" in error and "internal error" not in error
    monkeypatch.undo()
    assert env.driver.unprepare([ref])["uid-un"] == ""  # the retry finishes the job


def test_state_directory_that_cannot_be_created_fails_start_up_clearly(env: Env) -> None:
    (env.root / "var/lib/blocked").parent.mkdir(parents=True, exist_ok=True)
    (env.root / "var/lib/blocked").write_text("a regular file where a directory should be\n")
    driver = env.new_driver(state_dir="/var/lib/blocked/dra")
    with pytest.raises(CheckpointError) as info:
        driver.start()
    assert str(info.value) == ("cannot create the DRA checkpoint directory /var/lib/blocked/dra: "
                               "Not a directory (ENOTDIR)")
    assert env.server.slices() == []  # nothing published by a driver that cannot prepare


def test_read_only_state_directory_fails_start_up_clearly(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    real = atomic.write_atomic

    def write(path: Path, data: bytes, mode: int = 0o644) -> None:
        if "nvidia-gpu-agent/dra" in str(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real(path, data, mode)

    monkeypatch.setattr(atomic, "write_atomic", write)
    with pytest.raises(CheckpointError, match=r"^cannot write in the DRA checkpoint directory "
                                              r"/var/lib/nvidia-gpu-agent/dra: Read-only file system \(EROFS\)$"):
        env.driver.start()


def test_dra_driver_command_exits_with_the_error_not_a_traceback(host_root: Path, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters: [{name: t, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: t, user: {}}]\ncontexts: [{name: t, context: {cluster: t, user: t}}]\n")
    (host_root / "var/lib").mkdir(parents=True)
    (host_root / "var/lib/blocked").write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "node_agent", "--host-root", str(host_root), "--nvml", "simulated:l4x2",
         "--node-name", NODE, "--kubeconfig", str(kubeconfig), "dra-driver", "--state-dir", "/var/lib/blocked/dra",
         "--metrics-port", "0"],
        check=False, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=60)
    output = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 1, output
    assert "cannot create the DRA checkpoint directory /var/lib/blocked/dra: Not a directory" in output
    assert "Traceback" not in output

