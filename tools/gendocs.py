#!/usr/bin/env python3
"""Write the reference pages under ``docs/reference/`` from what they document: ``make docs-reference``.

A reference kept by hand drifts from the code: the README's stack-config table lacked the ranges of keys
added after it was written (``maxUnavailable``, ``drainTimeoutSeconds``). These pages are generated from
the definitions the code itself runs on, and tests/repo/test_docs_reference.py fails when one is stale, so
a change to a model, a flag, a metric, an alert or a Node writer comes with its page:

- ``stack-config.md``: the pydantic models of :mod:`nvgpu.stackconfig`, walked from ``StackConfig``: each
  key's camelCase name (the models' ``to_camel`` aliases), type, default, range (``Field``'s bounds and
  lengths) or allowed values (``Literal``, enums), and its description, the ``#:`` comment above the field
  (an enum's values add theirs);
- ``cli.md``: the node agent's parser (:func:`node_agent.cli.build_parser`, built for each command, as a
  command line selects it), with defaults read from the environment named as such;
- ``metrics.md``: the exporter's DCGM fields (:data:`node_agent.exporter.fields.FIELDS`) and its own series
  (:data:`node_agent.exporter.collector.SERIES`), and each agent's prometheus_client metrics as its class
  registers them;
- ``alerts.md``: the groups of the PrometheusRule the stack renders
  (:func:`nvidia_gpu.components.manifests.alerts.rule_groups`);
- ``labels.md``: what each Node writer may change (:data:`node_agent.kube.nodeowner.WRITERS`, the lists
  the admission policy confines the agents to) and every label, annotation and taint key of
  :mod:`nvgpu.labels` and :mod:`nvgpu.driver` with its ``#:`` comment.

Descriptions are the sources' own comments: ``#:`` lines above an attribute (or at the end of its line), as
Sphinx reads them, found with :mod:`ast` and :mod:`tokenize` since Python keeps no comment at run time.
The output is deterministic: the sources' order where it means something (fields, flags, alerts), sorted
elsewhere, and nothing from the machine, the clock or the environment. Nothing here imports Pulumi: the
manifest builders it reads are pure (.importlinter).

    python tools/gendocs.py            write every page
    python tools/gendocs.py --check    name the stale pages and exit 1, writing nothing
"""

# ruff: noqa: E402  (the project's packages are imported after this script puts the checkout on the path)

from __future__ import annotations

import argparse
import enum
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages are beside tools/
    sys.path.insert(0, str(REPO))

import annotated_types
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from pydantic import AfterValidator, BaseModel
from pydantic.fields import FieldInfo

import nvgpu.driver
import nvgpu.labels
import nvgpu.nodelabels
from node_agent.cli import build_parser, exitcodes
from node_agent.cli.commands import COMMANDS
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.dra.metrics import DraMetrics
from node_agent.exporter import collector
from node_agent.exporter.fields import DEFAULT_FIELDS, FIELDS, NOT_FROM_NVML
from node_agent.kube import nodeowner
from node_agent.mig.metrics import MigMetrics
from node_agent.setup.monitor import CheckMonitor
from nvgpu import attrdocs, catalogue, stackconfig
from nvgpu.k8snames import check_dns_label, check_dns_subdomain, check_key, check_label_value, qualified_name_problem
from nvgpu.stackconfig.common import INT64_MAX, check_digest, check_repository, check_tag
from nvidia_gpu import reference
from nvidia_gpu.components.manifests import alerts, monitoring

OUT = REPO / "docs" / "reference"
COMMAND = "make docs-reference"
SCRIPT = "tools/gendocs.py"


# -- the sources' own comments ----------------------------------------------------------------------------


def attribute_docs(owner: type | types.ModuleType) -> Mapping[str, str]:
    """The documented attributes of a class (with its bases') or a module (its top level), by name."""
    if isinstance(owner, types.ModuleType):
        return attrdocs.module_docs(owner)
    return attrdocs.attribute_docs(owner)


def own_doc(owner: type) -> str:
    """A class's own docstring, as one paragraph per blank-line-separated block ("" when it has none)."""
    doc = vars(owner).get("__doc__")
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def _named(value: object, module: types.ModuleType) -> str | None:
    """The module attribute that ``value`` is (by identity), to find its ``#:`` comment or name it."""
    return next((n for n, v in sorted(vars(module).items()) if v is value and n.isupper()), None)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def md(text: str) -> str:
    """reStructuredText's inline markup in Markdown: ````x```` and ``:role:`x``` as code spans."""
    text = _ROLE.sub(lambda m: "``" + m.group(1) + "``", text)
    return text.replace("``", "`")


def paragraphs(doc: str) -> str:
    """A docstring in Markdown: its blocks as paragraphs, each block's lines joined."""
    return "\n\n".join(md(" ".join(block.split())) for block in doc.split("\n\n") if block.strip())


# -- Markdown ---------------------------------------------------------------------------------------------

_SPAN = re.compile(r"(`+)(.+?)\1")


def cell(text: str) -> str:
    """One table cell: one line, ``|`` escaped, and outside code spans ``<``, ``>`` and ``*`` too (read as
    HTML and emphasis otherwise: ``all-<profile>`` would lose its word)."""
    text = " ".join(text.split())
    out, last = [], 0
    for m in _SPAN.finditer(text):
        out.append(_plain(text[last:m.start()]))
        out.append(m.group(0).replace("|", "\\|"))
        last = m.end()
    out.append(_plain(text[last:]))
    return "".join(out)


def _plain(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def code(text: str) -> str:
    """``text`` as one code span, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def page(title: str, source: str, edit: str, body: Sequence[str]) -> str:
    """A page: the do-not-edit line first (for whoever opens the file), then the title and the same in words."""
    head = [f"<!-- Generated by `{COMMAND}` ({SCRIPT}) from {source}: do not edit; {edit}, then run it. -->",
            f"# {title}", f"*Generated from {source} by `{COMMAND}`: {edit}, not this page.*"]
    return "\n\n".join([*head, *(b.strip("\n") for b in body if b.strip())]) + "\n"


# -- stack-config.md --------------------------------------------------------------------------------------

#: The value checks of the config's types, by what they accept (the function is the type's identity:
#: pydantic keeps the validator, not the alias name).
_FORMATS: dict[object, str] = {
    check_dns_label: "DNS label",
    check_dns_subdomain: "DNS subdomain",
    check_key: "label key",
    check_label_value: "label value",
    check_repository: "image repository",
    check_tag: "image tag",
    check_digest: "image digest, sha256:…",
}
_SCALARS: dict[object, str] = {str: "string", int: "integer", bool: "boolean", float: "number"}


@dataclass
class TypeInfo:
    """What a field's type says to a reader."""

    text: str
    #: Allowed values (``Literal``, an enum), as written in YAML.
    values: list[str] = field(default_factory=list)
    #: The values' own ``#:`` docs (an enum's members).
    value_docs: dict[str, str] = field(default_factory=dict)
    bounds: list[str] = field(default_factory=list)
    #: The nested model and the path step to it (``""``, or ``"[]"`` for a list of them).
    model: type[BaseModel] | None = None
    step: str = ""


def _yaml(value: object) -> str:
    if isinstance(value, enum.Enum):
        return _yaml(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # quoted where YAML would read another type ("1", "true", "")
        return value if value and yaml.safe_load(value) == value else f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _bounds(meta: Sequence[object], what: str) -> list[str]:
    """``ge``/``le`` (and ``gt``/``lt``) as a range, lengths in ``what`` (items, characters)."""
    low = high = None
    short = long_ = None
    for m in meta:
        if isinstance(m, FieldInfo):
            return _bounds(m.metadata, what)
        if isinstance(m, annotated_types.Ge):
            low = f"{m.ge}"
        elif isinstance(m, annotated_types.Gt):
            low = f"more than {m.gt}"
        elif isinstance(m, annotated_types.Le):
            high = None if m.le == INT64_MAX else f"{m.le}"  # int64's limit: the API server's, no user's
        elif isinstance(m, annotated_types.Lt):
            high = f"less than {m.lt}"
        elif isinstance(m, annotated_types.MinLen):
            short = m.min_length
        elif isinstance(m, annotated_types.MaxLen):
            long_ = m.max_length
    def count(n: int) -> str:
        return f"{n} {what}" if n != 1 else f"1 {what.removesuffix('s')}"

    out = []
    if low is not None and high is not None:
        out.append(f"`{low}` to `{high}`")
    elif low is not None:
        out.append(f"at least `{low}`")
    elif high is not None:
        out.append(f"at most `{high}`")
    if short is not None and long_ is not None:
        out.append(f"{short} to {count(long_)}")
    elif short is not None:
        out.append(f"at least {count(short)}")
    elif long_ is not None:
        out.append(f"at most {count(long_)}")
    return out


def type_info(tp: object, meta: Sequence[object] = ()) -> TypeInfo:
    """A field's annotation (and the constraints pydantic moved off it, ``meta``) in a reader's words."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_info(args[0], [*meta, *args[1:]])
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        if len(kept) == 1:
            return type_info(kept[0], meta)
        parts = [type_info(a) for a in kept]
        return TypeInfo(" or ".join(p.text for p in parts), bounds=_bounds(meta, "items"))
    if origin is typing.Literal:
        return TypeInfo(_SCALARS.get(type(args[0]), "value"), values=[_yaml(a) for a in args])
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        docs = attribute_docs(tp)
        members = list(tp)
        return TypeInfo(_SCALARS.get(type(members[0].value), "value"), values=[_yaml(m) for m in members],
                        value_docs={_yaml(m): docs[m.name] for m in members if m.name in docs})
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return TypeInfo("object", model=tp)
    if origin in (list, tuple, set, frozenset):
        item = type_info(args[0])
        each = [f"each {b}" for b in item.bounds]
        return TypeInfo(f"list of {item.text}", values=item.values, value_docs=item.value_docs,
                        bounds=_bounds(meta, "items") + each, model=item.model,
                        step="[]" if item.model is not None else "")
    if origin is dict:
        key, value = type_info(args[0]), type_info(args[1])
        each = [f"each value {b}" for b in value.bounds]
        return TypeInfo(f"map of {key.text} to {value.text}", bounds=_bounds(meta, "entries") + each)
    text = _SCALARS.get(tp, getattr(tp, "__name__", str(tp)))
    formats = [_FORMATS[m.func] for m in meta if isinstance(m, AfterValidator) and m.func in _FORMATS]
    if formats:
        text += f" ({', '.join(formats)})"
    return TypeInfo(text, bounds=_bounds(meta, "characters" if tp is str else "items"))


@dataclass(frozen=True)
class ConfigKey:
    """One row of the stack-config reference."""

    path: str
    type: str
    default: str
    allowed: str
    description: str


@dataclass(frozen=True)
class ConfigSection:
    """One model, at the path the config reaches it by."""

    path: str
    model: type[BaseModel]
    keys: tuple[ConfigKey, ...]


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    return code(_yaml(value))


def _sentence(text: str) -> str:
    return text if not text or text.endswith((".", "!", "?")) else text + "."


def _description(doc: str, t: TypeInfo) -> str:
    """The field's ``#:`` comment (a nested model's own docstring where the field has none), then what each
    documented value of its enum means."""
    if not doc and t.model is not None:
        doc = " ".join(own_doc(t.model).split("\n\n")[0].split())
    parts = [md(doc)] if doc else []
    parts += [f"`{v}`: {md(t.value_docs[v])}" for v in t.values if v in t.value_docs]
    return " ".join(_sentence(p) for p in parts)


def config_sections(model: type[BaseModel] = stackconfig.StackConfig, path: str = "") -> list[ConfigSection]:
    """``model``'s keys and then, depth first in field order, the sections of the models below it."""
    docs = attribute_docs(model)
    keys: list[ConfigKey] = []
    below: list[ConfigSection] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        t = type_info(info.annotation, info.metadata)
        full = f"{path}.{key}" if path else key
        allowed = ", ".join(f"`{v}`" for v in t.values)
        allowed = "; ".join(x for x in (allowed, *t.bounds) if x)
        keys.append(ConfigKey(full, t.text, _default(info), allowed, _description(docs.get(name, ""), t)))
        if t.model is not None:
            below += config_sections(t.model, full + t.step)
    return [ConfigSection(path, model, tuple(keys)), *below]


def renamed_keys(sections: Sequence[ConfigSection]) -> list[tuple[str, str]]:
    """Every renamed key (old path, new path) of the models the config reaches."""
    return [(f"{s.path}.{r.old_text}" if s.path else r.old_text, f"{s.path}.{r.new_text}" if s.path else r.new_text)
            for s in sections for r in getattr(s.model, "renamed_keys", ())]


def stack_config_page() -> str:
    sections = config_sections()
    body = [
        f"Every key lives in the `{stackconfig.CONFIG_NAMESPACE}:` namespace of `Pulumi.<stack>.yaml`: "
        f"`{stackconfig.CONFIG_NAMESPACE}:cluster` and `{stackconfig.CONFIG_NAMESPACE}:nodeGroups`. Keys are "
        "camelCase (snake_case is accepted), and an unknown key is an error naming its path. "
        f"Kubernetes 1.{stackconfig.MIN_KUBERNETES_MINOR} to 1.{stackconfig.MAX_KUBERNETES_MINOR} are supported "
        f"(`cluster.kubernetesVersion`); allocation mode `dra` needs 1.{stackconfig.DRA_GA_MINOR} or later.",
        "Each section is one model of `nvgpu/stackconfig`; *Allowed* is what the model's type admits "
        "(values, ranges, lengths). Checks across keys (a block only allowed with one sharing mode, DRA "
        "against the Kubernetes version, ...) are in the models' validators and name the key to change.",
    ]
    for s in sections:
        title = f"`{stackconfig.CONFIG_NAMESPACE}:{s.path}`" if s.path else f"`{stackconfig.CONFIG_NAMESPACE}:`"
        intro = paragraphs(own_doc(s.model)) if own_doc(s.model) and s.model is not stackconfig.StackConfig else ""
        rows = [(code(k.path), k.type, k.default, k.allowed, k.description) for k in s.keys]
        body += [f"## {title}", intro, table(("Key", "Type", "Default", "Allowed", "Description"), rows)]
    body += ["## GPU models (`nodeGroups[].gpu.model`)",
             "The catalogue (`nvgpu.catalogue`) the model checks read: each model's minimum driver (never below "
             f"the global {catalogue.GLOBAL_MIN_DRIVER}) and, for a MIG-capable one, its MIG profiles and the driver "
             "MIG needs. A model the catalogue lacks is accepted under a name of its own; its checks then run on "
             "the node.",
             table(("Model", "NVML names", "Architecture", "Memory (MiB)", "Minimum driver", "MIG profiles"),
                   [(code(m.key), ", ".join(m.product_names), m.architecture, str(m.memory_mib),
                     code(m.effective_min_driver),
                     (", ".join(code(n) for n in m.mig.profile_names) + f" (driver {code(m.mig.min_driver)})")
                     if m.mig else "") for m in catalogue.MODELS])]
    renamed = renamed_keys(sections)
    if renamed:
        body += ["## Renamed keys",
                 "A key an older release spelled otherwise still loads, with a warning naming both paths "
                 "(both spellings at once is an error).",
                 table(("Old key", "Now"), [(code(old), code(new)) for old, new in renamed])]
    return page("Stack config reference", "the models of `nvgpu/stackconfig`",
                "edit the models' `#:` comments and fields", body)


def undocumented_config_keys() -> list[str]:
    """Stack-config keys without a description: what the models still lack."""
    return [k.path for s in config_sections() for k in s.keys if not k.description]


# -- cli.md -----------------------------------------------------------------------------------------------


class _RecordingEnviron(dict[str, str]):
    """An environment that remembers which variables were asked for."""

    def __init__(self, values: Mapping[str, str]) -> None:
        super().__init__(values)
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.asked.add(key)
        return super().__contains__(key)


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[_RecordingEnviron]:
    """``os.environ`` replaced while the parsers are built: their defaults then come from ``values`` alone,
    not from the machine that runs the generator."""
    fake = _RecordingEnviron(values)
    with mock.patch.object(os, "environ", fake):  # read through os.environ / os.getenv; no child process here
        yield fake


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser], dict[str, str]]:
    """The top parser, every command's parser (as the command line that selects it builds it), and the
    environment variables some defaults come from: each default that follows a variable set to ``$NAME``."""
    with _environment({}) as env:
        top = build_parser(None)
        plain = {c.name: _subparsers(build_parser(c.name))[c.name] for c in COMMANDS}
    asked = sorted(env.asked)
    with _environment({name: f"${name}" for name in asked}):
        marked = {c.name: _subparsers(build_parser(c.name))[c.name] for c in COMMANDS}
        marked_top = build_parser(None)
    from_env: dict[str, str] = {}
    for key, p, m in [("", top, marked_top), *((n, plain[n], marked[n]) for n in plain)]:
        for (where, a), (_, b) in zip(_all_actions(p, key), _all_actions(m, key), strict=True):
            if str(b.default).startswith("$") and str(a.default) != str(b.default):
                from_env[f"{where} {b.dest}"] = str(b.default)
    return top, plain, from_env


def _all_actions(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        yield prefix, action
    for name, child in sorted(_subparsers(parser).items()):
        yield from _all_actions(child, f"{prefix} {name}".strip())


def _metavar(action: argparse.Action) -> str:
    """What ``--help`` shows for the value: the metavar, else the choices, else the name."""
    if isinstance(action.metavar, str):
        return action.metavar
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _option(action: argparse.Action) -> str:
    if not action.option_strings:
        return _metavar(action)
    return ", ".join(action.option_strings) + (f" {_metavar(action)}" if action.nargs != 0 else "")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as ``--help`` prints it (``%(default)s`` expanded), and the choices where a metavar hides them."""
    text = _sentence(parser._get_formatter()._expand_help(action)) if action.help else ""
    if action.choices and isinstance(action.metavar, str):
        text = (text + " " if text else "") + "One of " + ", ".join(f"`{c}`" for c in action.choices) + "."
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text.lower():
        text = (text + " " if text else "") + "Repeatable."
    if action.required and action.option_strings:
        text = "Required. " + text
    return md(text)


def _cli_default(action: argparse.Action, env_default: str | None) -> str:
    if action.nargs == 0 or action.default is argparse.SUPPRESS:
        return ""
    plain = "" if action.default in (None, "", []) else code(_yaml(action.default))
    if env_default is not None:
        return f"`{env_default}`" + (f", else {plain}" if plain else "")
    return plain


def _positional(action: argparse.Action) -> str:
    name = _metavar(action)
    return {"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} ..."}.get(str(action.nargs), name)


def _own_actions(parser: argparse.ArgumentParser, skip: set[str]) -> list[argparse.Action]:
    """A parser's arguments, without help, version, subcommands and the global options repeated after it."""
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
            and not (a.default is argparse.SUPPRESS and set(a.option_strings) & skip)]


def _actions_table(parser: argparse.ArgumentParser, key: str, skip: set[str], from_env: Mapping[str, str]) -> str:
    rows = [(code(_option(a)), _cli_default(a, from_env.get(f"{key} {a.dest}")), _help(parser, a))
            for a in _own_actions(parser, skip)]
    if not rows:
        return "No arguments of its own."
    out = table(("Argument", "Default", "Description"), rows)
    exclusive = [", ".join(code(a.option_strings[0]) for a in g._group_actions if a.option_strings)
                 for g in parser._mutually_exclusive_groups]
    return out + "".join(f"\n\nAt most one of {e}." for e in exclusive if e)


def _command_sections(name: str, parser: argparse.ArgumentParser, helps: Mapping[str, str], skip: set[str],
                      from_env: Mapping[str, str], *, level: int = 2) -> list[str]:
    children = _subparsers(parser)
    own = _own_actions(parser, skip)
    words = ["python -m node_agent [global options]", name, *(["[options]"] if any(a.option_strings for a in own)
                                                             else []),
             *(_positional(a) for a in own if not a.option_strings),
             *(["<subcommand> ..."] if children else [])]
    synopsis = " ".join(words)
    out = [f"{'#' * level} `{name}`", md(helps.get(name, "")), md(parser.description or "")
           if parser.description and parser.description != helps.get(name) else "", f"```text\n{synopsis}\n```"]
    out.append(_actions_table(parser, name, skip, from_env))
    for child_name, child in children.items():
        child_help = next((a.help for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                           for c in a._choices_actions if c.dest == child_name), None) or ""
        out += _command_sections(f"{name} {child_name}", child, {**helps, f"{name} {child_name}": child_help},
                                 skip, from_env, level=min(level + 1, 4))
    return out


def cli_page() -> str:
    top, parsers, from_env = _command_parsers()
    helps = {c.name: c.help for c in COMMANDS}
    global_options = {s for a in top._actions for s in a.option_strings}
    body = [
        "`python -m node_agent [global options] <command> ...` (the agent image's entry point). The global "
        "options may also follow the command. Defaults shown as `$NAME` are read from that environment "
        "variable when the parser is built.",
        "## Global options",
        _actions_table(top, "", set(), from_env),
        "## Exit codes",
        table(("Code", "Meaning"), [(code(str(v)), md(d)) for v, d in _exit_codes()]),
        "## Commands",
        table(("Command", "What it does"), [(code(c.name), md(c.help)) for c in COMMANDS]),
    ]
    for c in COMMANDS:
        body += _command_sections(c.name, parsers[c.name], helps, global_options, from_env)
    return page("Node agent command line", "the parser of `node_agent.cli`",
                "edit the commands' `add_argument` help", body)


def _exit_codes() -> list[tuple[int, str]]:
    """The exit codes as ``node_agent.cli.exitcodes`` defines them, each with its ``#:`` comment."""
    docs = attribute_docs(exitcodes)
    return sorted((int(getattr(exitcodes, name)), doc) for name, doc in docs.items()
                  if isinstance(getattr(exitcodes, name), int))


# -- metrics.md -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricRow:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


def registered_metrics(holder: object) -> list[MetricRow]:
    """The prometheus_client metrics an agent's metrics object registers, in the order it creates them: the
    name as served (a counter's with ``_total``), type, label names and help."""
    out = []
    for metric in vars(holder).values():
        if isinstance(metric, MetricWrapperBase):
            family = next(iter(metric.describe()))
            name = family.name + ("_total" if family.type == "counter" else "")
            out.append(MetricRow(name, family.type, tuple(metric._labelnames), family.documentation))
    return out


def _never_checked() -> Any:
    raise AssertionError("the reference only reads the monitor's metrics")


#: Each agent's metrics: its title, the command that serves them, its object (a fresh registry each).
AGENT_METRICS: tuple[tuple[str, str, Callable[[], object]], ...] = (
    ("Device plugin", "device-plugin", lambda: PluginMetrics(CollectorRegistry())),
    ("DRA kubelet plugin", "dra-driver", lambda: DraMetrics("gpu.nvidia.com", CollectorRegistry())),
    ("MIG manager", "mig-manager", lambda: MigMetrics(CollectorRegistry())),
    ("Node check (node setup's monitor)", "setup-monitor", lambda: CheckMonitor(_never_checked, CollectorRegistry())),
)


def exporter_rows() -> list[MetricRow]:
    """The exporter's own series (:data:`collector.SERIES`), each with its ``#:`` comment after its help."""
    docs = attribute_docs(collector)
    rows = []
    for series in collector.SERIES:
        doc = docs.get(_named(series, collector) or "", "")
        rows.append(MetricRow(series.name, series.kind, series.labels, f"{series.help} {doc}".strip()))
    return rows


def _kind(kind: str) -> str:
    return "histogram (`_bucket`, `_sum`, `_count`)" if kind == "histogram" else kind


def _labels(labels: Sequence[str]) -> str:
    return ", ".join(code(label) for label in labels) or "none"


def metrics_page() -> str:
    defaults = set(DEFAULT_FIELDS)
    fields = [(code(f.name), f.kind, "yes" if f.name in defaults else "", "yes" if f.per_mig else "", md(f.help))
              for f in FIELDS.values()]
    body = [
        "Every metric an agent serves, from its definition. The GPU metrics keep dcgm-exporter's names, types "
        "and labels, so its dashboards and alerts work with either exporter (`cluster.monitoring.exporter`).",
        "## GPU metrics (`exporter`)",
        paragraphs(collector.__doc__ or ""),
        f"Every field's series carry {_labels(collector.GPU_LABELS)}; {_labels(collector.POD_LABELS)} where one "
        f"container holds the device; {_labels(collector.MIG_LABELS)} on a MIG device's series (the fields "
        "marked *Per MIG device*: on a GPU in MIG mode they are served per MIG device only). *Default* marks the "
        "fields served without a counters file (`cluster.monitoring.counters` chooses others).",
        table(("Field", "Type", "Default", "Per MIG device", "Help"), fields),
        "### The exporter's own series",
        table(("Metric", "Type", "Labels", "Help"),
              [(code(r.name), _kind(r.kind), _labels(r.labels), md(r.help)) for r in exporter_rows()]),
        "### Fields the agent exporter does not serve",
        "dcgm-exporter serves these (`cluster.monitoring.exporter: dcgm`); the agent exporter warns once when a "
        "counters file asks for one.",
        table(("Field", "Why"), [(code(k), md(v)) for k, v in sorted(NOT_FROM_NVML.items())]),
    ]
    for title, command, make in AGENT_METRICS:
        holder = make()
        module = sys.modules[type(holder).__module__]
        body += [f"## {title} (`{command}`)", paragraphs(module.__doc__ or ""),
                 table(("Metric", "Type", "Labels", "Help"),
                       [(code(r.name), _kind(r.kind), _labels(r.labels), md(r.help))
                        for r in registered_metrics(holder)])]
    return page("Metrics reference", "`node_agent.exporter` and the agents' metrics modules",
                "edit the metrics' definitions", body)


def metric_names() -> list[str]:
    """Every metric name the page lists (the coverage test's other half)."""
    names = [*FIELDS, *(r.name for r in exporter_rows())]
    for _, _, make in AGENT_METRICS:
        names += [r.name for r in registered_metrics(make())]
    return names


# -- alerts.md --------------------------------------------------------------------------------------------


def _rule_name() -> str:
    """The PrometheusRule's name, as the manifest builder gives it (any valid cluster config will do)."""
    cluster = stackconfig.Cluster.model_validate({"kubernetesVersion": f"1.{stackconfig.MAX_KUBERNETES_MINOR}",
                                                   "agentImage": "registry.example.com/agent:1"})
    return str(monitoring.prometheus_rule("nvidia-gpu", cluster, [])["metadata"]["name"])


def _facts(pairs: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"- **{k}**: {cell(v)}" for k, v in pairs)


def alerts_page() -> str:
    groups = alerts.rule_groups()
    body = [
        paragraphs(alerts.__doc__ or ""),
        f"The stack renders them as the PrometheusRule `{_rule_name()}` where the Prometheus Operator scrapes "
        "(`cluster.monitoring.scrape` `serviceMonitor` or `podMonitor`, unless `cluster.monitoring.alerts` is "
        "false). kube-state-metrics must allow these node labels (`--metric-labels-allowlist`): "
        + ", ".join(code(k) for k in alerts.KSM_NODE_LABELS) + ".",
    ]
    for group in groups:
        rules = group["rules"]
        body += [f"## Group `{group['name']}`",
                 table(("Alert", "Severity", "For", "Summary"),
                       [(code(r["alert"]), r["labels"]["severity"], r.get("for", "0m"), r["annotations"]["summary"])
                        for r in rules])]
        for r in rules:
            extra = {k: v for k, v in r["labels"].items() if k != "severity"}
            notes = _facts([("Severity", r["labels"]["severity"]), ("For", r.get("for", "0m")),
                            *((f"Label `{k}`", v) for k, v in sorted(extra.items())),
                            ("Summary", r["annotations"]["summary"]),
                            ("Description", r["annotations"]["description"]),
                            ("Runbook", md(r["annotations"]["runbook"]))])
            body += [f"### {r['alert']}", f"```promql\n{r['expr']}\n```", notes]
    return page("Alerts reference", "`nvidia_gpu.components.manifests.alerts`", "edit the alerts there", body)


# -- labels.md --------------------------------------------------------------------------------------------


def keyset_text(keys: nvgpu.labels.KeySet) -> str:
    parts = [code(k) for k in keys.keys] + [code(p + "*") for p in keys.prefixes]
    text = ", ".join(parts)
    excepted = [code(k) for k in keys.except_keys] + [code(p + "*") for p in keys.except_prefixes]
    if excepted:
        text += " except " + ", ".join(excepted)
    name = _named(keys, nvgpu.labels)
    return f"{text} ({code(name)})" if name else text


def _writer_doc(writer: nodeowner.Writer) -> str:
    name = _named(writer, nodeowner)
    doc = attribute_docs(nodeowner).get(name or "", "")
    writes = _named(writer.writes, nvgpu.labels)
    return doc or attribute_docs(nvgpu.labels).get(writes or "", "")


def _writer_rows(writer: nodeowner.Writer) -> list[tuple[str, str]]:
    w = writer.writes
    rows = [(what, "; ".join(keyset_text(k) for k in sets)) for what, sets in (
        ("Sets labels", w.set_labels), ("Removes labels", w.remove_labels),
        ("Sets annotations", w.set_annotations), ("Removes annotations", w.remove_annotations),
        ("Sets taints", w.set_taints)) if sets]
    taint = f"{nvgpu.labels.GPU_TAINT_KEY}={nvgpu.labels.GPU_TAINT_VALUE}:{nvgpu.labels.GPU_TAINT_EFFECT}"
    if w.group_taints:
        rows.append((f"{w.group_taints.capitalize()}s the node group's taints",
                     f"`{taint}` (unless `gpuTaint: false`) and `extraTaints`"))
    if writer.group_keys:
        rows.append(("Also", "the node group's own labels and taints: any key no other writer claims"))
    if w.cordon:
        rows.append(("Cordons", "`spec.unschedulable`"))
    if writer.field_manager:
        rows.append(("Field manager", code(writer.field_manager)))
    return rows


def _is_key(module: types.ModuleType, name: str, value: str) -> bool:
    """A key constant: in :mod:`nvgpu.labels` any prefixed name (``domain/name``) or taint key; in
    :mod:`nvgpu.driver` (whose other constants include image repositories) the annotations and the taint."""
    if name.endswith("_TAINT_KEY"):
        return True
    if module is nvgpu.driver and not name.endswith(("_ANNOTATION", "_LABEL")):
        return False
    return "/" in value and not qualified_name_problem(value)


def node_keys() -> list[tuple[str, str, str]]:
    """(key, constant, description) of every label, annotation and taint key the shared modules define."""
    out = []
    for module in (nvgpu.labels, nvgpu.driver):
        docs = attribute_docs(module)
        out += [(value, f"{module.__name__}.{name}", docs.get(name, "")) for name, value in vars(module).items()
                if name.isupper() and isinstance(value, str) and _is_key(module, name, value)]
    return sorted(out)


def _writers_of(key: str, constant: str) -> str:
    """Which Node writers may change ``key`` (their :class:`nvgpu.labels.NodeWrites`): as a taint for a taint
    key (the GPU taint is the node groups' own), as a label or annotation otherwise."""
    taint = constant.endswith("_TAINT_KEY")
    said = []
    for w in nodeowner.WRITERS:
        ws = w.writes
        if taint:
            group = key == nvgpu.labels.GPU_TAINT_KEY and ws.group_taints
            verbs = ["sets it" if ws.may_set_taint(key) or group == "set" else "removes it" if group else ""]
        else:
            verbs = ["sets the label" if ws.may_set_label(key) else
                     "removes the label" if ws.may_remove_label(key) else "",
                     "sets the annotation" if ws.may_set_annotation(key) else
                     "removes the annotation" if ws.may_remove_annotation(key) else ""]
        if any(verbs):
            said.append(f"{w.title} ({', '.join(v for v in verbs if v)})")
    return "; ".join(said)


def labels_page() -> str:
    body = [
        paragraphs(nvgpu.labels.__doc__ or ""),
        "## Who writes what on a Node",
        paragraphs(own_doc(nvgpu.labels.NodeWrites)),
    ]
    for writer in nodeowner.WRITERS:
        body += [f"### {writer.title[0].upper()}{writer.title[1:]}", md(_writer_doc(writer)),
                 table(("Change", "Keys"), _writer_rows(writer))]
    body += ["## The node group's labels and taints", paragraphs(nvgpu.nodelabels.__doc__ or ""),
             "Labels: " + keyset_text(nvgpu.labels.GROUP_LABELS) + "; the GPU taint: "
             + code(f"{nvgpu.labels.GPU_TAINT_KEY}={nvgpu.labels.GPU_TAINT_VALUE}:{nvgpu.labels.GPU_TAINT_EFFECT}")
             + "."]
    body += ["## Keys",
             "Every key the shared modules name, with the Node writers allowed to change it (a prefix of theirs "
             "may cover a key they never write; none: a key the stack writes on its own objects, Deckhouse or "
             "NVIDIA's components write, or the agents only read).",
             table(("Key", "Constant", "May be changed on Nodes by", "Description"),
                   [(code(k), code(c), _writers_of(k, c), md(d)) for k, c, d in node_keys()])]
    return page("Labels, annotations and taints", "`nvgpu.labels`, `nvgpu.driver` and `node_agent.kube.nodeowner`",
                "edit those definitions and their `#:` comments", body)


# -- components.md ----------------------------------------------------------------------------------------


def components_page() -> str:
    """The components, from their registry and the package schema (``nvidia_gpu.reference`` writes the body)."""
    return page("Components", "`nvidia_gpu.components.registry` and the package schema (`nvidia_gpu.package`)",
                "edit the registry and the stack config models' docs", [reference.body()])


# -- the pages --------------------------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "stack-config.md": stack_config_page,
    "cli.md": cli_page,
    "metrics.md": metrics_page,
    "alerts.md": alerts_page,
    "labels.md": labels_page,
    "components.md": components_page,
}


def render() -> dict[str, str]:
    """Every page, by file name under ``docs/reference/``."""
    return {name: build() for name, build in PAGES.items()}


def stale(out: Path = OUT) -> list[str]:
    """The pages whose file differs from what the sources give now (or is missing)."""
    return [name for name, text in render().items()
            if not (out / name).is_file() or (out / name).read_text() != text]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=SCRIPT, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="name the stale pages and exit 1; write nothing")
    parser.add_argument("--out", type=Path, default=OUT, help="the directory of the pages (default: docs/reference)")
    args = parser.parse_args(argv)
    if args.check:
        old = stale(args.out)
        for name in old:
            print(f"{args.out / name}: stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if old else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        path = args.out / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(path.relative_to(REPO) if REPO in path.absolute().parents else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
