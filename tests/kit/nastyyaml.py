"""Hypothesis strategies for config text that tries to crash or exhaust a parser, and the checks every parser
must pass on it.

A document is built as Python data, then written as flow-style YAML by :func:`render`, which can also
write what Python data cannot hold or ``yaml.safe_dump`` cannot write: integers of thousands of digits
(:class:`Raw`), tagged and odd scalars, nested anchors and aliases (:class:`Bomb`, :class:`Aliased`) and
deep nesting. :func:`mutated` takes a valid config and replaces a few of its values with such things, or
bends its strings (a trailing newline, a control character), so the generated inputs reach the checks
deep inside a schema instead of all failing at the first key.

:func:`check_bounded` is the property: the parser returns or raises its own error only, quickly, with
little memory, and a message of at most 2,000 characters whose problems each start with a location.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: The settings of every property test of the parsers: modest, deterministic, no example database.
SETTINGS = settings(max_examples=200, deadline=timedelta(seconds=2), derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: The limits of the property (the deadline above leaves room for a loaded machine; this is the real one).
MAX_SECONDS = 1.0
MAX_PEAK_BYTES = 64 << 20
MAX_MESSAGE = 2000


@dataclass(frozen=True)
class Raw:
    """A scalar written verbatim: a 5,000-digit integer, ``!!int abc``, ``2026-13-45``."""

    text: str


@dataclass(frozen=True)
class Bomb:
    """``levels`` nested anchors, each aliased nine times by the next: 9**levels values once expanded."""

    levels: int


@dataclass(frozen=True)
class Aliased:
    """``value`` with an anchor, then ``copies`` aliases to it, in a list."""

    value: Any
    copies: int


@dataclass(frozen=True)
class Deep:
    """A value nested in ``depth`` lists."""

    depth: int


def render(value: Any) -> str:
    """``value`` as one line of flow-style YAML (JSON-quoted strings, so every string survives)."""
    counter = iter(range(1 << 30))

    def out(v: Any) -> str:
        if isinstance(v, Raw):
            return v.text
        if isinstance(v, Bomb):
            n = next(counter)
            parts = [f"&b{n}_0 [x,x,x,x,x,x,x,x,x]"]
            parts += [f"&b{n}_{i} [" + ",".join([f"*b{n}_{i - 1}"] * 9) + "]" for i in range(1, v.levels)]
            return "[" + ", ".join(parts) + "]"
        if isinstance(v, Aliased):
            n = next(counter)
            return f"[&s{n} {out(v.value)}" + f", *s{n}" * v.copies + "]"
        if isinstance(v, Deep):
            return "[" * v.depth + "1" + "]" * v.depth
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            if math.isnan(v):
                return ".nan"
            if math.isinf(v):
                return ".inf" if v > 0 else "-.inf"
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{" + ", ".join(f"{out(k)}: {out(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list | tuple):
            return "[" + ", ".join(out(x) for x in v) + "]"
        raise TypeError(type(v).__name__)

    return out(value) + "\n"


#: Endings that made a bad value pass ``re.match(...$)`` or that a reader strips.
SUFFIXES = ["\n", "\r\n", " ", "\t", "\x00", "\x0b", "\u0085", "\u2028", "\n\n"]
SPECIAL_SCALARS = [Raw(t) for t in (
    "1e999", "-.inf", ".nan", "2026-13-45", "2026-02-30T25:61:00", "!!int abc", "!!float x", "!!bool maybe",
    "!!timestamp foo", "!foo bar", "!!binary '@@@'", "!!str 5", "!!null x", "0x" + "f" * 40, "0b" + "1" * 200,
    "~", "yes", "off", "1_000", "190:20:30", "-0", "0o17", "'single''quoted'", "*undefined", "&dangling x",
    "<<", "? x", "|", ">",
)]

huge_integers = st.integers(30, 6000).map(lambda n: Raw("9" * n))
integers = st.one_of(st.integers(-(2**70), 2**70),
                     st.sampled_from([0, 1, 2, -1, 7, 8, 15, 16, 48, 49, 100, 101, 512, 513, 2**31, 2**63, 10**9]))
long_text = st.integers(200, 200_000).map(lambda n: "x" * n)
short_text = st.text(max_size=30)
suffixed = st.tuples(st.sampled_from(["h100", "nvidia.com/gpu", "1g.10gb", "all-1g.10gb", "550.90.07", "1.34",
                                      "DCGM_FI_DEV_GPU_UTIL", "pool", "v1", "gpu.example.com", "0x233010DE"]),
                     st.sampled_from(SUFFIXES)).map("".join)
leaves = st.one_of(st.none(), st.booleans(), integers, huge_integers, st.floats(), short_text, suffixed, long_text,
                   st.sampled_from(SPECIAL_SCALARS))
keys = st.one_of(short_text, suffixed, integers, huge_integers, st.integers(1100, 3000).map(lambda n: "k" * n))


def _structures(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4),
        st.builds(Aliased, children, st.integers(1, 3)),
    )


#: Anything at all: nested structures of nasty leaves, alias bombs, deep nesting.
_trees = st.recursive(leaves, _structures, max_leaves=12)
nasty = st.one_of(_trees, _trees, _trees, st.builds(Bomb, st.integers(2, 10)), st.builds(Deep, st.integers(10, 2000)))


Path = tuple[Any, ...]


def _paths(base: Any, prefix: Path = ()) -> list[tuple[Path, Any]]:
    """Every node of ``base`` with its path (keys and indices from the root)."""
    out: list[tuple[Path, Any]] = [(prefix, base)]
    if isinstance(base, dict):
        for k, v in base.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(base, list):
        for i, v in enumerate(base):
            out += _paths(v, (*prefix, i))
    return out


def _apply(base: Any, edits: list[tuple[str, Path, Any]]) -> Any:
    """``base`` (copied) with each edit made where its path still leads."""
    doc = copy.deepcopy(base)
    for kind, path, arg in edits:
        if not path:
            if kind == "set":
                doc = arg
            continue
        parent = doc
        for part in path[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                break
        else:
            last = path[-1]
            try:
                current = parent[last]
            except (KeyError, IndexError, TypeError):
                continue
            if kind == "set":
                parent[last] = arg
            elif kind == "bend" and isinstance(current, str):
                parent[last] = current + arg if arg[0] != "^" else arg[1:] + current
            elif kind == "add" and isinstance(current, dict):
                current[arg[0]] = arg[1]
            elif kind == "drop" and isinstance(parent, dict):
                del parent[last]
            elif kind == "repeat" and isinstance(current, list):
                parent[last] = current * 3
    return doc


def mutated(base: Any) -> st.SearchStrategy[Any]:
    """``base`` with up to three edits: a value replaced by a nasty one, a string bent (a trailing newline, a
    control character in front), an integer made huge, a key added or dropped, a list repeated. Few edits,
    so most of a document stays valid and the checks deep inside a schema are reached."""
    nodes = _paths(base)[1:]  # the root stays: replacing the whole document is what `nasty` alone does
    every = [p for p, _ in nodes] or [()]
    strings = [p for p, v in nodes if isinstance(v, str)] or every
    numbers = [p for p, v in nodes if isinstance(v, int) and not isinstance(v, bool)] or every
    mappings = [p for p, v in nodes if isinstance(v, dict)] or every
    lists = [p for p, v in nodes if isinstance(v, list)] or every
    bends = st.one_of(st.sampled_from(SUFFIXES), st.sampled_from(SUFFIXES).map(lambda s: "^" + s))
    edit = st.one_of(
        st.tuples(st.just("set"), st.sampled_from(every), nasty),
        st.tuples(st.just("bend"), st.sampled_from(strings), bends),
        st.tuples(st.just("set"), st.sampled_from(numbers), st.one_of(huge_integers, integers)),
        st.tuples(st.just("add"), st.sampled_from(mappings), st.tuples(keys, nasty)),
        st.tuples(st.just("drop"), st.sampled_from(every), st.none()),
        st.tuples(st.just("repeat"), st.sampled_from(lists), st.none()),
    )
    return st.lists(edit, max_size=3).map(lambda edits: _apply(base, edits))


def documents(bases: list[Any]) -> st.SearchStrategy[str]:
    """YAML text: a mutated base (half the time), anything nasty, or random text."""
    variants = st.one_of(*[mutated(b) for b in bases]).map(render)
    return st.one_of(variants, variants, variants, nasty.map(render), st.text(max_size=200))


def check_bounded(parse: Callable[[], object], error: type[Exception], located: re.Pattern[str],
                  problems: Callable[[Exception], list[str]]) -> None:
    """``parse()`` returns, or raises ``error`` whose message is at most :data:`MAX_MESSAGE` characters and
    whose every problem matches ``located`` (starts with where it is); within :data:`MAX_SECONDS` and
    :data:`MAX_PEAK_BYTES` of Python allocations. Any other exception fails the test."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        parse()
    except error as e:
        message = str(e)
        assert len(message) <= MAX_MESSAGE, (len(message), message[:500])
        lines = problems(e)
        assert lines, message
        for line in lines:
            assert located.match(line), line[:500]
    finally:
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < MAX_SECONDS, elapsed
    assert peak < MAX_PEAK_BYTES, peak
