"""A small, fast YAML emitter for JSON-shaped data, and the bounded YAML reader of the project's configs.

The emitter writes dicts, lists, strings, numbers, booleans and null. Manifests, device-plugin configs and
mig-parted configs are plain data, and PyYAML's Python representer cost more than registering the
objects did (``bench/bench_preview.py``). This writes
block-style YAML in PyYAML's default layout, quotes a string only when a YAML reader would take it
for something else (PyYAML's own implicit resolvers, plus YAML 1.2 numbers for Go readers), and
writes multi-line strings (scripts, embedded configs) as literal blocks so they stay readable.
Output always loads back with ``yaml.safe_load`` to the same data. No Pulumi here: the agent may use it.

:func:`load` reads a config (the stack file, a device-plugin config, a mig-parted config) with limits
``yaml.safe_load`` does not have: a size, a nesting depth, integers no longer than any config needs
(past 4,300 digits ``int()`` raises ``ValueError``, a traceback instead of a config error), no aliases
where the format does not need them (a 523-byte alias bomb expanded to gigabytes in the validation
after a plain ``safe_load``), a budget of expanded nodes where it does. Every refusal is a
:class:`YamlLoadError` naming the line, the column and the path of keys, with a bounded message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, cast

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from nvgpu.errortext import clip, path_part, shown

_PLAIN = re.compile(r"[A-Za-z0-9_./=+-][A-Za-z0-9_./=+:@-]*")
_RESOLVER = yaml.resolver.Resolver()
#: What YAML 1.2 readers (Go's yaml.v3 in kubectl) take for numbers or booleans although PyYAML does not.
_OTHER_READERS = re.compile(r"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|0o[0-7]+|0x[0-9a-fA-F]+|[yYnN])")
_SAFE_LITERAL = re.compile(r"[^\r\x00-\x08\x0b-\x1f\x7f\u0085\u2028\u2029\ufeff]*")


@lru_cache(maxsize=4096)
def scalar_text(value: str) -> str:
    """``value`` as a YAML scalar: plain when unambiguous, else JSON-quoted (a valid YAML double-quoted scalar)."""
    if (
        _PLAIN.fullmatch(value)
        and value not in ("-", "?", ":")
        and not value.endswith(":")
        and not _OTHER_READERS.fullmatch(value)
        and _RESOLVER.resolve(yaml.ScalarNode, value, (True, False)) == "tag:yaml.org,2002:str"  # type: ignore[no-untyped-call]
    ):
        return value
    return json.dumps(value)


_SINGLE_QUOTABLE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


@lru_cache(maxsize=4096)
def single_quoted_text(value: str) -> str:
    """Like :func:`scalar_text`, but a printable one-line string that needs quotes gets PyYAML's single quotes.

    That is PyYAML's own choice for such strings, so data of that kind (mig-parted configs: names,
    profiles, PCI IDs) comes out byte for byte as ``yaml.safe_dump(..., sort_keys=False)`` writes it.
    """
    text = scalar_text(value)
    if text == value or not _SINGLE_QUOTABLE.fullmatch(value):
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
    if "\n" not in value or not _SAFE_LITERAL.fullmatch(value) or value[:1] in (" ", "\t", "\n"):
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


# --- reading configs ----------------------------------------------------------------------------------------

#: Longest config text read (characters): a ConfigMap, which carries the agents' configs, holds at most 1 MiB.
MAX_CHARS = 1 << 20
#: Deepest nesting of collections: the stack config, the deepest format, nests about 10 levels.
MAX_DEPTH = 32
#: Longest integer written in a config (characters, sign and ``_`` included): every count, index and size
#: the formats hold fits in 64 bits (19 digits); past 4,300 digits Python cannot even read one.
MAX_INT_CHARS = 32
#: Most nodes a document may expand to through its aliases (where the format allows them): a stack of a
#: thousand node groups is about 50,000; a 523-byte alias bomb is about a billion.
MAX_EXPANDED_NODES = 200_000

_INT_TAG = "tag:yaml.org,2002:int"
#: Scalar tags whose constructor can fail on the text (an out-of-range date, ``!!int abc``,
#: ``!!bool maybe``): built while composing, so the failure is reported at the scalar's path.
_CHECKED_TAGS = frozenset({_INT_TAG, "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool",
                           "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:binary"})

#: The tags of YAML's safe schema (``!!str``, ``!!map``, ...) and merge keys (``<<``); a local tag (``!foo``)
#: means nothing to these formats.
_ALLOWED_TAGS = frozenset(tag for tag in SafeConstructor.yaml_constructors if tag is not None) | {
    "tag:yaml.org,2002:merge"}

_Parser: Any
try:  # libyaml's parser, as CSafeLoader uses it
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = None


#: ``yaml.SafeLoader`` with libyaml's parser and emitter underneath when PyYAML has them: the same safe
#: semantics, about ten times faster. For trusted text only (the vendored CRDs, ``Pulumi.yaml``): a user's
#: config goes through :func:`load`, which adds the limits.
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlLoadError(ValueError):
    """Config text that cannot be read: not YAML, or past one of :func:`load`'s limits.

    ``where`` is the line and column (and the path of keys when known), ``problem`` why; the message is
    ``<source>: <where>: <problem>``, bounded in length.
    """

    def __init__(self, source: str, where: str, problem: str):
        self.where = where
        self.problem = problem
        super().__init__(clip(f"{source}: {where}: {problem}" if where else f"{source}: {problem}"))


class _Refused(Exception):
    """A limit of :func:`load` reached while composing: ``mark`` is where."""

    def __init__(self, problem: str, mark: Any):
        super().__init__(problem)
        self.problem = problem
        self.mark = mark
        self.path: list[str] | None = None


def _at(mark: Any, path: list[str]) -> str:
    """``a.b[0] (line 3, column 5)``: the path of keys when known, and the position."""
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    keys = "".join(path).lstrip(".")
    if keys:
        where = f"{keys} ({where})" if where else keys
    return where


class _ConfigComposer(Composer):
    """PyYAML's composer, with the limits of :func:`load` checked as each node is built.

    Composing is linear in the text even for an alias bomb (an alias is a second reference to one node):
    the expansion happens in whatever walks the data afterwards, so this is where it is cheap to stop.
    Nodes are sized as they are finished (a node's size counts its aliases expanded), so the budget is
    checked without ever expanding anything.
    """

    allow_aliases: bool
    max_depth: int
    max_nodes: int

    def _setup_limits(self, aliases: bool, max_depth: int, max_nodes: int) -> None:
        self.allow_aliases = aliases
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.path: list[str] = []
        self.sizes: dict[Node, int] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self.path.append(_path_step(parent, index))
        try:
            if self.check_event(AliasEvent):  # type: ignore[attr-defined]  # the parser's, later in the MRO
                event = self.peek_event()  # type: ignore[attr-defined]
                if not self.allow_aliases:
                    raise _Refused(f"aliases (*{path_part(event.anchor)}) are not allowed in this format: write "
                                   "the value out in full", event.start_mark)
                node = cast(Node, super().compose_node(parent, index))  # type: ignore[no-untyped-call]
                if node not in self.sizes:
                    raise _Refused(f"the alias *{path_part(event.anchor)} is inside the node it names (a "
                                   "structure that contains itself)", event.start_mark)
                return node
            if len(self.path) > self.max_depth:
                raise _Refused(f"nested deeper than {self.max_depth} levels", self.peek_event().start_mark)  # type: ignore[attr-defined]
            node = cast(Node, super().compose_node(parent, index))  # type: ignore[no-untyped-call]
            self._check(node)
            return node
        except _Refused as e:
            if e.path is None:  # the innermost node: where the refusal is
                e.path = list(self.path)
            raise
        finally:
            self.path.pop()

    def _check(self, node: Node) -> None:
        if node.tag not in _ALLOWED_TAGS:
            raise _Refused(f"the tag {shown(node.tag)} is not allowed", node.start_mark)
        if isinstance(node, ScalarNode):
            size = 1
            if node.tag == _INT_TAG and len(node.value) > MAX_INT_CHARS:
                raise _Refused(f"an integer of {len(node.value)} characters is out of range (at most "
                               f"{MAX_INT_CHARS} characters)", node.start_mark)
            self._construct_checked(node)
        elif isinstance(node, SequenceNode):
            size = 1 + sum(self.sizes[item] for item in node.value)
        else:
            assert isinstance(node, MappingNode)
            for key, _ in node.value:
                if not isinstance(key, ScalarNode):
                    raise _Refused("a mapping key must be a plain value, not a list or a mapping", key.start_mark)
            size = 1 + sum(self.sizes[k] + self.sizes[v] for k, v in node.value)
        if size > self.max_nodes:
            raise _Refused(f"expands to more than {self.max_nodes} values through its aliases", node.start_mark)
        self.sizes[node] = size

    def _construct_checked(self, node: ScalarNode) -> None:
        constructors: dict[Any, Any] = SafeConstructor.yaml_constructors
        if node.tag in _CHECKED_TAGS:
            try:
                constructors[node.tag](self, node)
            except yaml.YAMLError as e:
                raise _Refused(clip(str(getattr(e, "problem", None) or e)), node.start_mark) from None
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
                why = f" ({clip(str(e), 120)})" if isinstance(e, ValueError) else ""
                raise _Refused(f"{shown(node.value)} is not a valid {node.tag.rsplit(':', 1)[-1]}{why}",
                               node.start_mark) from None


def _path_step(parent: Node | None, index: Any) -> str:
    """The path part of the node being composed: ``.key`` under a mapping, ``[i]`` in a sequence."""
    if isinstance(parent, SequenceNode):
        return f"[{index}]" if isinstance(index, int) else f"[{len(parent.value)}]"
    if isinstance(parent, MappingNode) and isinstance(index, ScalarNode):
        return "." + path_part(index.value)
    if isinstance(parent, MappingNode):
        return ".<key>"
    return ""


if _Parser is not None:

    class _Loader(_ConfigComposer, _Parser, SafeConstructor, Resolver):  # type: ignore[misc]
        """libyaml's parser (the speed of ``CSafeLoader``), the composer above, PyYAML's safe constructor."""

        def __init__(self, text: str, aliases: bool, max_depth: int, max_nodes: int):
            _Parser.__init__(self, text)
            Composer.__init__(self)  # type: ignore[no-untyped-call]
            SafeConstructor.__init__(self)  # type: ignore[no-untyped-call]
            Resolver.__init__(self)  # type: ignore[no-untyped-call]
            self._setup_limits(aliases, max_depth, max_nodes)

else:  # pragma: no cover - PyYAML without libyaml

    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Loader(_ConfigComposer, Reader, Scanner, Parser, SafeConstructor, Resolver):  # type: ignore[no-redef]
        def __init__(self, text: str, aliases: bool, max_depth: int, max_nodes: int):
            Reader.__init__(self, text)  # type: ignore[no-untyped-call]
            Scanner.__init__(self)  # type: ignore[no-untyped-call]
            Parser.__init__(self)  # type: ignore[no-untyped-call]
            Composer.__init__(self)  # type: ignore[no-untyped-call]
            SafeConstructor.__init__(self)  # type: ignore[no-untyped-call]
            Resolver.__init__(self)  # type: ignore[no-untyped-call]
            self._setup_limits(aliases, max_depth, max_nodes)


def load(text: str, source: str, *, aliases: bool = False, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH,
         max_nodes: int = MAX_EXPANDED_NODES) -> Any:
    """One YAML document of ``text`` as ``yaml.safe_load`` reads it (``None`` when empty), within limits.

    ``aliases``: whether the format needs YAML's anchors and aliases (a Pulumi stack file may share a
    block between node groups; NVIDIA's device-plugin and mig-parted configs have no use for them); where
    allowed, the document may expand to at most ``max_nodes`` values. Anything else raises
    :class:`YamlLoadError` naming ``source``, the line and column and, when known, the path of keys.
    """
    if len(text) > max_chars:
        raise YamlLoadError(source, "", f"{len(text)} characters is too long for a config (at most {max_chars})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise YamlLoadError(source, f"character {e.start + 1}", "not text: a lone surrogate cannot be encoded as "
                                                                "UTF-8") from None
    loader: Any = None
    try:
        loader = _Loader(text, aliases, max_depth, max_nodes)
        node = loader.get_single_node()  # type: ignore[no-untyped-call]
        return None if node is None else loader.construct_document(node)  # type: ignore[no-untyped-call]
    except _Refused as e:
        raise YamlLoadError(source, _at(e.mark, e.path or []), e.problem) from None
    except yaml.reader.ReaderError as e:
        raise YamlLoadError(source, f"character {e.position + 1}", f"not valid YAML: the character "
                                                                   f"#x{e.character:04x} is not allowed: {e.reason}"
                            ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(p for p in (e.context, e.problem) if p) or type(e).__name__
        raise YamlLoadError(source, _at(mark, []), f"not valid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise YamlLoadError(source, "", f"not YAML: {e}") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as e:
        # A constructor's failure that the checks above do not foresee: still a config error, bounded.
        raise YamlLoadError(source, "", f"cannot be read: {type(e).__name__}: {clip(str(e), 200)}") from None
    finally:
        if loader is not None:
            loader.dispose()
