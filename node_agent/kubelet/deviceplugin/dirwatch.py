"""Watches the device-plugins directory for kubelet restarts (inotify via ctypes, polling fallback).

A restarted kubelet recreates ``kubelet.sock`` and forgets every registration (it may also delete the
plugins' sockets). NVIDIA's plugin notices through fsnotify; here a tiny ctypes binding of Linux
inotify does the same without a new dependency, and where inotify is unavailable the directory is
polled every 100 ms, comparing inodes. Either way :meth:`DirWatcher.wait` returns the names that were
created or removed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_IGNORED = 0x00008000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")
POLL_INTERVAL_S = 0.1


class DirWatcher:
    """Reports created/removed entries among ``names`` in ``directory``."""

    def __init__(self, directory: Path, names: Iterable[str], use_inotify: bool = True):
        self.directory = directory
        self.names = set(names)
        self._fd = -1
        self._wd = -1
        self._libc: ctypes.CDLL | None = None
        self._snapshot = self._stat_all()
        if use_inotify:
            self._init_inotify()

    @property
    def uses_inotify(self) -> bool:
        return self._fd >= 0

    def watch_names(self, names: Iterable[str]) -> None:
        self.names = set(names)
        self._snapshot = self._stat_all()

    def _init_inotify(self) -> None:
        path = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(path or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError) as e:
            log.info("event=inotify-unavailable error=%r fallback=polling", e)
            return
        if fd < 0:
            log.info("event=inotify-unavailable errno=%d fallback=polling", ctypes.get_errno())
            return
        self._libc = libc
        self._fd = fd
        self._add_watch()

    def _add_watch(self) -> None:
        if self._libc is None or self._fd < 0:
            return
        mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
        self._wd = self._libc.inotify_add_watch(self._fd, os.fsencode(self.directory), mask)
        if self._wd < 0:
            log.info("event=inotify-watch-failed dir=%s errno=%d", self.directory, ctypes.get_errno())

    def _stat_all(self) -> dict[str, int]:
        out = {}
        for n in self.names:
            try:
                out[n] = (self.directory / n).stat().st_ino
            except OSError:
                continue
        return out

    def _poll_changes(self) -> set[str]:
        now = self._stat_all()
        changed = {n for n in self.names if now.get(n) != self._snapshot.get(n)}
        self._snapshot = now
        return changed

    def wait(self, timeout_s: float, wake_fd: int | None = None) -> set[str]:
        """Names created, replaced or removed since the last call (empty on timeout). ``wake_fd`` readable
        ends the wait early (empty unless a name changed too): the caller's own requests share the one
        wait, so at rest it sleeps for all of ``timeout_s`` instead of polling its queue between slices."""
        extra = [wake_fd] if wake_fd is not None else []
        if self._fd < 0 or self._wd < 0:
            # Polling (also while the directory is missing and the inotify watch is gone).
            if self._fd >= 0 and self.directory.is_dir():
                self._add_watch()
            deadline = timeout_s
            while deadline > 0:
                changed = self._poll_changes()
                if changed:
                    return changed
                step = min(POLL_INTERVAL_S, deadline)
                woken, _, _ = select.select(extra, [], [], step)
                if woken:
                    break
                deadline -= step
            return self._poll_changes()
        ready, _, _ = select.select([self._fd, *extra], [], [], timeout_s)
        if self._fd not in ready:
            return set()
        try:
            data = os.read(self._fd, 65536)
        except OSError as e:
            if e.errno == errno.EAGAIN:
                return set()
            raise
        names: set[str] = set()
        off = 0
        while off + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, off)
            raw = data[off + _EVENT.size: off + _EVENT.size + length]
            off += _EVENT.size + length
            if mask & (IN_DELETE_SELF | IN_IGNORED):
                self._wd = -1
                continue
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            if name in self.names:
                names.add(name)
        self._snapshot = self._stat_all()
        return names

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
