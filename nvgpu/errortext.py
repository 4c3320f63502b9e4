"""Bounded error text: how a config's bad value, its path and the whole message are written into an error.

A config error quotes what it refuses, and what it refuses can be anything a file holds: a 1 MiB
string, a key with newlines in it, an integer of 5,000 digits (whose ``repr`` itself raises
``ValueError`` past Python's int-string limit, turning a config error into a traceback), a list of
thousands of items. Every parser of the project (stack config, device-plugin config, mig-parted
config, counters file) writes values, path parts and messages through these functions, so an error
stays a few lines long whatever the input, and writing it never fails.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

#: Most characters of a value quoted in an error (the rest is elided, its length said).
SHOWN_CHARS = 80
#: Most characters of one problem line (its path, the reason and the value shown).
PROBLEM_CHARS = 400
#: Most characters of a whole error message (the problems that fit, then how many more there are).
MESSAGE_CHARS = 2000
#: Most problems an error keeps: a list of thousands of bad items is refused with the first of them.
MAX_PROBLEMS = 50
#: Integers past this many bits (about 60 digits) are described, not written: no config value is near it,
#: and writing one past 4,300 digits raises ``ValueError`` (Python's int-string limit).
_INT_BITS = 200
_LOG10_2 = math.log10(2)


def integer_digits(value: int) -> int:
    """About how many decimal digits ``value`` has, computed without converting it to text."""
    return int(abs(value).bit_length() * _LOG10_2) + 1


def clip(text: str, limit: int = PROBLEM_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, saying how long it was when cut."""
    if len(text) <= limit:
        return text
    tail = f"... ({len(text)} characters)"
    return text[: max(0, limit - len(tail))] + tail


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``value`` as an error quotes it: its ``repr``, at most about ``limit`` characters, never raising.

    Long strings keep their start (escaped, so a newline shows as ``\\n``); huge integers and floats'
    kin are described by size; containers by their type and length (their items are reported where
    they are, each at its own path).
    """
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > _INT_BITS:
            return f"an integer of about {integer_digits(value)} digits"
        return repr(value)
    if isinstance(value, str | bytes):
        text = repr(value[:limit])
        if len(value) > limit or len(text) > limit + 3:
            return f"{text[:limit]}... ({len(value)} characters)"
        return text
    if isinstance(value, Mapping):
        return f"a mapping of {len(value)} keys"
    if isinstance(value, list | tuple | set | frozenset):
        return f"a {type(value).__name__} of {len(value)} items"
    try:
        return clip(repr(value), limit)
    except Exception:  # an object whose repr fails is still named
        return f"a {type(value).__name__}"


def path_part(part: object, limit: int = 64) -> str:
    """One key of a config path as written in an error: as is when it is a short printable name, else
    quoted by :func:`shown` (a key with a newline, a control character or 10,000 characters must not
    break the line it is reported on)."""
    if isinstance(part, str) and 0 < len(part) <= limit and part.isprintable() and part.strip() == part:
        return part
    return shown(part, limit)


def index_part(part: object) -> str:
    """A list index as a path writes it, ``[3]``; an index too large to print is described."""
    return f"[{shown(part)}]"


def listed(problems: Iterable[str], header: str, limit: int = MESSAGE_CHARS) -> str:
    """``header`` and one ``  - problem`` line per problem, as many as fit in ``limit`` characters, then
    how many were left out (every problem is still in the error's ``problems``)."""
    lines = [header]
    size = len(header)
    items = list(problems)
    for i, problem in enumerate(items):
        line = f"  - {clip(problem)}"
        if size + 1 + len(line) > limit - 40 and i:
            lines.append(f"  - ... and {len(items) - i} more")
            break
        lines.append(line)
        size += 1 + len(line)
    return "\n".join(lines)


def capped(problems: list[str], where: str, limit: int = MAX_PROBLEMS) -> list[str]:
    """At most ``limit`` problems, each clipped; a last ``<where>: ... and N more problems`` line says how
    many more there were (``where``: the location the caller's problems start with, so the line reads
    like the others)."""
    out = [clip(p) for p in problems[:limit]]
    if len(problems) > limit:
        out.append(f"{where}: ... and {len(problems) - limit} more problems")
    return out
