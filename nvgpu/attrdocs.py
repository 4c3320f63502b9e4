"""The documentation of attributes, read from their source: the one reader behind the generated reference
pages (``tools/gendocs.py``) and the package schema's descriptions (:mod:`nvgpu.stackconfig.jsonschema`).

The project documents fields, enum members and constants the Sphinx way, which Python keeps nowhere at run
time: ``#:`` comment lines right above the assignment, a ``#:`` comment closing a one-line assignment, or a
string literal right after it. Reading them here, once, is what lets a model's comment be its description in
the stack-config reference, the TypeScript and Go SDKs and the JSON Schema alike.
"""

from __future__ import annotations

import ast
import inspect
import io
import sys
import tokenize
import types
from collections.abc import Mapping, Sequence
from functools import cache
from typing import is_typeddict


@cache
def _parsed(module: str) -> tuple[tuple[str, ...], dict[int, str], ast.Module, dict[str, ast.ClassDef]] | None:
    """``module``'s source lines, its comments by line number, its tree and its classes by qualified name
    (parsed once); None for a module without source."""
    try:
        text = inspect.getsource(sys.modules[module])
    except (OSError, TypeError, KeyError):
        return None
    comments = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type == tokenize.COMMENT}
    tree = ast.parse(text)
    classes: dict[str, ast.ClassDef] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                classes[prefix + node.name] = node
                walk(node.body, f"{prefix}{node.name}.")

    walk(tree.body, "")
    return tuple(text.splitlines()), comments, tree, classes


def _statement_docs(body: Sequence[ast.stmt], lines: Sequence[str], comments: Mapping[int, str]) -> dict[str, str]:
    """Each name assigned in ``body`` that is documented, as one paragraph of text."""
    out: dict[str, str] = {}
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.Assign):
            names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names = [stmt.target.id]
        else:
            continue
        above: list[str] = []
        n = stmt.lineno - 1
        while n >= 1 and lines[n - 1].strip().startswith("#:"):
            above.insert(0, lines[n - 1].strip()[2:].strip())
            n -= 1
        trailing = comments.get(stmt.lineno, "")
        if not above and stmt.lineno == stmt.end_lineno and trailing.startswith("#:"):
            above = [trailing[2:].strip()]
        nxt = body[i + 1] if i + 1 < len(body) else None
        if not above and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str):
            above = [" ".join(inspect.cleandoc(nxt.value.value).split())]
        if above:
            for name in names:
                out[name] = " ".join(above)
    return out


def _typeddict_bases(cls: type, node: ast.ClassDef) -> list[type]:
    """The TypedDicts ``cls`` derives from, read from its source: Python 3.11 keeps no record of them
    (``__orig_bases__`` is 3.12's; a TypedDict's ``__mro__`` is ``dict``'s)."""
    module = sys.modules[cls.__module__]
    bases = [getattr(module, b.id, None) for b in node.bases if isinstance(b, ast.Name)]
    return [b for b in bases if isinstance(b, type) and is_typeddict(b)]


def module_docs(module: types.ModuleType) -> dict[str, str]:
    """The documented names of a module's top level."""
    parsed = _parsed(module.__name__)
    if parsed is None:
        return {}
    lines, comments, tree, _ = parsed
    return _statement_docs(tree.body, lines, comments)


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """The documented attributes of ``cls`` and its bases (a model, an enum, a TypedDict); a subclass's word
    wins. A class without source (or defined in a function) has none of its own."""
    docs: dict[str, str] = {}
    bases = [] if is_typeddict(cls) else [k for k in reversed(cls.__mro__[1:]) if k.__module__ not in (
        "builtins", "enum", "typing") and not k.__module__.startswith("pydantic")]
    for base in bases:
        docs.update(attribute_docs(base))
    parsed = _parsed(cls.__module__)
    node = None if parsed is None else parsed[3].get(cls.__qualname__)
    if parsed is None or node is None:
        return docs
    if is_typeddict(cls):
        for base in _typeddict_bases(cls, node):
            docs.update(attribute_docs(base))
    lines, comments, _, _ = parsed
    docs.update(_statement_docs(node.body, lines, comments))
    return docs
