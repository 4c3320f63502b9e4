"""The one seam every host command goes through: :class:`Exec`.

``HostRoot.run`` hands each command to its ``executor``: :class:`HostExec` in production (the
``--host-exec`` modes: the binary resolved inside the root's ``bin``/``sbin`` dirs and run directly, or
through ``chroot <root>``), a :class:`RecordingExec` in tests, which records every command in order
and answers scripted results, so the commands only real hardware runs (GPU reset, reboot, ``nvidia-smi``
compute settings, MPS daemons, ``modprobe``, service restarts) are pinned by exact argv.

The argv an :class:`Exec` gets is the command as the agent means it on the host (``["nvidia-smi", "-r",
"-i", "0000:07:00.0"]``), before resolution; ``env`` holds only the variables the command adds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from node_agent.host.root import CommandResult, HostRoot


class Exec(Protocol):
    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = 5.0, stdin: str | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        """Run one host command, bounded like ``timeout -k kill_after timeout``.

        Raises ``CommandNotFound`` / ``CommandTimeout`` / ``HostError``; a non-zero exit is a result.
        """
        ...


class HostExec:
    """The real commands: resolved inside the host root and run directly or via ``chroot``.

    A driver tool the host root does not have (``nvidia-smi``, ``nvidia-cuda-mps-control`` in an agent
    container whose host root is its own ``/``, or on a node whose driver lives in a driver container)
    comes from the driver root (``--driver-root``), run inside it with ``chroot`` as NVIDIA's MIG manager
    runs the driver container's tools, so it finds the driver's own libraries.
    """

    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def command(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` (see the class docstring); ``CommandNotFound`` if neither root has it."""
        from node_agent.host.driverroot import DRIVER_BINARIES, current_driver_root
        from node_agent.host.root import CommandNotFound

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
        from node_agent.host.root import CommandResult, CommandTimeout, HostError

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


@dataclass(frozen=True)
class Call:
    """One command a :class:`RecordingExec` saw."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: str | None = None
    timeout_s: float = 0.0


#: Answers a recorded call: a ``CommandResult``, or ``None`` for success with no output; may raise.
Responder = Callable[[Call], "CommandResult | None"]


class RecordingExec:
    """The test :class:`Exec`: records every call in order and answers from ``responders``.

    ``responders`` maps a command name (``argv[0]``) to a function of the :class:`Call`; unknown
    commands succeed with empty output. Nothing runs.
    """

    def __init__(self, responders: Mapping[str, Responder] | None = None) -> None:
        self.calls: list[Call] = []
        self.responders: dict[str, Responder] = dict(responders or {})

    @property
    def argvs(self) -> list[list[str]]:
        return [list(c.argv) for c in self.calls]

    def on(self, command: str, responder: Responder) -> None:
        self.responders[command] = responder

    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = 5.0, stdin: str | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        from node_agent.host.root import CommandResult

        call = Call(tuple(argv), dict(env or {}), stdin, timeout_s)
        self.calls.append(call)
        responder = self.responders.get(argv[0])
        result = responder(call) if responder is not None else None
        return result if result is not None else CommandResult(tuple(argv), 0, "", "")
