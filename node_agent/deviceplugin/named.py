"""Picks the node's config among the named configs, like NVIDIA's config-manager does.

The components render one ConfigMap holding every named config (one key per name) mounted as a
directory; the node label ``nvidia.com/device-plugin.config`` names the one this node uses. An empty
label falls back to the default name, then to the fallback strategies in order: ``named`` (a config
called ``default``), ``single`` (the only config) and ``empty`` (no config file at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FALLBACKS: tuple[str, ...] = ("named", "single")
FALLBACK_STRATEGIES = ("named", "single", "empty")


class NamedConfigError(ValueError):
    """The label names a config that does not exist and no fallback applies."""


@dataclass(frozen=True)
class Selection:
    name: str | None  #: the chosen config's name, ``None`` for the empty config
    path: Path | None
    reason: str  #: label | default | fallback-named | fallback-single | fallback-empty

    def read(self) -> str | None:
        return None if self.path is None else self.path.read_text()


def available_configs(directory: Path) -> dict[str, Path]:
    """Config files of a mounted ConfigMap (kubelet's ``..data`` bookkeeping entries are skipped)."""
    if not directory.is_dir():
        return {}
    return {p.name: p for p in sorted(directory.iterdir()) if not p.name.startswith("..") and p.is_file()}


def select(available: dict[str, Path], label: str | None, default: str | None = None,
           fallbacks: Sequence[str] = DEFAULT_FALLBACKS) -> Selection:
    for f in fallbacks:
        if f not in FALLBACK_STRATEGIES:
            raise NamedConfigError(f"fallback strategy {f!r} is unknown; allowed: {', '.join(FALLBACK_STRATEGIES)}")
    if label:
        if label in available:
            return Selection(label, available[label], "label")
        raise NamedConfigError(
            f"node label names config {label!r}, which does not exist; available: {', '.join(available) or 'none'}"
        )
    if default:
        if default in available:
            return Selection(default, available[default], "default")
        raise NamedConfigError(
            f"default config {default!r} does not exist; available: {', '.join(available) or 'none'}"
        )
    for f in fallbacks:
        if f == "named" and "default" in available:
            return Selection("default", available["default"], "fallback-named")
        if f == "single" and len(available) == 1:
            (name, path), = available.items()
            return Selection(name, path, "fallback-single")
        if f == "empty":
            return Selection(None, None, "fallback-empty")
    raise NamedConfigError(
        f"no node label, no default config and no fallback ({', '.join(fallbacks)}) applies; "
        f"available: {', '.join(available) or 'none'}"
    )
