"""Host files the DRA driver owns (checkpoint, locks, CDI specs, MPS pipe dirs), all under a host root.

Every host path is written host-absolute (``/var/run/cdi/...``) and resolved through a :class:`HostPaths`
root, so the agent works with the host mounted at ``/host`` in its container and under ``tmp_path`` in
tests. Writes are atomic and the node-wide lock is an ``flock``, both from ``node_agent.host.atomic``
(the same code ``HostRoot`` writes and locks with).
"""

from __future__ import annotations

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


def remove(path: Path) -> bool:
    """Delete a file; False when it was already gone."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
