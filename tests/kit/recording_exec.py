"""The test :class:`~node_agent.host.exec.Exec`: :class:`RecordingExec` records every host command and runs none.

A ``HostRoot(..., executor=RecordingExec())`` pins the commands only real hardware runs (GPU reset, reboot,
``nvidia-smi`` compute settings, MPS daemons, ``modprobe``, service restarts) by exact argv, and answers
them from scripted responders. It is the test kit's, not the agent's: production code only ever runs the
real ``node_agent.host.exec.HostExec``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from node_agent.host.exec import CommandResult


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
    """The test :class:`~node_agent.host.exec.Exec`: records every call in order and answers from ``responders``.

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
        call = Call(tuple(argv), dict(env or {}), stdin, timeout_s)
        self.calls.append(call)
        responder = self.responders.get(argv[0])
        result = responder(call) if responder is not None else None
        return result if result is not None else CommandResult(tuple(argv), 0, "", "")
