"""dcgm-exporter's counters file format (``-f default-counters.csv``), read the same way on both sides.

One field per line, ``DCGM_FIELD, type, help``; ``#`` starts a comment. The stack config's
``cluster.monitoring.counters`` is checked with :func:`read` at preview (a line dcgm-exporter would refuse
fails there, with its line number), and the agent's exporter reads the same text with it before choosing
what it can serve (``node_agent.exporter.counters``). NVIDIA's own default file is vendored
(``nvgpu/data``) as the default of both exporters. A refused line is quoted cut
(:func:`nvgpu.errortext.shown`), so a 1 MiB line makes a one-line error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from nvgpu.errortext import shown

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_COUNTERS_FILE = DATA_DIR / "dcgm-exporter-default-counters.csv"
TYPES = ("counter", "gauge", "label")
#: Matched with ``fullmatch`` (``re.match`` with ``$`` would accept a trailing newline).
_NAME = re.compile(r"DCGM_[A-Z0-9_]{1,80}")


class CountersError(ValueError):
    """The counters text cannot be used; the message names the line."""


@dataclass(frozen=True)
class Counter:
    name: str
    kind: str
    help: str
    line: int


def read(text: str, source: str = "counters file") -> list[Counter]:
    """Every field line of ``text``, in order; a malformed line raises :class:`CountersError` naming it."""
    out: list[Counter] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2:
            raise CountersError(f"{where}: {shown(line)} is not 'DCGM_FIELD, type, help'")
        name, kind = parts[0], parts[1]
        if not _NAME.fullmatch(name):
            raise CountersError(f"{where}: {shown(name)} is not a DCGM field name (DCGM_ and up to 80 "
                                "capitals, digits or '_', like DCGM_FI_DEV_GPU_UTIL)")
        if kind not in TYPES:
            raise CountersError(f"{where}: type {shown(kind)} of {name} is not one of {', '.join(TYPES)}")
        if name in seen:
            raise CountersError(f"{where}: {name} is listed on line {seen[name]} already")
        seen[name] = number
        out.append(Counter(name, kind, parts[2] if len(parts) > 2 else "", number))
    if not out:
        raise CountersError(f"{source}: no field listed")
    return out


@cache
def default_text() -> str:
    """NVIDIA's default counters file, unchanged."""
    return DEFAULT_COUNTERS_FILE.read_text()
