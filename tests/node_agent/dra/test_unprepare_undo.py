"""Unprepare succeeds only once the host is really back as it was, and the checkpoint never loses what undo needs.

Faults are injected where a real node has them: ``nvidia-smi`` and ``nvidia-cuda-mps-control`` exiting non-zero
through the host root's exec seam (``RecordingExec`` under the production ``NvidiaSmiSharing``), the recording
backend told to fail, the checkpoint damaged or deleted on disk, and a crash (an exception nothing catches)
between applying sharing and writing the claim's CDI spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node_agent.dra import cdi
from node_agent.dra.claims import ClaimRef
from node_agent.dra.driver import DraDriver
from node_agent.host import CommandResult, HostRoot, atomic
from node_agent.kubelet.dra.server import PluginServer
from tests.kit.dra_builders import DRIVER, claim, gpu_config
from tests.kit.kubelet.dra import DraKubelet
from tests.kit.recording_exec import Call
from tests.node_agent.dra.conftest import Env, Node
from tests.node_agent.dra.test_plugin import put_claim, spec_file

STATE = "var/lib/nvidia-gpu-agent/dra"
MPS = {"strategy": "MPS"}
TIME_SLICING = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}


def _journal(root: Path) -> dict[str, Any]:
    claims = json.loads((root / STATE / "checkpoint.json").read_text())["data"]["preparedClaims"]
    assert isinstance(claims, dict)
    return claims


def _unprepares(driver: DraDriver, result: str) -> float:
    value = driver.metrics.registry.get_sample_value("nvidia_gpu_dra_plugin_unprepares_total",
                                                     {"driver": DRIVER, "result": result})
    return value or 0.0


def _mps_dir(root: Path, uid: str) -> Path:
    return root / "run/nvidia-gpu-agent/mps" / uid


def _damage(root: Path) -> None:
    path = root / STATE / "checkpoint.json"
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")


def _failing(code: int, stderr: str, when: Any) -> tuple[list[bool], Any]:
    """A responder that exits ``code`` for calls ``when(call)`` accepts while ``broken[0]``."""
    broken = [True]

    def answer(call: Call) -> CommandResult | None:
        return CommandResult(call.argv, code, "", stderr) if broken[0] and when(call) else None

    return broken, answer


# -- a failed undo is an error, the claim stays recorded, the retry finishes -----------------------------------


def test_failed_compute_mode_restore_fails_unprepare_until_it_works(node: Node,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    ref = node.put(claim("mps", "uid-mps", [("gpu", "gpu-1")], configs=[gpu_config("FromClaim", ["gpu"], MPS)]))
    assert node.driver.prepare([ref])["uid-mps"].error == ""
    u1 = node.uuids[1]
    broken, answer = _failing(3, "Unable to set the compute mode",
                              lambda c: c.argv[-2:] == ("-c", "DEFAULT"))
    node.exec.on("nvidia-smi", answer)
    node.exec.calls.clear()
    with caplog.at_level("WARNING"):
        error = node.driver.unprepare([ref])["uid-mps"]
    assert f"reset compute mode of {u1}" in error and "exit 3" in error and "Unable to set the compute mode" in error
    assert "the kubelet will retry" in error and "internal error" not in error
    assert "event=unprepare-failed claim=team-a/mps uid=uid-mps" in caplog.text
    # Still recorded, with only what is left to undo: the daemon was stopped, the GPU is still exclusive;
    # no longer handed out as prepared (its CDI spec is gone, a prepare of it would roll it back first).
    record = _journal(node.root)["uid-mps"]
    assert record["state"] == "PrepareStarted" and record["sharing"][0]["computeModeChanged"] == [u1]
    assert not record["sharing"][0]["mpsDirectory"] and not _mps_dir(node.root, "uid-mps").exists()
    assert not spec_file_of(node.root, "uid-mps").exists()
    assert _unprepares(node.driver, "error") == 1 and _unprepares(node.driver, "ok") == 0
    # The next tenant of the GPU is refused while it is still EXCLUSIVE_PROCESS.
    other = node.put(claim("next", "uid-next", [("gpu", "gpu-1")]))
    assert "already prepared for claim team-a/mps" in node.driver.prepare([other])["uid-next"].error
    # A retry that still fails tries only what is left (the daemon is not asked to quit twice).
    node.exec.calls.clear()
    assert "exit 3" in node.driver.unprepare([ref])["uid-mps"]
    assert node.exec.argvs == [["nvidia-smi", "-i", u1, "-c", "DEFAULT"]]
    broken[0] = False
    node.exec.calls.clear()
    assert node.driver.unprepare([ref]) == {"uid-mps": ""}
    assert node.exec.argvs == [["nvidia-smi", "-i", u1, "-c", "DEFAULT"]]
    assert "uid-mps" not in _journal(node.root) and not spec_file_of(node.root, "uid-mps").exists()
    assert _unprepares(node.driver, "error") == 2 and _unprepares(node.driver, "ok") == 1
    assert node.driver.unprepare([ref]) == {"uid-mps": ""}  # undoing what is undone is success
    assert node.driver.prepare([other])["uid-next"].error == ""


def test_failed_mps_stop_leaves_the_gpu_exclusive_and_the_claim_recorded(node: Node) -> None:
    ref = node.put(claim("mps", "uid-mps", [("gpu", "gpu-1")], configs=[gpu_config("FromClaim", ["gpu"], MPS)]))
    assert node.driver.prepare([ref])["uid-mps"].error == ""
    u1 = node.uuids[1]
    pipe = _mps_dir(node.root, "uid-mps") / "pipe"
    (pipe / "control").touch()  # the running daemon's control socket
    broken, answer = _failing(1, "daemon did not quit", lambda c: c.stdin == "quit\n")
    node.exec.on("nvidia-cuda-mps-control", answer)
    node.exec.calls.clear()
    error = node.driver.unprepare([ref])["uid-mps"]
    assert "stop MPS" in error and "daemon did not quit" in error
    # Nothing after the failed stop: the GPU stays EXCLUSIVE_PROCESS under its own daemon, not half undone.
    assert node.exec.argvs == [["nvidia-cuda-mps-control"]]
    assert pipe.is_dir() and "uid-mps" in _journal(node.root)
    broken[0] = False
    node.exec.calls.clear()
    assert node.driver.unprepare([ref]) == {"uid-mps": ""}
    assert node.exec.argvs == [["nvidia-cuda-mps-control"], ["nvidia-smi", "-i", u1, "-c", "DEFAULT"]]
    assert not _mps_dir(node.root, "uid-mps").exists() and "uid-mps" not in _journal(node.root)


def test_failed_timeslice_reset_fails_unprepare_until_it_works(node: Node) -> None:
    ref = node.put(claim("ts", "uid-ts", [("gpu", "gpu-2"), ("gpu", "gpu-5")],
                        configs=[gpu_config("FromClaim", ["gpu"], TIME_SLICING)]))
    assert node.driver.prepare([ref])["uid-ts"].error == ""
    u2, u5 = node.uuids[2], node.uuids[5]
    broken, answer = _failing(6, "Unable to set the timeslice",
                              lambda c: c.argv[:4] == ("nvidia-smi", "compute-policy", "-i", u5))
    node.exec.on("nvidia-smi", answer)
    error = node.driver.unprepare([ref])["uid-ts"]
    assert f"reset timeslice of {u5}" in error and "exit 6" in error and u2 not in error
    [left] = _journal(node.root)["uid-ts"]["sharing"]
    assert (left["timesliceChanged"], left["computeModeChanged"]) == ([u5], [])
    broken[0] = False
    node.exec.calls.clear()
    assert node.driver.unprepare([ref]) == {"uid-ts": ""}
    assert node.exec.argvs == [["nvidia-smi", "compute-policy", "-i", u5, "--set-timeslice", "0"]]
    assert "uid-ts" not in _journal(node.root)


def test_a_daemon_that_is_already_gone_counts_as_stopped(node: Node) -> None:
    """Guard for the idempotent undo: ``quit`` fails when no daemon listens (it died, or a retry after a stop
    whose journal write was lost); with no control socket in its pipe directory there is nothing to stop."""
    ref = node.put(claim("mps", "uid-mps", [("gpu", "gpu-1")], configs=[gpu_config("FromClaim", ["gpu"], MPS)]))
    assert node.driver.prepare([ref])["uid-mps"].error == ""
    _, answer = _failing(1, "Cannot find MPS control daemon process",
                         lambda c: c.stdin == "quit\n")
    node.exec.on("nvidia-cuda-mps-control", answer)
    node.exec.calls.clear()
    assert node.driver.unprepare([ref]) == {"uid-mps": ""}
    assert node.exec.argvs[-1] == ["nvidia-smi", "-i", node.uuids[1], "-c", "DEFAULT"]
    assert not _mps_dir(node.root, "uid-mps").exists()


def test_failed_rollback_of_a_prepare_keeps_the_record_for_the_retry(node: Node) -> None:
    ref = node.put(claim("mps", "uid-mps", [("gpu", "gpu-1")], configs=[gpu_config("FromClaim", ["gpu"], MPS)]))
    u1 = node.uuids[1]
    daemon_broken, daemon = _failing(1, "cannot start", lambda c: c.argv[-1] == "-d")
    smi_broken, reset = _failing(3, "Unable to set the compute mode",
                                 lambda c: c.argv[-2:] == ("-c", "DEFAULT"))
    node.exec.on("nvidia-cuda-mps-control", daemon)
    node.exec.on("nvidia-smi", reset)
    error = node.driver.prepare([ref])["uid-mps"].error
    assert "cannot start" in error and f"reset compute mode of {u1}" in error
    record = _journal(node.root)["uid-mps"]
    assert record["state"] == "PrepareStarted" and record["sharing"][0]["computeModeChanged"] == [u1]
    daemon_broken[0] = smi_broken[0] = False
    node.exec.calls.clear()
    assert node.driver.prepare([ref])["uid-mps"].error == ""
    assert node.exec.argvs[0] == ["nvidia-smi", "-i", u1, "-c", "DEFAULT"]  # the rollback, finished first
    assert _journal(node.root)["uid-mps"]["state"] == "PrepareCompleted"


def test_unprepare_error_reaches_the_kubelet_per_claim(env: Env) -> None:
    env.driver.start()
    server = PluginServer(env.driver, HostRoot(env.root))
    server.start(watch_interval=0.05)
    kubelet = DraKubelet(env.root)
    try:
        kubelet.register()
        shared = put_claim(env, claim("shared", "uid-sh", [("gpu", "gpu-0")],
                                      configs=[gpu_config("FromClaim", [], MPS)]))
        plain = put_claim(env, claim("plain", "uid-pl", [("gpu", "gpu-vfio-0")]))
        prepared = kubelet.prepare(DRIVER, [shared, plain])
        assert prepared.claims["uid-sh"].error == "" and prepared.claims["uid-pl"].error == ""
        env.sharing.fail_on = "compute-mode"
        resp = kubelet.unprepare(DRIVER, [shared, plain])
        assert "compute-mode failed (injected)" in resp.claims["uid-sh"].error
        assert resp.claims["uid-pl"].error == ""  # one claim's failure does not fail the batch
        env.sharing.fail_on = ""
        assert kubelet.unprepare(DRIVER, [shared]).claims["uid-sh"].error == ""
        assert _unprepares(env.driver, "error") == 1 and _unprepares(env.driver, "ok") == 2
    finally:
        kubelet.close()
        server.stop(grace=0.1)


# -- a damaged or lost checkpoint keeps the sharing records ------------------------------------------------------


@pytest.mark.parametrize(("sharing", "undone"), [(MPS, "stop-mps"), (TIME_SLICING, "timeslice")])
def test_checkpoint_rebuilt_after_damage_still_undoes_sharing(env: Env, sharing: dict[str, Any],
                                                              undone: str) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("s", "uid-s", [("gpu", "gpu-0")],
                                         configs=[gpu_config("FromClaim", [], sharing)])))
    assert env.driver.prepare([ref])["uid-s"].error == ""
    uuid0 = env.source.snapshot().gpus[0].uuid
    _damage(env.root)
    driver = env.new_driver()
    driver.start()
    assert driver.state.last_recovery is not None and driver.state.last_recovery.recovery.value == "corrupted"
    assert _journal(env.root)["uid-s"]["sharing"][0]["computeModeChanged"] == [uuid0]
    env.sharing.calls.clear()
    assert driver.unprepare([ref]) == {"uid-s": ""}
    assert [c[0] for c in env.sharing.calls if c[0] == undone] == [undone]
    assert ("compute-mode", uuid0, "DEFAULT") in env.sharing.calls
    assert not _mps_dir(env.root, "uid-s").exists() and not spec_file(env, "uid-s").exists()


def test_deleted_checkpoint_is_restored_from_the_undo_records(env: Env) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("s", "uid-s", [("gpu", "gpu-0")], configs=[gpu_config("FromClaim", [], MPS)])))
    assert env.driver.prepare([ref])["uid-s"].error == ""
    (env.root / STATE / "checkpoint.json").unlink()
    driver = env.new_driver()
    driver.start()
    assert spec_file(env, "uid-s").exists()  # not removed as an orphan: the claim is still prepared
    env.sharing.calls.clear()
    assert driver.unprepare([ref]) == {"uid-s": ""}
    assert ("stop-mps", "uid-s") in env.sharing.calls
    assert not _mps_dir(env.root, "uid-s").exists()


class _Crash(BaseException):
    """The agent dies here: nothing catches it, nothing is rolled back."""


def _crash_before_the_cdi_spec(env: Env, monkeypatch: pytest.MonkeyPatch, uid: str) -> ClaimRef:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("c", uid, [("gpu", "gpu-0")], configs=[gpu_config("FromClaim", [], MPS)])))

    def crash(*_: object) -> str:
        raise _Crash

    monkeypatch.setattr(cdi, "write_spec", crash)
    with pytest.raises(_Crash):
        env.driver.prepare([ref])
    monkeypatch.undo()
    assert ("start-mps", uid, (env.source.snapshot().gpus[0].uuid,), None, {}) in env.sharing.calls
    return ref


def test_half_prepared_claim_in_a_damaged_checkpoint_is_rolled_back(env: Env, monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    _crash_before_the_cdi_spec(env, monkeypatch, "uid-c")
    _damage(env.root)
    env.sharing.calls.clear()
    env.new_driver().start()
    uuid0 = env.source.snapshot().gpus[0].uuid
    assert ("stop-mps", "uid-c") in env.sharing.calls and ("compute-mode", uuid0, "DEFAULT") in env.sharing.calls
    assert _journal(env.root) == {} and not _mps_dir(env.root, "uid-c").exists()


def test_failed_rollback_at_start_keeps_the_record(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _crash_before_the_cdi_spec(env, monkeypatch, "uid-c")
    env.sharing.fail_on = "compute-mode"
    env.new_driver().start()  # start-up goes on: the claim's devices stay refused, the record stays
    assert _journal(env.root)["uid-c"]["state"] == "PrepareStarted"
    env.sharing.fail_on = ""
    env.sharing.calls.clear()
    env.new_driver().start()
    assert ("compute-mode", env.source.snapshot().gpus[0].uuid, "DEFAULT") in env.sharing.calls
    assert _journal(env.root) == {}


def test_damaged_undo_record_and_checkpoint_reset_everything_the_claim_could_have_changed(env: Env) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("s", "uid-s", [("gpu", "gpu-0")], configs=[gpu_config("FromClaim", [], MPS)])))
    assert env.driver.prepare([ref])["uid-s"].error == ""
    (env.root / STATE / "undo").mkdir(exist_ok=True)
    (env.root / STATE / "undo/uid-s.json").write_text("{ damaged")
    _damage(env.root)
    driver = env.new_driver()
    driver.start()
    env.sharing.calls.clear()
    assert driver.unprepare([ref]) == {"uid-s": ""}
    uuid0 = env.source.snapshot().gpus[0].uuid
    assert ("stop-mps", "uid-s") in env.sharing.calls and ("compute-mode", uuid0, "DEFAULT") in env.sharing.calls
    assert not _mps_dir(env.root, "uid-s").exists()


def spec_file_of(root: Path, uid: str) -> Path:
    return root / cdi.spec_path(DRIVER, uid).lstrip("/")


def test_undo_record_left_by_a_crash_before_the_journal_changed_nothing_and_goes(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The undo record is written before the journal's PrepareStarted: a crash between the two leaves one the
    intact journal does not hold, which start-up removes without touching the GPU."""
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("c", "uid-c", [("gpu", "gpu-0")], configs=[gpu_config("FromClaim", [], MPS)])))

    real = atomic.write_atomic

    def write(path: Path, data: bytes, mode: int = 0o644) -> None:
        if path.name == "checkpoint.json":
            raise _Crash
        real(path, data, mode)

    monkeypatch.setattr(atomic, "write_atomic", write)
    with pytest.raises(_Crash):
        env.driver.prepare([ref])
    monkeypatch.undo()
    assert (env.root / STATE / "undo/uid-c.json").exists() and "uid-c" not in _journal(env.root)
    env.sharing.calls.clear()
    env.new_driver().start()
    assert env.sharing.calls == [] and not (env.root / STATE / "undo/uid-c.json").exists()


def test_undo_records_of_the_previous_boot_are_discarded(env: Env) -> None:
    env.driver.start()
    ref = ClaimRef(*put_claim(env, claim("s", "uid-s", [("gpu", "gpu-0")], configs=[gpu_config("FromClaim", [], MPS)])))
    assert env.driver.prepare([ref])["uid-s"].error == ""
    assert (env.root / STATE / "undo/uid-s.json").exists()
    (env.root / "proc/sys/kernel/random/boot_id").write_text("99999999-aaaa-bbbb-cccc-dddddddddddd\n")
    env.sharing.calls.clear()
    env.new_driver().start()
    assert env.sharing.calls == []  # the changes died with the boot: nothing to undo, nothing restored
    assert list((env.root / STATE / "undo").iterdir()) == [] and _journal(env.root) == {}
