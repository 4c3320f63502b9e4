"""A small, fast YAML emitter for JSON-shaped data (dicts, lists, strings, numbers, booleans, null).

Manifests, device-plugin configs and mig-parted configs are plain data, and PyYAML's Python
representer cost more than registering the objects did (``bench/bench_preview.py``). This writes
block-style YAML in PyYAML's default layout, quotes a string only when a YAML reader would take it
for something else (PyYAML's own implicit resolvers, plus YAML 1.2 numbers for Go readers), and
writes multi-line strings (scripts, embedded configs) as literal blocks so they stay readable.
Output always loads back with ``yaml.safe_load`` to the same data. No Pulumi here: the agent may use it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import yaml

_PLAIN = re.compile(r"^[A-Za-z0-9_./=+-][A-Za-z0-9_./=+:@-]*$")
_RESOLVER = yaml.resolver.Resolver()
#: What YAML 1.2 readers (Go's yaml.v3 in kubectl) take for numbers or booleans although PyYAML does not.
_OTHER_READERS = re.compile(r"^([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|0o[0-7]+|0x[0-9a-fA-F]+|[yYnN])$")
_SAFE_LITERAL = re.compile(r"^[^\r\x00-\x08\x0b-\x1f\x7f\u0085\u2028\u2029\ufeff]*$")


@lru_cache(maxsize=4096)
def scalar_text(value: str) -> str:
    """``value`` as a YAML scalar: plain when unambiguous, else JSON-quoted (a valid YAML double-quoted scalar)."""
    if (
        _PLAIN.match(value)
        and value not in ("-", "?", ":")
        and not value.endswith(":")
        and not _OTHER_READERS.match(value)
        and _RESOLVER.resolve(yaml.ScalarNode, value, (True, False)) == "tag:yaml.org,2002:str"  # type: ignore[no-untyped-call]
    ):
        return value
    return json.dumps(value)


_SINGLE_QUOTABLE = re.compile(r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$")


@lru_cache(maxsize=4096)
def single_quoted_text(value: str) -> str:
    """Like :func:`scalar_text`, but a printable one-line string that needs quotes gets PyYAML's single quotes.

    That is PyYAML's own choice for such strings, so data of that kind (mig-parted configs: names,
    profiles, PCI IDs) comes out byte for byte as ``yaml.safe_dump(..., sort_keys=False)`` writes it.
    """
    text = scalar_text(value)
    if text == value or not _SINGLE_QUOTABLE.match(value):
        return text
    return "'" + value.replace("'", "''") + "'"


def _scalar(value: Any, quote: Callable[[str], str] = scalar_text) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write non-finite number {value!r}")
        return repr(value)
    if isinstance(value, str):
        return quote(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _literal(value: str) -> str | None:
    """The block header (``|``, ``|-`` or ``|+``) when ``value`` can be a literal block, else None."""
    if "\n" not in value or not _SAFE_LITERAL.match(value) or value[:1] in (" ", "\t", "\n"):
        return None
    body = value.rstrip("\n")
    if any(line != line.rstrip(" \t") for line in body.split("\n")):
        return None
    if value.endswith("\n\n"):
        return "|+"
    return "|" if value.endswith("\n") else "|-"


def _block(value: str, indent: int, out: list[str]) -> None:
    pad = " " * indent
    body = value[:-1] if value.endswith("\n") else value
    out.extend(pad + line if line else "" for line in body.split("\n"))


def _mapping(data: dict[str, Any], indent: int, out: list[str], quote: Callable[[str], str]) -> None:
    pad = " " * indent
    for key, value in data.items():
        k = quote(str(key))
        if isinstance(value, dict) and value:
            out.append(f"{pad}{k}:")
            _mapping(value, indent + 2, out, quote)
        elif isinstance(value, list) and value:
            out.append(f"{pad}{k}:")
            _sequence(value, indent, out, quote)
        elif isinstance(value, str) and (header := _literal(value)):
            out.append(f"{pad}{k}: {header}")
            _block(value, indent + 2, out)
        else:
            out.append(f"{pad}{k}: {_empty_or_scalar(value, quote)}")


def _sequence(items: list[Any], indent: int, out: list[str], quote: Callable[[str], str]) -> None:
    pad = " " * indent
    for item in items:
        if isinstance(item, dict) and item:
            start = len(out)
            _mapping(item, indent + 2, out, quote)
            out[start] = f"{pad}- {out[start][indent + 2:]}"
        elif isinstance(item, list) and item:
            out.append(f"{pad}-")
            _sequence(item, indent + 2, out, quote)
        elif isinstance(item, str) and (header := _literal(item)):
            out.append(f"{pad}- {header}")
            _block(item, indent + 2, out)
        else:
            out.append(f"{pad}- {_empty_or_scalar(item, quote)}")


def _empty_or_scalar(value: Any, quote: Callable[[str], str]) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value, quote)


def dump(data: Any, *, single_quotes: bool = False) -> str:
    """One YAML document (no ``---``), ending with a newline.

    ``single_quotes``: quote with :func:`single_quoted_text` (PyYAML's style) instead of JSON's double quotes.
    """
    quote = single_quoted_text if single_quotes else scalar_text
    out: list[str] = []
    if isinstance(data, dict) and data:
        _mapping(data, 0, out, quote)
    elif isinstance(data, list) and data:
        _sequence(data, 0, out, quote)
    else:
        out.append(_empty_or_scalar(data, quote))
    return "\n".join(out) + "\n"
