"""Host files the DRA driver owns (checkpoint, locks, CDI specs, MPS pipe dirs), all under the host root.

Every host path is written host-absolute (``/var/run/cdi/...``) and resolved through a :class:`HostPaths`
root, which is the agent's ``node_agent.host.HostRoot`` itself (in tests one over ``tmp_path``): so the
agent works with the host mounted at ``/host`` in its container, and a path that would climb out of the
root with ``..`` (a claim UID, a directory read back from the checkpoint) is refused with
``HostError`` instead of resolved. Files are read, written (atomically) and removed through the root
as well; only what it has no operation for (directories, the corrupt checkpoint's rename, the node-wide
lock, sockets) goes through :meth:`HostPaths.path`, resolved and checked the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class HostPaths(Protocol):
    """The host root as the DRA driver uses it (``node_agent.host.HostRoot`` satisfies it); failures,
    refused paths included, raise ``node_agent.host.HostError``."""

    def path(self, host_path: str) -> Path:
        """The local path of a host-absolute path; ``..`` is refused."""
        ...

    def exists(self, host_path: str) -> bool: ...

    def read_bytes_or_none(self, host_path: str) -> bytes | None:
        """The file's content, or None when it does not exist."""
        ...

    def write_atomic(self, host_path: str, data: bytes, mode: int) -> bool:
        """Replace the file atomically (temp file, fsync, rename); False when it already held ``data``."""
        ...

    def remove(self, host_path: str) -> bool:
        """Delete the file; False when it was already gone."""
        ...
