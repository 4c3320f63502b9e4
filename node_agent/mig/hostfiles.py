"""The MIG manager's host side: journal and marker files, GPU reset and reboot, via ``HostRoot``.

Everything under the host root goes through :class:`~node_agent.host.HostRoot` (atomic writes, root-aware
paths, bounded commands). The step lock is the exception on purpose: it only orders the manager and
its own ``preStop`` hook, which run in the same container, so it lives in the container's ``/tmp``
rather than on the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from node_agent.host import HostError, HostRoot
from node_agent.mig.journal import JournalError

REBOOT_TIMEOUT_S = 60.0


class HostStateFiles:
    """:class:`~node_agent.mig.executor.StateFiles` over a ``HostRoot``; host errors become journal errors."""

    def __init__(self, host: HostRoot, lock_dir: Path = Path("/tmp")) -> None:
        self.host = host
        self.lock_dir = lock_dir

    def read_bytes(self, path: str) -> bytes | None:
        try:
            if not self.host.exists(path):
                return None
            return self.host.read_bytes(path)
        except HostError as e:
            raise JournalError(str(e)) from e

    def write_atomic(self, path: str, data: bytes) -> None:
        try:
            self.host.write_atomic(path, data, mode=0o600)
        except HostError as e:
            raise JournalError(str(e)) from e

    def remove(self, path: str) -> None:
        try:
            self.host.remove(path)
        except HostError as e:
            raise JournalError(str(e)) from e

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_dir / f"nvidia-gpu-{Path(path).name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)




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
