"""The preflight's vocabulary: how it reads the cluster, and what it reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol


class Severity(enum.Enum):
    #: The run must stop: ``up`` would fail halfway, or take over (and on destroy delete) what others own.
    ERROR = "error"
    #: The run may go on; the message says what to watch or do (both installations can coexist).
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    #: What it is about, as ``kubectl`` names it (``RuntimeClass/nvidia``, ``NodeGroup/gpu-a30``).
    subject: str
    #: One line: what is there, what would collide, and what to do.
    message: str

    def line(self) -> str:
        return f"{self.subject}: {self.message}"


class ReadRefused(RuntimeError):
    """The cluster refused a read (401/403) or could not be reached: the check cannot be made."""


class ClusterReader(Protocol):
    """Read-only access to the target cluster. A kind the cluster does not serve (its CRD is not installed)
    reads as absent: ``get`` answers None and ``list`` an empty list."""

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it (or its kind) does not exist; raises :class:`ReadRefused`."""
        ...

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        """The objects of a kind (all namespaces when ``namespace`` is None); raises :class:`ReadRefused`."""
        ...


@dataclass(frozen=True)
class Conflict:
    """A field another field manager holds with another value: what server-side apply would refuse."""

    field: str
    manager: str


class ApplyProbe(Protocol):
    """A server-side apply dry-run (``dryRun=All``, no force): nothing is written."""

    def conflicts(self, obj: dict[str, Any], field_manager: str) -> list[Conflict]:
        """The conflicts applying ``obj`` as ``field_manager`` would meet; raises :class:`ReadRefused`
        when the identity may not dry-run it."""
        ...
