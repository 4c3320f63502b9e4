"""``HostRoot``: the one door to the host's files and commands.

Every read or write of ``/proc``, ``/sys``, ``/dev``, ``/etc``, ``/run`` or ``/var`` goes through a
``HostRoot``, which joins host-absolute paths under its root: ``/`` on a node, ``/host`` in the
DaemonSet container, a ``tmp_path`` tree in tests. Writes to regular files are atomic (temp file,
fsync, rename, fsync of the directory) and skipped when the content is already right, so
re-running a command changes nothing. Kernel files (sysfs, procfs) are written in place, since
rename does not exist there.

Commands run either directly (resolved inside the root's ``bin``/``sbin`` dirs, never from the
agent's own PATH when the root is not ``/``, so tests stay hermetic; ``HOST_ROOT`` is exported for
fake tools) or through ``chroot <root>`` (the DaemonSet with the host mounted at ``/host``), always
through the root's ``executor`` (``node_agent.host.exec``): tests inject a recording one
(``tests.kit.recording_exec.RecordingExec``). The errors live in ``node_agent.host.errors`` and a command's
result in ``node_agent.host.exec`` (this module exports both as before), so ``exec`` never imports this one.

The services' narrow host protocols (``deviceplugin.devices.HostFiles``, ``dra.hostfs.HostPaths``,
``mig.executor.StateFiles``) are subsets of this class's methods, with the same names and meaning:
a missing file reads as ``None`` (``read_bytes_or_none``, ``read_text_or_none``) or ``False``
(``exists``, ``remove``); anything else that goes wrong, a refused path included, raises ``HostError``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

from node_agent.host import atomic
from node_agent.host.errors import CommandNotFound, CommandTimeout, HostError, NotOurs, Refused
from node_agent.host.exec import CommandResult, Exec, HostExec
from nvgpu.nodescripts.facts import STATE_DIR

__all__ = [
    "CommandNotFound",
    "CommandResult",
    "CommandTimeout",
    "ExecMode",
    "HostError",
    "HostRoot",
    "Mknod",
    "NotOurs",
    "Refused",
    "real_mknod",
]

ExecMode = Literal["direct", "chroot"]
_BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


#: Makes one character device node: ``(local path, major, minor, mode)``. The real one is mknod(2); a simulated
#: host (whose tests run as non-root, where mknod fails) passes the simulator's stand-in (``nvml_sim.host``, through
#: ``node_agent.nvml.simulator.Simulator.device_node_stand_in``).
Mknod = Callable[[Path, int, int, int], None]


def real_mknod(local: Path, major: int, minor: int, mode: int) -> None:
    """mknod(2) of a character device, then chmod: mknod honours the umask, and NVIDIA's ``nvdevices``
    (nvidia-container-toolkit ``internal/system/nvdevices/mknod.go``) chmods to the mode after it too."""
    os.mknod(local, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(local, mode)


class HostRoot:
    def __init__(self, root: str | Path = "/", *, exec_mode: ExecMode = "direct",
                 executor: Exec | None = None, mknod: Mknod | None = None) -> None:
        self.root = Path(root).resolve()
        self.exec_mode: ExecMode = exec_mode
        #: Where every command goes (``node_agent.host.exec``): the real one unless a test injects one.
        self.executor: Exec = executor if executor is not None else HostExec(self)
        #: How device nodes are made (:meth:`make_char_device`): mknod(2) unless a simulated host passes its own.
        self.mknod: Mknod = mknod if mknod is not None else real_mknod

    def __repr__(self) -> str:
        return f"HostRoot({str(self.root)!r}, exec_mode={self.exec_mode!r})"

    @property
    def is_real_root(self) -> bool:
        return self.root == Path("/")

    # -- paths -------------------------------------------------------------------------------
    def path(self, host_path: str) -> Path:
        """The local path of a host-absolute path; ``..`` may not climb out of the root."""
        pure = PurePosixPath(host_path)
        if not pure.is_absolute():
            raise HostError(f"host path {host_path!r} must be absolute", host_path)
        if ".." in pure.parts:
            raise HostError(f"host path {host_path!r} may not contain '..'", host_path)
        return self.root.joinpath(*pure.parts[1:])

    def exists(self, host_path: str) -> bool:
        """Whether the path exists; a path that cannot be checked (``..``, a directory it may not search)
        raises :class:`HostError` rather than reading as absent."""
        try:
            return self.path(host_path).exists()
        except OSError as e:
            raise HostError(f"cannot check {host_path}: {e.strerror or e}", host_path) from e

    def is_dir(self, host_path: str) -> bool:
        try:
            return self.path(host_path).is_dir()
        except OSError as e:
            raise HostError(f"cannot check {host_path}: {e.strerror or e}", host_path) from e

    def listdir(self, host_path: str) -> list[str]:
        """Sorted entry names; an absent directory is empty."""
        try:
            return sorted(os.listdir(self.path(host_path)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise HostError(f"cannot list {host_path}: {e.strerror}", host_path) from e

    def readlink_name(self, host_path: str) -> str | None:
        """The last component of a symlink's target (sysfs ``driver`` links), None if absent."""
        try:
            return PurePosixPath(os.readlink(self.path(host_path))).name
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise HostError(f"cannot read link {host_path}: {e.strerror}", host_path) from e

    def readlink(self, host_path: str) -> str | None:
        """A symlink's target as stored (not resolved), None if it is not a link."""
        try:
            return os.readlink(self.path(host_path))
        except (FileNotFoundError, NotADirectoryError, OSError):
            return None

    # -- reading -----------------------------------------------------------------------------
    def read_bytes(self, host_path: str) -> bytes:
        try:
            return self.path(host_path).read_bytes()
        except OSError as e:
            raise HostError(f"cannot read {host_path}: {e.strerror or e}", host_path) from e

    def read_text(self, host_path: str) -> str:
        data = self.read_bytes(host_path)
        try:
            return data.decode()
        except UnicodeDecodeError as e:
            raise HostError(f"{host_path} is not UTF-8 text", host_path) from e

    def read_bytes_or_none(self, host_path: str) -> bytes | None:
        """The file's content, or None when it does not exist (a refused or unreadable file still raises)."""
        try:
            return self.path(host_path).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise HostError(f"cannot read {host_path}: {e.strerror or e}", host_path) from e

    def read_text_or_none(self, host_path: str) -> str | None:
        """The file's text, or None when it does not exist (a refused, unreadable or non-UTF-8 file still raises)."""
        data = self.read_bytes_or_none(host_path)
        if data is None:
            return None
        try:
            return data.decode()
        except UnicodeDecodeError as e:
            raise HostError(f"{host_path} is not UTF-8 text", host_path) from e

    # -- writing -----------------------------------------------------------------------------
    def write_atomic(self, host_path: str, data: bytes | str, mode: int = 0o644) -> bool:
        """Replace a regular file atomically; returns False (and writes nothing) if already identical."""
        payload = data.encode() if isinstance(data, str) else data
        target = self.path(host_path)
        with contextlib.suppress(OSError):
            if target.is_file() and target.read_bytes() == payload and (target.stat().st_mode & 0o777) == mode:
                return False
        try:
            atomic.write_atomic(target, payload, mode)
        except OSError as e:
            raise HostError(f"cannot write {host_path}: {e.strerror or e}", host_path) from e
        return True

    def write_kernel(self, host_path: str, text: str) -> None:
        """Write a sysfs/procfs attribute in place (the file must exist; nothing is created)."""
        try:
            fd = os.open(self.path(host_path), os.O_WRONLY | os.O_TRUNC)
        except OSError as e:
            raise HostError(f"cannot open {host_path} for writing: {e.strerror}", host_path) from e
        try:
            os.write(fd, text.encode())
        except OSError as e:
            raise HostError(f"kernel refused {text.strip()!r} for {host_path}: {e.strerror}", host_path) from e
        finally:
            os.close(fd)

    def is_executable(self, host_path: str) -> bool:
        """A regular file (or a link to one) this process may execute."""
        local = self.path(host_path)
        return local.is_file() and os.access(local, os.X_OK)

    def remove(self, host_path: str) -> bool:
        """Delete a file; False if it was not there."""
        try:
            self.path(host_path).unlink()
        except FileNotFoundError:
            return False
        except OSError as e:
            raise HostError(f"cannot remove {host_path}: {e.strerror}", host_path) from e
        atomic.fsync_dir(self.path(host_path).parent)
        return True

    def make_char_device(self, host_path: str, major: int, minor: int, mode: int = 0o666) -> bool:
        """Create the character device node ``host_path`` (``c major:minor``) unless something is already there
        (False then, nothing changed), as NVIDIA's ``nvdevices`` does. Missing parent directories are made."""
        local = self.path(host_path)
        if local.exists() or local.is_symlink():
            return False
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            self.mknod(local, major, minor, mode)
        except FileExistsError:
            return False
        except OSError as e:
            raise HostError(f"cannot create device node {host_path} (c {major}:{minor}): {e.strerror or e}",
                            host_path) from e
        atomic.fsync_dir(local.parent)
        return True

    def remove_tree(self, host_path: str) -> None:
        """Delete a directory and everything in it: renamed aside first (one atomic step, so a crash never
        leaves half a tree where the directory was), then removed."""
        local = self.path(host_path)
        aside = local.with_name(f".{local.name}.removing-{os.getpid()}")
        try:
            os.rename(local, aside)
            atomic.fsync_dir(local.parent)
            shutil.rmtree(aside)
        except OSError as e:
            raise HostError(f"cannot remove {host_path}: {e.strerror}", host_path) from e

    # -- agent state -------------------------------------------------------------------------
    @property
    def state_dir(self) -> str:
        return STATE_DIR

    def state_path(self, *parts: str) -> str:
        """A host path inside the agent's state directory."""
        return str(PurePosixPath(STATE_DIR, *parts))

    @contextlib.contextmanager
    def lock(self, name: str, timeout_s: float = 60.0) -> Iterator[None]:
        """Hold ``<state dir>/<name>.lock`` (flock) so two agent processes never change the same thing at once."""
        path = self.path(self.state_path(f"{name}.lock"))
        held = contextlib.ExitStack()
        try:  # only acquiring is translated: the caller's own errors pass through unchanged
            held.enter_context(atomic.exclusive_lock(path, timeout_s, poll_s=0.05))
        except atomic.LockTimeout:
            raise HostError(f"another agent process holds {self.state_path(name + '.lock')}") from None
        except OSError as e:
            raise HostError(f"cannot open lock {path}: {e.strerror}", str(path)) from e
        with held:
            yield

    # -- commands ----------------------------------------------------------------------------
    def which(self, command: str) -> str | None:
        """The host path of ``command`` inside the root, or None."""
        if "/" in command:
            return command if self.path(command).is_file() else None
        for d in _BIN_DIRS:
            candidate = f"{d}/{command}"
            local = self.path(candidate)
            if local.is_file() and os.access(local, os.X_OK):
                return candidate
        return None

    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = 5.0,
            stdin: str | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run a host command through :attr:`executor`, bounded like ``timeout -k kill_after timeout``.

        Raises on timeout/absence; ``env`` adds variables to the command's environment.
        """
        return self.executor.run(argv, timeout_s=timeout_s, kill_after_s=kill_after_s, stdin=stdin, env=env)

    def command_path(self, host_path: str) -> str:
        """The path a host command sees for ``host_path``: the host path itself when commands run in the
        host's root (``/`` or ``chroot``), the local path under the root otherwise (direct mode)."""
        if self.is_real_root or self.exec_mode == "chroot":
            return host_path
        return str(self.path(host_path))
