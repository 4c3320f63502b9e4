"""``pulumi.Input`` values in the components' args: plain values validated at once, Outputs when they resolve.

The manifest builders (:mod:`nvidia_gpu.components.manifests`) are plain functions of plain values, tested
without the engine, and the namespace in particular is spelled into many of them (metadata, RBAC
subjects, cluster-scoped names, the device plugin's arguments). Rather than thread Outputs through
every builder, an Output gets a *stand-in*: a plain token that is itself a valid value of the field (a
DNS label for a namespace), so the builders and the stack-config models accept it unchanged.
:func:`bind`, called by :func:`nvidia_gpu.components.register.register` on each manifest, puts the
Output back wherever the token appears, as the whole property value or, inside a longer string, with
``Output.concat``. Only property values change: no resource is created inside an ``apply``, and the
logical names (hence URNs) never contain a token. A program of plain values registers no token, and
:func:`bind` returns its manifests untouched.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import pulumi
from pydantic import ValidationError

from nvgpu.errortext import shown
from nvgpu.k8snames import check_key, check_label_value
from nvgpu.stackconfig import AgentImage, image_parts

#: Stand-in token -> the (validated) Output it stands for, for this program's process.
_TOKENS: dict[str, pulumi.Output[str]] = {}
_COUNTER = itertools.count()
_pattern_cache: tuple[int, re.Pattern[str] | None] = (0, None)

#: Patterns here are ``fullmatch``ed: ``re.match`` with ``$`` also takes a trailing newline (``gpu\n`` as a
#: namespace; ``repo:1.0\n`` even lost the newline and became the tag ``1.0``).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: ``repository[:tag][@sha256:<hex>]``, the spelling :class:`nvgpu.stackconfig.AgentImage` renders.
#: The digest the stand-in image carries: an Output image has no tag known to the program, so the
#: ``app.kubernetes.io/version`` label (the tag) is left out of the objects that would carry it.
_STAND_IN_DIGEST = "sha256:" + "0" * 64


def is_plain(value: object) -> bool:
    """Not an Output (nor an awaitable): a value this program can check now."""
    return not isinstance(value, pulumi.Output) and not hasattr(value, "__await__")


def _checked(field: str, check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def run(value: Any) -> Any:
        try:
            return check(value)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{field}: {e}") from None
    return run


def check_namespace(value: object) -> str:
    if not isinstance(value, str) or len(value) > 63 or not DNS_LABEL.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a namespace name (a DNS label: lower-case letters, digits and '-', "
                         "at most 63 characters)")
    return value


def parse_image(value: object) -> AgentImage:
    """An image reference as :class:`AgentImage` (pinned by tag or digest, as the stack config requires)."""
    parts = image_parts(value) if isinstance(value, str) else None
    if parts is None:
        raise ValueError(f"{shown(value)} is not an image reference (repository[:tag][@sha256:digest])")
    try:
        return AgentImage(**parts)
    except ValidationError as e:
        raise ValueError("; ".join(err["msg"] for err in e.errors(include_url=False))) from None


def check_labels(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of label keys to values, got {type(value).__name__}")
    out = {}
    for key, val in value.items():
        try:
            out[check_key(key)] = check_label_value(val)
        except (ValueError, TypeError) as e:
            raise ValueError(f"[{key!r}]: {e}") from None
    return out


def stand_in(field: str, value: pulumi.Input[Any], check: Callable[[Any], Any], token: str | None = None) -> str:
    """The plain token for the Output ``value`` (checked by ``check`` when it resolves, errors naming ``field``)."""
    token = token or f"nvgpu-input-{next(_COUNTER)}x"
    _TOKENS[token] = pulumi.Output.from_input(value).apply(_checked(field, check))
    return token


def namespace(field: str, value: pulumi.Input[str]) -> str:
    """A namespace for the builders: the plain value, checked now, or a stand-in for an Output."""
    if is_plain(value):
        return str(_checked(field, check_namespace)(value))
    return stand_in(field, value, check_namespace)


def agent_image(field: str, value: pulumi.Input[str]) -> AgentImage:
    """The agent image: parsed and checked now, or a digest-pinned stand-in whose reference binds to the Output."""
    if is_plain(value):
        image: AgentImage = _checked(field, parse_image)(value)
        return image
    stand_in_image = AgentImage(repository=f"nvgpu-input-{next(_COUNTER)}x", digest=_STAND_IN_DIGEST)
    stand_in(field, value, lambda v: parse_image(v).ref, token=stand_in_image.ref)
    return stand_in_image


def labels(field: str, value: pulumi.Input[Mapping[str, pulumi.Input[str]]] | None) -> pulumi.Input[dict[str, str]]:
    """Extra labels: a plain mapping of plain strings checked now, anything holding an Output when it resolves."""
    if value is None:
        return {}
    if is_plain(value) and isinstance(value, Mapping) and all(is_plain(v) for v in value.values()):
        plain: dict[str, str] = _checked(field, check_labels)(value)
        return plain
    return pulumi.Output.from_input(value).apply(_checked(field, check_labels))


def with_labels(manifest: Mapping[str, Any], extra: pulumi.Input[dict[str, str]], field: str) -> dict[str, Any]:
    """``manifest`` with ``extra`` added to its ``metadata.labels``; a label of ours is never overridden."""
    if extra == {}:
        return dict(manifest)
    meta = dict(manifest.get("metadata") or {})
    ours = dict(meta.get("labels") or {})

    def merged(theirs: dict[str, str]) -> dict[str, str]:
        clash = sorted(k for k in theirs if k in ours and theirs[k] != ours[k])
        if clash:
            raise ValueError(f"{field}: {', '.join(clash)} would override the label the component sets")
        return {**theirs, **ours}

    if isinstance(extra, dict):
        meta["labels"] = merged(extra)
    else:  # an Output (or an awaitable) of the checked labels
        meta["labels"] = pulumi.Output.from_input(cast(Any, extra)).apply(merged)
    return {**manifest, "metadata": meta}


def resolve(text: str) -> pulumi.Input[str]:
    """``text`` with its stand-ins bound: itself when it holds none."""
    bound: pulumi.Input[str] = bind(text)
    return bound


def bind(value: Any) -> Any:
    """``value`` (a manifest, or any part of one) with every stand-in replaced by its Output."""
    pattern = _pattern()
    if pattern is None:
        return value
    return _bind(value, pattern)


def _pattern() -> re.Pattern[str] | None:
    global _pattern_cache
    count, pattern = _pattern_cache
    if count != len(_TOKENS):
        # Longest first: an image stand-in holds its repository's token.
        tokens = sorted(_TOKENS, key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, tokens))) if tokens else None
        _pattern_cache = (len(_TOKENS), pattern)
    return pattern


def _bind(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        if value in _TOKENS:
            return _TOKENS[value]
        parts: list[pulumi.Input[str]] = []
        pos = 0
        for m in pattern.finditer(value):
            parts += [value[pos:m.start()], _TOKENS[m.group()]]
            pos = m.end()
        if not parts:
            return value
        return pulumi.Output.concat(*parts, value[pos:])
    if isinstance(value, Mapping):
        for key in value:
            if isinstance(key, str) and pattern.search(key):
                raise ValueError(f"an Output cannot be a mapping key (in {key!r})")
        return {k: _bind(v, pattern) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bind(v, pattern) for v in value]
    return value
