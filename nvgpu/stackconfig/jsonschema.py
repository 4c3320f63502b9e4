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

import inspect
import re
from collections.abc import Sequence
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema

from nvgpu.attrdocs import attribute_docs

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
