"""The stack config as JSON Schema: pydantic's schema of the models, with their documentation.

Pydantic describes a model by its class docstring; the fields and enum members here are documented the
Sphinx way, a ``#:`` comment above the field (or a string right after it), which pydantic does not read.
:func:`json_schemas` adds them as the properties' ``description``, and names each enum's members
(``x-enum-varnames``, with ``x-enum-descriptions`` where they are documented), so the schema carries
everything the models say about themselves: the component package's typed inputs
(:mod:`nvidia_gpu.package`) are generated from it, not written again.

Read at schema time only: importing the stack config parses no source.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from collections.abc import Sequence
from enum import Enum
from functools import cache
from typing import Any, is_typeddict

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema

#: ``:role:`target``` (Sphinx) and ````literal```` (reST), as Markdown's `` `literal` ``.
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def markdown(text: str) -> str:
    """A docstring as Markdown: its reST literals and cross-references as code spans (``:mod:`~a.b``` as
    `` `b` ``), each paragraph's lines joined (their indentation gone), paragraphs kept apart."""
    def role(m: re.Match[str]) -> str:
        target = m.group(1)
        return f"`{target.rsplit('.', 1)[-1] if m.group(0).count('~') else target}`"

    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(text))
    return "\n\n".join(" ".join(p.split()) for p in _ROLE.sub(role, "\n\n".join(paragraphs)).replace(
        "``", "`").split("\n\n"))


def _typeddict_bases(cls: type, node: ast.ClassDef) -> list[type]:
    """The TypedDicts ``cls`` derives from, read from its source: Python 3.11 keeps no record of them
    (``__orig_bases__`` is 3.12's; a TypedDict's ``__mro__`` is ``dict``'s)."""
    module = sys.modules[cls.__module__]
    bases = [getattr(module, b.id, None) for b in node.bases if isinstance(b, ast.Name)]
    return [b for b in bases if isinstance(b, type) and is_typeddict(b)]


@cache
def _module_classes(module: str) -> tuple[list[str], dict[str, ast.ClassDef]]:
    """``module``'s source lines and its classes by qualified name (parsed once: ``inspect.getsource`` of a class
    parses the whole module again for each class)."""
    try:
        lines = inspect.getsource(sys.modules[module]).splitlines(keepends=True)
    except (OSError, TypeError, KeyError):  # no source file
        return [], {}
    classes: dict[str, ast.ClassDef] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                classes[prefix + node.name] = node
                walk(node.body, f"{prefix}{node.name}.")

    walk(ast.parse("".join(lines)).body, "")
    return lines, classes


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """The documented attributes of ``cls`` and its bases (a model, an enum, a TypedDict): ``#:`` comment lines
    above the assignment, or a string literal right after it, as one paragraph of text each; a subclass's
    word wins. A class without source (or defined in a function) has none of its own."""
    docs: dict[str, str] = {}
    classes = [] if is_typeddict(cls) else [k for k in reversed(cls.__mro__[1:]) if k.__module__ not in (
        "builtins", "enum", "typing") and not k.__module__.startswith("pydantic")]
    for klass in classes:
        docs.update(attribute_docs(klass))
    lines, nodes = _module_classes(cls.__module__)
    node = nodes.get(cls.__qualname__)
    if node is None:
        return docs
    if is_typeddict(cls):
        for base in _typeddict_bases(cls, node):
            docs.update(attribute_docs(base))
    for i, stmt in enumerate(node.body):
        target = (stmt.target if isinstance(stmt, ast.AnnAssign)
                  else stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None)
        if not isinstance(target, ast.Name):
            continue
        comment: list[str] = []
        above = stmt.lineno - 2  # the line before the statement (lineno is 1-based)
        while above >= 0 and lines[above].strip().startswith("#:"):
            comment.insert(0, lines[above].strip().removeprefix("#:").strip())
            above -= 1
        after = node.body[i + 1] if i + 1 < len(node.body) else None
        string = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
        if comment:
            docs[target.id] = " ".join(comment)
        elif isinstance(string, str):
            docs[target.id] = " ".join(string.split())
    return docs


class _Documented(GenerateJsonSchema):
    """Pydantic's schema, with the fields' and enum members' documentation."""

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        json_schema = super().model_schema(schema)
        cls: type[BaseModel] = schema["cls"]
        docs = attribute_docs(cls)
        properties = json_schema.get("properties", {})
        for name, field in getattr(cls, "model_fields", {}).items():
            prop = properties.get(field.alias or name)
            if prop is not None and name in docs:
                prop["description"] = markdown(docs[name])
            if prop is not None:
                prop.pop("title", None)  # pydantic's "Partition Count": the key says it
        if "description" in json_schema:
            json_schema["description"] = markdown(json_schema["description"])
        return json_schema

    def enum_schema(self, schema: core_schema.EnumSchema) -> JsonSchemaValue:
        json_schema = super().enum_schema(schema)
        cls: type[Enum] = schema["cls"]
        docs = attribute_docs(cls)
        json_schema["x-enum-varnames"] = [m.name for m in cls]
        if any(m.name in docs for m in cls):
            json_schema["x-enum-descriptions"] = [markdown(docs.get(m.name, "")) for m in cls]
        if "description" in json_schema:
            json_schema["description"] = markdown(json_schema["description"])
        return json_schema


def json_schemas(models: Sequence[type[BaseModel]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The validation schema of each of ``models`` (keys as the stack config spells them), and the definitions
    (``$defs``) they share: one per model and enum they reach, by class name."""
    schemas, top = models_json_schema([(m, "validation") for m in models], by_alias=True,
                                      schema_generator=_Documented)
    return [schemas[(m, "validation")] for m in models], top.get("$defs", {})
