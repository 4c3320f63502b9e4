"""Stopping the harness's daemons: one way for the control plane's components, a node's supervisor and the
units it runs. SIGTERM, then SIGKILL after a grace, and return only once the process is gone (a daemon
started again before the old one let go of its port exits with "address already in use")."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time


def alive(pid: int | None) -> bool:
    """Whether ``pid`` names a live (not yet reaped, not a zombie of ours) process."""
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our child, exited now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_child(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """A child of ours: SIGTERM, SIGKILL after ``grace_s``, reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_pid(pid: int | None, grace_s: float) -> None:
    """Any process by pid (one an earlier harness process started): SIGTERM, SIGKILL after ``grace_s``."""
    if not alive(pid):
        return
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while alive(pid) and time.monotonic() < deadline + 5:
        time.sleep(0.05)
