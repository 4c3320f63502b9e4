"""A small TOML writer for containerd configs (the standard library only reads TOML).

Enough for what containerd configs hold: tables, strings, booleans, integers, floats, arrays of
scalars and inline tables. The output is checked by parsing it back with ``tomllib``.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else json.dumps(k)


def dotted(path: Sequence[str]) -> str:
    """A key path as TOML writes it (``registry.mirrors."docker.io".endpoint``), for messages naming a key."""
    return ".".join(_key(p) for p in path)


def flatten(doc: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every leaf of ``doc`` (a value that is not a table) by its key path: what two configs differ in is
    then a comparison of two flat maps, key by key."""
    out: dict[tuple[str, ...], Any] = {}
    for k, v in doc.items():
        if isinstance(v, Mapping):
            out |= flatten(v, (*prefix, k))
        else:
            out[(*prefix, k)] = v
    return out


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dumps(doc: Mapping[str, Any]) -> str:
    lines: list[str] = []

    def table(path: list[str], d: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, Mapping)}
        tables = {k: v for k, v in d.items() if isinstance(v, Mapping)}
        if path and (scalars or not tables):
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        for k, v in scalars.items():
            lines.append(f"{_key(k)} = {_value(v)}")
        for k, v in tables.items():
            table([*path, k], v)

    table([], doc)
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != doc:
        raise ValueError("TOML round trip changed the document")
    return text
