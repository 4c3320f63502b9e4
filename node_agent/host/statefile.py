"""The one format of the agent's own state files on the host: the MIG journal and the DRA checkpoint.

Both record what the agent is doing on the node so that a restarted agent can finish or undo it, and
both must tell a file they can act on from one they must not (damaged, edited by hand, written by a
newer agent). So both are written, and read, the same way::

    {"version": 1, "checksum": "sha256:<hex>", "data": {...}}

- ``checksum`` is :func:`~node_agent.host.atomic.content_checksum` of ``data`` *as stored*: a newer agent
  that adds fields never invalidates the file for an older one (NVIDIA's DRA driver crash-looped on
  exactly that, its issue #1080), while a changed byte is caught.
- ``version`` is the format of ``data``; a reader takes every version up to its own and refuses a newer
  one with a message that says so, rather than guessing.
- Writes are atomic (temp file, fsync, rename, directory fsync: :func:`~node_agent.host.atomic.write_atomic`
  or ``HostRoot.write_atomic``) and owner-only (``0600``): the files hold claim and Node state.

This module is the codec (bytes to data and back, with every check). Both stores do their I/O through
``HostRoot`` (``read_bytes_or_none``, ``write_atomic`` with :data:`STATE_FILE_MODE`, ``remove``), behind
their domain's narrow protocol (the DRA driver's ``HostPaths``, the MIG manager's ``JournalFiles``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from node_agent.host.atomic import content_checksum

#: Owner-only: the state files are the agent's, and name claims, pods and Node state.
STATE_FILE_MODE = 0o600


class StateFileProblem(ValueError):
    """The file exists but must not be acted on; the message says why (it names no path: callers add it)."""


def encode(data: Mapping[str, Any], version: int) -> bytes:
    """The file's bytes for ``data`` (JSON-ready values) in format ``version``."""
    body = dict(data)
    doc = {"version": version, "checksum": content_checksum(body), "data": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decode(raw: bytes, version: int) -> tuple[int, dict[str, Any]]:
    """``(version, data)`` of a file written by :func:`encode` in format ``version`` or older.

    Raises :class:`StateFileProblem` for anything else: not JSON, no ``data`` object, a missing or newer
    version, a checksum that does not match.
    """
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StateFileProblem(f"not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise StateFileProblem("no data object")
    found = doc.get("version")
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise StateFileProblem(f"no format version (found {found!r})")
    if found > version:
        raise StateFileProblem(f"format version {found} was written by a newer agent; this agent reads up to {version}")
    if doc.get("checksum") != content_checksum(doc["data"]):
        raise StateFileProblem("checksum mismatch (edited or damaged)")
    return found, doc["data"]
