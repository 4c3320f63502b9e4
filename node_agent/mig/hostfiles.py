"""The MIG manager's host side besides its files: the step lock, GPU reset and reboot.

The journal and the marker files need no adapter: the manager is handed the agent's
:class:`~node_agent.host.HostRoot` itself as its ``StateFiles`` (atomic writes, root-aware paths that
refuse ``..``). The step lock is the exception on purpose: it only orders the manager and its own
``preStop`` hook, which run in the same container, so it lives in the container's ``/tmp`` rather than
on the host; it is taken with the host layer's one lock primitive,
:func:`node_agent.host.atomic.exclusive_lock`, with a timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from node_agent.host import HostError, HostRoot
from node_agent.host.atomic import LockTimeout, exclusive_lock
from node_agent.mig.journal import JournalError

REBOOT_TIMEOUT_S = 60.0
#: Longer than any one step holds the lock (a GPU reset alone may take ``RESET_TIMEOUT_S``, 120 s, plus
#: its kill grace), so only a wedged holder makes the other side give up: the loop then retries the
#: round, the preStop hook fails with the message instead of outliving the pod's grace period unseen.
STEP_LOCK_TIMEOUT_S = 300.0


class ContainerLock:
    """:class:`~node_agent.mig.executor.StepLock` on ``<lock_dir>/nvidia-gpu-lock.lock`` in the container."""

    def __init__(self, lock_dir: Path = Path("/tmp"), timeout_s: float = STEP_LOCK_TIMEOUT_S) -> None:
        self.path = lock_dir / "nvidia-gpu-lock.lock"
        self.timeout_s = timeout_s

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        held = contextlib.ExitStack()
        try:  # only acquiring is translated: the step's own errors pass through unchanged
            held.enter_context(exclusive_lock(self.path, self.timeout_s, poll_s=0.05))
        except LockTimeout:
            raise JournalError(f"the MIG step lock {self.path} is still held after {self.timeout_s:.0f}s") from None
        except OSError as e:
            raise JournalError(f"cannot open the MIG step lock {self.path}: {e.strerror or e}") from e
        with held:
            yield


class HostRebooter:
    """Reboot through the host's systemd (only used with ``--allow-reboot``)."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def reboot(self) -> None:
        try:
            self.host.run(["systemctl", "reboot"], timeout_s=REBOOT_TIMEOUT_S)
        except HostError as e:
            raise JournalError(f"cannot reboot: {e}") from e


class HostCommandRunner:
    """Run ``nvidia-smi`` (the GPU reset) on the host, bounded by a timeout."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str]:
        try:
            result = self.host.run(argv, timeout_s=timeout_s)
        except HostError as e:
            return 127, str(e)
        return result.returncode, (result.stderr or result.stdout)
