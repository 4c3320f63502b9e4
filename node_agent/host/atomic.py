"""Atomic file replacement and node-wide exclusive locks on local paths: the primitives under every write.

``HostRoot`` writes every host file through :func:`write_atomic` and takes its named state-dir locks
with :func:`exclusive_lock`; the two other locks of the agent, the DRA driver's node-wide prepare lock
and the MIG manager's step lock in its container, take :func:`exclusive_lock` directly. So each is done
once, the same way: a temp file in the target's directory, fsync, rename, fsync of the directory; and an
``flock`` polled until a deadline. This is the agent's only user of ``fcntl`` (an import-linter contract).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


class LockTimeout(TimeoutError):
    """The lock was not acquired in time (another process or thread holds it)."""


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new content, never a mix; raises ``OSError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout_s: float, poll_s: float = 0.002) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created ``0600``). Each acquisition opens its own file
    description, so it excludes other threads of this process as well as other processes. Raises
    :class:`LockTimeout` after ``timeout_s``, ``OSError`` when the file cannot be opened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"lock {path} not acquired within {timeout_s:.1f}s") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)


def content_checksum(data: object) -> str:
    """``sha256:`` of the canonical JSON of ``data`` (sorted keys, no spaces, UTF-8): the one checksum the
    agent's state files (the MIG journal, the DRA checkpoint) carry, so they agree on what "unchanged" is."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
