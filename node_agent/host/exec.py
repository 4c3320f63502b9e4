"""The one seam every host command goes through: :class:`Exec`.

``HostRoot.run`` hands each command to its ``executor``: :class:`HostExec` in production (the
``--host-exec`` modes: the binary resolved inside the root's ``bin``/``sbin`` dirs and run directly, or
through ``chroot <root>``), a recording one in tests (``tests.kit.recording_exec.RecordingExec``, the test
kit's, not shipped), which records every command in order and answers scripted results, so the commands only
real hardware runs (GPU reset, reboot, ``nvidia-smi`` compute settings, MPS daemons, ``modprobe``, service
restarts) are pinned by exact argv.

:class:`HostExec` takes the part of a ``HostRoot`` it uses (:class:`ExecRoot`) and the errors come from
``node_agent.host.errors``, so this module does not import ``node_agent.host.root`` (which imports it).

The argv an :class:`Exec` gets is the command as the agent means it on the host (``["nvidia-smi", "-r",
"-i", "0000:07:00.0"]``), before resolution; ``env`` holds only the variables the command adds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from node_agent.host.driverroot import DRIVER_BINARIES, current_driver_root
from node_agent.host.errors import CommandNotFound, CommandTimeout, HostError


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Exec(Protocol):
    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = 5.0, stdin: str | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        """Run one host command, bounded like ``timeout -k kill_after timeout``.

        Raises ``CommandNotFound`` / ``CommandTimeout`` / ``HostError``; a non-zero exit is a result.
        """
        ...


class ExecRoot(Protocol):
    """What :class:`HostExec` reads of its host root (a ``node_agent.host.root.HostRoot``)."""

    @property
    def root(self) -> Path: ...
    @property
    def exec_mode(self) -> Literal["direct", "chroot"]: ...
    @property
    def is_real_root(self) -> bool: ...
    def path(self, host_path: str) -> Path: ...
    def which(self, command: str) -> str | None: ...


class HostExec:
    """The real commands: resolved inside the host root and run directly or via ``chroot``.

    A driver tool the host root does not have (``nvidia-smi``, ``nvidia-cuda-mps-control`` in an agent
    container whose host root is its own ``/``, or on a node whose driver lives in a driver container)
    comes from the driver root (``--driver-root``), run inside it with ``chroot`` as NVIDIA's MIG manager
    runs the driver container's tools, so it finds the driver's own libraries.
    """

    def __init__(self, host: ExecRoot) -> None:
        self.host = host

    def command(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` (see the class docstring); ``CommandNotFound`` if neither root has it."""
        host = self.host
        found = host.which(argv[0])
        if found is None:
            driver = current_driver_root()
            tool = None
            if argv[0] in DRIVER_BINARIES and not driver.is_own_root:
                tool = driver.driver_binary(argv[0])
            if tool is None:
                raise CommandNotFound(f"command {argv[0]!r} not found on the host", argv[0])
            return ["chroot", str(driver.path), "/" + str(tool.relative_to(driver.path)), *argv[1:]]
        if host.exec_mode == "chroot" and not host.is_real_root:
            return ["chroot", str(host.root), found, *argv[1:]]
        return [str(host.path(found)), *argv[1:]]

    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = 5.0, stdin: str | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        host = self.host
        cmd = self.command(argv)
        full_env = dict(os.environ)
        full_env["HOST_ROOT"] = "" if host.is_real_root else str(host.root)
        full_env.setdefault("LC_ALL", "C")
        full_env.update(env or {})
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                                    start_new_session=True)
        except OSError as e:
            raise HostError(f"cannot run {argv[0]}: {e.strerror}", argv[0]) from e
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=kill_after_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            raise CommandTimeout(f"{argv[0]} did not finish within {timeout_s:g}s", argv[0]) from None
        return CommandResult(tuple(argv), proc.returncode, out, err)
