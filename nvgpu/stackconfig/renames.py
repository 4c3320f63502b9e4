"""The one deprecation path of a config key that was renamed.

A stack file written for an older release must keep loading after a key moves, and its author must learn
where the key went. Every renamed key goes through this module, never through a field kept for the old
spelling and checks of its own: a model lists its renamed keys in ``renamed_keys`` (a :class:`Rename`,
paths relative to the model, in the config's own spelling), and :class:`~nvgpu.stackconfig.common.ConfigModel`
moves each old key to its new place before the model validates. So the old spelling loads to the very model
the new one does, and:

- a model that validates with an old key emits one :class:`ConfigDeprecationWarning` per key, naming the
  old path, the new path and the value;
- both spellings at once is an error at the old path that names both (which one was meant is not ours to
  guess);
- a problem with the moved value is reported at the path the user wrote (:func:`as_written`), so an error
  never points at a key that is not in the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_snake

from nvgpu.errortext import shown

#: A path below a model, in the config's own key names.
Path = tuple[str, ...]


class ConfigDeprecationWarning(FutureWarning):
    """A stack config key is spelled as an older release spelled it (a FutureWarning: shown by default)."""


@dataclass(frozen=True)
class Rename:
    """One renamed key: ``old`` and ``new``, both paths below the model that lists it."""

    old: Path
    new: Path

    @property
    def old_text(self) -> str:
        return ".".join(self.old)

    @property
    def new_text(self) -> str:
        return ".".join(self.new)


class BothSpellings(ValueError):
    """An old key and its new spelling are both given (``renamed``: the renames concerned)."""

    def __init__(self, renamed: list[Rename]):
        self.renamed = renamed
        super().__init__("; ".join(both_message(r) for r in renamed))


def both_message(rename: Rename) -> str:
    return (f"both {rename.old_text} and {rename.new_text} are set, and {rename.old_text} is the old spelling of "
            f"{rename.new_text}: set the value once, as {rename.new_text}")


def deprecation_message(rename: Rename, value: Any, where: str = "") -> str:
    return (f"{where}{rename.old_text} is deprecated: write {where}{rename.new_text} instead (value "
            f"{shown(value)}, read as {rename.new_text} for now)")


_MISSING = object()


def _key(data: Mapping[str, Any], key: str) -> str | None:
    """The spelling of ``key`` that ``data`` uses (the alias, or the field name: both are accepted)."""
    for spelling in (key, to_snake(key)):
        if spelling in data:
            return spelling
    return None


def lookup(data: Any, path: Path) -> Any:
    """The raw value at ``path`` below ``data``, or ``_MISSING``."""
    for part in path:
        if not isinstance(data, Mapping) or (key := _key(data, part)) is None:
            return _MISSING
        data = data[key]
    return data


def present(data: Any, path: Path) -> bool:
    return lookup(data, path) is not _MISSING


def apply(renames: tuple[Rename, ...], data: Any) -> tuple[Any, list[tuple[Rename, Any]]]:
    """``data`` with every old key of ``renames`` moved to its new path (copied, never changed in place),
    and the renames applied with their values. Raises :class:`BothSpellings` where both are given; an old key
    whose new place is not a mapping is left where it is, for the model to refuse."""
    if not isinstance(data, Mapping):
        return data, []
    out: dict[str, Any] = dict(data)
    applied: list[tuple[Rename, Any]] = []
    both = [r for r in renames if present(out, r.old) and present(out, r.new)]
    if both:
        raise BothSpellings(both)
    for r in renames:
        value = lookup(out, r.old)
        if value is _MISSING or not _movable(out, r):
            continue
        _remove(out, r.old)
        _insert(out, r.new, value)
        applied.append((r, value))
    return out, applied


def _movable(data: dict[str, Any], rename: Rename) -> bool:
    node: Any = data
    for part in rename.new[:-1]:
        key = _key(node, part)
        if key is None:
            return True
        node = node[key]
        if not isinstance(node, Mapping):
            return False
    return True


def _remove(data: dict[str, Any], path: Path) -> None:
    node = data
    for part in path[:-1]:
        key = _key(node, part)
        assert key is not None
        node[key] = dict(node[key])
        node = node[key]
    key = _key(node, path[-1])
    assert key is not None
    del node[key]


def _insert(data: dict[str, Any], path: Path, value: Any) -> None:
    node = data
    for part in path[:-1]:
        key = _key(node, part) or part
        node[key] = dict(node.get(key) or {})
        node = node[key]
    node[path[-1]] = value


def written(loc: tuple[int | str, ...], renames: tuple[Rename, ...], data: Any) -> tuple[int | str, ...] | None:
    """``loc`` (relative to a model listing ``renames``, whose raw input was ``data``) with a new path replaced by
    the old one the input used, or None when it does not start with a renamed key's new path."""
    for r in renames:
        if loc[:len(r.new)] == r.new and present(data, r.old):
            return (*r.old, *loc[len(r.new):])
    return None
