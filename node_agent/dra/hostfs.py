"""Host files the DRA driver owns (checkpoint, locks, CDI specs, MPS pipe dirs), all under a host root.

Every host path is written host-absolute (``/var/run/cdi/...``) and resolved through a :class:`HostPaths`
root, so the agent works with the host mounted at ``/host`` in its container and under ``tmp_path`` in
tests. Writes are atomic: temp file in the same directory, fsync, rename, fsync of the directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class HostPaths(Protocol):
    """Resolves host-absolute paths under the host root (``node_agent.host.HostRoot`` satisfies it)."""

    def path(self, host_path: str) -> Path: ...


class RootedPaths:
    """The plain :class:`HostPaths`: ``root`` joined with the host path."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = Path(root)

    def path(self, host_path: str) -> Path:
        if not host_path.startswith("/"):
            raise ValueError(f"host path {host_path!r} must be absolute")
        return self.root / host_path.lstrip("/")


class LockTimeout(TimeoutError):
    """The node-wide lock was not acquired in time (another prepare/unprepare holds it)."""


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove(path: Path) -> bool:
    """Delete a file; False when it was already gone."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def file_lock(path: Path, timeout: float, poll: float = 0.002) -> Iterator[None]:
    """A node-wide exclusive ``flock`` on ``path``; each acquisition opens its own file description, so
    it also excludes other threads of this process and other processes (a second plugin pod during a
    rolling update)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"lock {path} not acquired within {timeout:.1f}s") from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)
