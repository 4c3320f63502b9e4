"""Reading the stack config: a stack file's text or a ``config:`` map to a :class:`StackConfig`, and pydantic's
errors to the config's own paths.

Every problem is reported as ``nvidia-gpu:<path>: <problem> (got <value>)``; an unknown key lists the
allowed ones (and the closest, for a typo), a key written in another namespace is named as such, and a
problem with a renamed key's value is named at the spelling the file used. A stack file is read with
:func:`nvgpu.yamltext.load` (size, nesting, integers and aliases bounded).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from nvgpu import yamltext
from nvgpu.errortext import clip, index_part, path_part, shown
from nvgpu.stackconfig import renames
from nvgpu.stackconfig.common import CONFIG_NAMESPACE, ConfigModel, FieldProblems, Loc, StackConfigError
from nvgpu.stackconfig.stack import StackConfig


def _did_you_mean(word: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    if not close:
        folded = {c.lower(): c for c in choices}
        close = [folded[word.lower()]] if word.lower() in folded else []
    return f" (did you mean {close[0]!r}?)" if close else ""



def _format_loc(loc: tuple[int | str, ...]) -> str:
    """``nvidia-gpu:nodeGroups[0].gpu``; a key that is long or not printable is quoted and cut."""
    out = CONFIG_NAMESPACE + ":"
    first = True
    for part in loc:
        if isinstance(part, int):
            out += index_part(part)
        else:
            out += ("" if first else ".") + path_part(part)
        first = False
    return out


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str] | None:
    """Walk the schema along ``loc`` (minus the last part) to list the keys allowed there."""
    model: Any = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        info = fields.get(part)
        if info is None:
            return None
        model = _model_of(info.annotation)
        if model is None:
            return None
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _as_written(loc: Loc, values: Any) -> Loc:
    """``loc`` with a renamed key's new path replaced by the old one where ``values`` spell it the old way
    (:mod:`nvgpu.stackconfig.renames`): a problem is named at the key the user wrote."""
    model: Any = StackConfig
    data = values
    for i, part in enumerate(loc):
        if isinstance(model, type) and issubclass(model, ConfigModel) and isinstance(data, Mapping):
            old = renames.written(loc[i:], model.renamed_keys, data)
            if old is not None:
                return (*loc[:i], *old)
        if isinstance(part, int):
            data = data[part] if isinstance(data, list) and 0 <= part < len(data) else None
            continue
        if model is None or not isinstance(data, Mapping):
            break
        info = {f.alias or n: f for n, f in model.model_fields.items()}.get(part)
        model = _model_of(info.annotation) if info is not None else None
        data = renames.lookup(data, (part,))
    return loc


def _problems(err: ValidationError, values: Any = None) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        loc = _as_written(tuple(p for p in e["loc"] if p not in ("function-after",)), values)
        where = _format_loc(loc)
        kind = e["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_keys(loc)
            hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
            guess = _did_you_mean(str(loc[-1]), allowed) if allowed and loc else ""
            problems.append(clip(f"{where}: unknown key{guess}{hint}"))
            continue
        error = (e.get("ctx") or {}).get("error")
        if isinstance(error, FieldProblems):
            problems += [f"{_format_loc(_as_written(loc + rel, values))}: {message}" for rel, message in error.problems]
            continue
        msg = clip(e["msg"].removeprefix("Value error, "))
        if kind == "enum":
            msg = "not an allowed value; allowed: " + e.get("ctx", {}).get("expected", "")
        elif kind == "missing":
            problems.append(f"{where}: required key is missing")
            continue
        value = e.get("input")
        if kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML reads an unquoted 550 or 1.0 as a number (and 1.10 as 1.1): the text is what was meant.
            number = shown(value)
            example = f", e.g. \"{number}\"" if number[:1].isdigit() or number[:1] == "-" else ""
            problems.append(clip(f"{where}: must be text, and YAML reads an unquoted {number} as a number; "
                                 f"quote it as it should read{example}"))
            continue
        got = "" if isinstance(value, (dict, list)) else f" (got {shown(value)})"
        problems.append(clip(f"{where}: {msg}{got}"))
    return problems


def load_stack_config(values: Mapping[str, Any]) -> StackConfig:
    """Validate the ``nvidia-gpu:`` namespace (keys without the prefix: ``cluster``, ``nodeGroups``)."""
    try:
        return StackConfig.model_validate(dict(values))
    except ValidationError as e:
        raise StackConfigError(_problems(e, values)) from None


def namespace_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """Pick the ``nvidia-gpu:*`` keys out of a stack file's ``config:`` map; other namespaces are not ours."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        ns, _, short = key.partition(":")
        if ns == CONFIG_NAMESPACE and short:
            out[short] = value
    return out


def misplaced_keys(config: Mapping[str, Any]) -> dict[str, str]:
    """Our top-level keys (``cluster``, ``nodeGroups``) written in another namespace: short key -> problem.

    Pulumi puts a key without a namespace in the project's (``cluster:`` in a project named ``gpu-platform``
    is ``gpu-platform:cluster``), so a stack of a project with another name that forgets the prefix reaches
    this program without its config; say which key and how to write it instead of "required key is missing".
    """
    top = {f.alias or n for n, f in StackConfig.model_fields.items()}
    out: dict[str, str] = {}
    for key in config:
        ns, sep, short = str(key).rpartition(":")
        if short in top and ns != CONFIG_NAMESPACE:
            where = f"in the namespace {ns!r}" if sep else "without a namespace"
            out[short] = (f"{CONFIG_NAMESPACE}:{short}: missing, but the config has {shown(key)} {where}; write "
                          f"{CONFIG_NAMESPACE}:{short} (Pulumi gives a key without a namespace the project's name)")
    return out


def load_namespaced_config(config: Mapping[str, Any], decode: Callable[[Any], Any] | None = None) -> StackConfig:
    """Validate a whole ``config:`` map of namespaced keys: ours picked out (and decoded), and our
    top-level keys that are missing because they were written in another namespace named as such."""
    values = namespace_values(config)
    if decode is not None:
        values = {k: decode(v) for k, v in values.items()}
    try:
        return load_stack_config(values)
    except StackConfigError as e:
        hints = {short: why for short, why in misplaced_keys(config).items() if short not in values}
        if not hints:
            raise
        missing = {f"{CONFIG_NAMESPACE}:{s}: required key is missing" for s in hints}
        rest = [p for p in e.problems if p not in missing]
        raise StackConfigError([*hints.values(), *rest]) from None


def read_stack_text(text: str, source: str) -> dict[str, Any]:
    """The ``nvidia-gpu:*`` values of a stack file's text (``source`` names it in errors), unvalidated.

    YAML aliases are allowed, as Pulumi's own reader allows them (a block shared between node groups),
    up to :data:`nvgpu.yamltext.MAX_EXPANDED_NODES` values expanded; size, nesting and integers are
    bounded too (:func:`nvgpu.yamltext.load`). A problem raises :class:`StackConfigError`.
    """
    return namespace_values(_config_map(text, source))


def _config_map(text: str, source: str) -> dict[str, Any]:
    try:
        doc = yamltext.load(text, source, aliases=True) or {}
    except yamltext.YamlLoadError as e:
        raise StackConfigError([f"{source}: cannot read stack file: {e.where + ': ' if e.where else ''}"
                                f"{e.problem}"]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config", {}), dict):
        raise StackConfigError([f"{source}: expected a mapping with a 'config:' mapping"])
    return dict(doc.get("config") or {})


def load_stack_text(text: str, source: str = "stack file") -> StackConfig:
    """Read and validate a stack file's text (:func:`load_namespaced_config` on its ``config:`` map)."""
    return load_namespaced_config(_config_map(text, source))


def load_stack_file(path: Path) -> StackConfig:
    """Read ``Pulumi.<stack>.yaml`` directly (the offline preview and the policy tools use this)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise StackConfigError([f"{path}: cannot read stack file: {clip(str(e), 300)}"]) from None
    return load_stack_text(text, str(path))
