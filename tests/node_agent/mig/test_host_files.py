"""The MIG manager over the agent's own host layer: ``HostRoot`` is its ``StateFiles`` as it is, and the
step lock is the host layer's ``exclusive_lock`` in the container's lock directory, with a timeout."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from node_agent.host import HostRoot, statefile
from node_agent.mig.executor import CLEARED_MARKER, FAILED_MARKER, STOP_MARKER, MigManager, Settings
from node_agent.mig.hostfiles import STEP_LOCK_PATH, HostStepLock
from node_agent.mig.journal import JOURNAL_PATH, JournalError, JournalStore, Outcome
from nvgpu import labels
from tests.node_agent.mig.fakes import FakeBackend
from tests.node_agent.mig.harness import CONFIG, Rig, mig_node


def _manager(rig: Rig, host: HostRoot, lock: HostStepLock) -> MigManager:
    return MigManager(node=rig.node, backend=rig.backend, load_config=lambda: CONFIG, files=host, step_lock=lock,
                      boot_id=lambda: rig.boot[0], clock=rig.clock, monotonic=rig.clock.monotonic,
                      rebooter=rig.rebooter,
                      settings=Settings(timeouts=rig.timeouts))


def _mode(host: HostRoot, host_path: str) -> int:
    return os.stat(host.path(host_path)).st_mode & 0o777


def test_a_reconfiguration_over_a_host_root_keeps_its_files_owner_only(tmp_path: Path) -> None:
    host = HostRoot(tmp_path / "host")
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=2)), "all-1g.5gb")
    manager = _manager(rig, host, HostStepLock(host))
    manager.run_until_blocked()  # begins: the journal is on the host, owner-only
    assert JournalStore(host).load() is not None
    assert _mode(host, JOURNAL_PATH) == statefile.STATE_FILE_MODE
    manager.pre_stop(timeout_s=0)  # the preStop hook: stop marker written, the node given back
    assert _mode(host, STOP_MARKER) == statefile.STATE_FILE_MODE
    assert JournalStore(host).load() is None and not host.exists(JOURNAL_PATH)
    # The lock is the host's, beside the journal: it orders every process acting on this node's GPUs.
    assert [p.relative_to(host.path("/")) for p in (tmp_path / "host").rglob("*.lock")] == [
        Path(STEP_LOCK_PATH.lstrip("/"))]


def test_a_host_error_on_the_journal_is_a_journal_error_and_the_node_is_given_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = HostRoot(tmp_path / "host")
    host.path(JOURNAL_PATH).mkdir(parents=True)  # there, but not a file the manager can read
    with pytest.raises(JournalError, match=f"cannot read {JOURNAL_PATH}: Is a directory"):
        JournalStore(host).load()
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=2)), "all-1g.5gb")
    # The node is given back first; clearing the journal then fails the same way, reported, not raised raw.
    with caplog.at_level(logging.ERROR), pytest.raises(JournalError, match=f"cannot remove {JOURNAL_PATH}"):
        _manager(rig, host, HostStepLock(host)).step()
    assert any("event=journal-unreadable" in r.getMessage() for r in caplog.records)
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "failed"
    for marker in (STOP_MARKER, CLEARED_MARKER):
        assert not host.exists(marker)
    assert host.read_bytes_or_none(FAILED_MARKER) == b"all-1g.5gb"
    assert _mode(host, FAILED_MARKER) == statefile.STATE_FILE_MODE


def test_marker_that_cannot_be_read_fails_the_step_as_a_journal_error(tmp_path: Path) -> None:
    host = HostRoot(tmp_path / "host")
    host.path(STOP_MARKER).mkdir(parents=True)
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=2)), "all-1g.5gb")
    with pytest.raises(JournalError, match=f"cannot read {STOP_MARKER}: Is a directory"):
        _manager(rig, host, HostStepLock(host)).step()
    assert rig.node.patches == 0  # nothing done on a guess


def test_step_lock_excludes_a_second_holder_and_gives_up_after_its_timeout(tmp_path: Path) -> None:
    host = HostRoot(tmp_path / "host")
    lock = HostStepLock(host, timeout_s=0.2)
    other = HostStepLock(host, timeout_s=0.2)  # the preStop hook's, in its own process
    with lock():
        outcome: list[BaseException | None] = []

        def take() -> None:
            try:
                with other():
                    outcome.append(None)
            except JournalError as e:
                outcome.append(e)

        t = threading.Thread(target=take)
        t.start()
        t.join(5)
    [error] = outcome
    assert isinstance(error, JournalError)
    assert str(error) == f"the MIG step lock {host.path(STEP_LOCK_PATH)} is still held after 0s"
    with other():  # released with the first holder
        pass


def test_errors_inside_the_step_lock_pass_unchanged(tmp_path: Path) -> None:
    lock = HostStepLock(HostRoot(tmp_path / "host"))
    with pytest.raises(ValueError, match="the step's own"), lock():
        raise ValueError("the step's own")
    with lock():  # and the lock is free again
        pass


def test_step_lock_that_cannot_be_created_is_a_journal_error(tmp_path: Path) -> None:
    host = HostRoot(tmp_path / "host")
    lock_dir = host.path(STEP_LOCK_PATH).parent
    lock_dir.parent.mkdir(parents=True)
    lock_dir.write_text("a regular file where the lock directory should be\n")
    with pytest.raises(JournalError, match=r"cannot open the MIG step lock .*: File exists"), HostStepLock(host)():
        pass


def test_every_step_is_taken_under_the_step_lock() -> None:
    rig = mig_node(Rig(FakeBackend.of("A100-40GB", count=2)), "all-1g.5gb")
    manager = rig.manager()
    manager.run_until_blocked()
    assert rig.lock.taken == len(manager.history) > 0 and rig.lock.held == 0
    assert manager.pre_stop(timeout_s=0) is Outcome.ABORTED
    assert rig.lock.taken > len(manager.history) - 1 and rig.lock.held == 0
