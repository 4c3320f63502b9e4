"""Parsing the node scripts' machine-readable output lines."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

RunScript = Callable[..., subprocess.CompletedProcess[str]]


def summary(out: str, prefix: str) -> dict[str, str]:
    """``prefix key=value key=value`` → dict (the scripts' machine-readable last line)."""
    for line in out.splitlines():
        if line.startswith(prefix + " "):
            return dict(part.split("=", 1) for part in line.split()[1:])
    raise AssertionError(f"no {prefix!r} line in {out!r}")
