"""The host layer's errors: what a host file or command could not do, raised by ``root`` and ``exec`` alike.

Their own module, below both: ``HostRoot`` (``root``) runs its commands through an ``Exec`` (``exec``),
and an ``Exec`` raises these, so neither module imports the other for them (they used to, each from a
function body, the one cycle in the host layer). ``node_agent.host`` and ``node_agent.host.root`` export
them as before.
"""

from __future__ import annotations


class HostError(Exception):
    """A host file or command could not be read, written or run; the message names the path."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class Refused(HostError):
    """The agent will not act: the GPU is in use, or a file in the way is not ours. Nothing changed."""


class NotOurs(Refused):
    """A file where the agent writes exists and was not written by the agent."""


class CommandNotFound(HostError):
    pass


class CommandTimeout(HostError):
    pass
