"""Typed inputs for a component package: JSON Schema turned into the package schema's object and enum types.

Pulumi's component provider host infers the schema from the components' annotations
(``pulumi.provider.experimental.analyzer``, SDK 3.272.0). It can type an input as a TypedDict or an enum,
but what it infers from one also decides how the host hands the input to the constructor
(``ComponentProvider.map_input_properties``): the keys renamed to snake_case, an unknown key dropped
without a word, a missing required key or an unknown enum value refused with the host's own message
before the component sees them, and a union (an image as a mapping or one reference) refused outright.
Its descriptions come from the classes' source, so a TypedDict generated at run time would have none.

So a component keeps ``dict[str, Any]`` for a settings object (the host passes it through as the engine
sent it, and the component validates it with its own models, as in a stack config), and the schema the
host serves is refined here: :func:`typed_inputs` replaces such a property's ``map<any>`` with a
reference to object types generated from the models' JSON Schema (pydantic's, with their descriptions),
so generated SDKs (TypeScript, Go, ...) and Pulumi YAML's checker know every field, enum and
description. What is served and what is validated come from the same models.

The mapping, for the JSON Schema pydantic generates:

* a definition (``$defs``) of an object: an object type of the same name (``<package>:index:<Name>``),
  its properties those of the model by their aliases, ``required`` as the model's; a name a resource of
  the package already has gets ``Settings`` appended (the SDKs would have two classes of one name);
* an enum definition: an enum type, its members named by their values (PascalCased: ``TimeSlicing``,
  ``DevicePlugin``) and described by ``x-enum-descriptions`` where present; an inline enum (a ``Literal``):
  an enum type named after its property (``<Model><Property>``, or ``<Property>`` when models share it
  with the same values);
* ``anyOf`` with ``null``: the other branch (the property is optional); other ``anyOf``: ``oneOf``;
* arrays and maps (``additionalProperties``) of any of these; ``{}``: ``pulumi.json#/Any``;
* a default is said in the description, never as the schema's ``default``: an SDK would fill it in, and
  the models tell a value left out from one written (``model_fields_set``).

Every property is ``plain``, as the analyzer marks a TypedDict's: the components validate the objects
before they register anything, so their values must be known at preview.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

JsonSchema = dict[str, Any]
#: The package schema, and one type spec of it, as JSON values.
PackageSchema = dict[str, Any]

#: How long a default may be to be quoted in a description (longer ones are nested objects' defaults).
_DEFAULT_TEXT_MAX = 40


def _pascal(text: str) -> str:
    """``pullPolicy`` as ``PullPolicy``, ``vgpu-host-manager`` as ``VgpuHostManager``; ``MPS`` stays."""
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", text) if p)


class _Types:
    """The package's new types, each made once, in the order first reached."""

    def __init__(self, package: str, defs: Mapping[str, JsonSchema], taken: set[str],
                 describe: Callable[[str], str]) -> None:
        self.package, self.defs, self.describe = package, defs, describe
        self.taken = taken
        self.names: dict[str, str] = {}  # definition -> type name
        self.types: dict[str, PackageSchema] = {}
        self.inline_enums = self._name_inline_enums()

    def _ref(self, name: str) -> PackageSchema:
        return {"$ref": f"#/types/{self.package}:index:{name}"}

    def _type_name(self, base: str) -> str:
        name = base if base not in self.taken else f"{base}Settings"
        if name in self.taken:
            raise ValueError(f"type {base!r}: {name!r} is taken too")
        self.taken.add(name)
        return name

    def _inline_enum_uses(self, schema: JsonSchema, owner: str, prop: str, uses: list[tuple[str, str, tuple[Any, ...]]],
                          seen: set[str]) -> None:
        if "enum" in schema and "$ref" not in schema:
            uses.append((owner, prop, tuple(schema["enum"])))
        ref = schema.get("$ref")
        if ref is not None:
            name = ref.rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                for key, sub in self.defs[name].get("properties", {}).items():
                    self._inline_enum_uses(sub, name, key, uses, seen)
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                self._inline_enum_uses(schema[key], owner, prop, uses, seen)
        for sub in schema.get("anyOf", ()):
            self._inline_enum_uses(sub, owner, prop, uses, seen)

    def _name_inline_enums(self) -> dict[tuple[str, str], str]:
        uses: list[tuple[str, str, tuple[Any, ...]]] = []
        seen: set[str] = set()
        for name in self.defs:
            self._inline_enum_uses({"$ref": f"#/$defs/{name}"}, name, "", uses, seen)
        names: dict[tuple[str, str], str] = {}
        for owner, prop, values in uses:
            shared = {o for o, p, v in uses if p == prop and v == values}
            clash = any(p == prop and v != values for _, p, v in uses)
            names[owner, prop] = _pascal(prop) if len(shared) > 1 and not clash else owner + _pascal(prop)
        return names

    def definition(self, name: str) -> PackageSchema:
        """A reference to the type made of definition ``name`` (made on first use)."""
        if name not in self.names:
            schema = self.defs[name]
            self.names[name] = type_name = self._type_name(name)
            self.types[type_name] = {}  # reserved before the properties, which may refer back to it
            self.types[type_name] = self._enum(schema) if "enum" in schema else self._object(name, schema)
        return self._ref(self.names[name])

    def _described(self, spec: PackageSchema, schema: JsonSchema) -> PackageSchema:
        text = self.describe(schema.get("description", ""))
        default = schema.get("default")
        shown = json.dumps(default) if default is not None else ""
        if default is not None and len(shown) <= _DEFAULT_TEXT_MAX:
            value = default if isinstance(default, str) else shown
            text = f"{text} Default: `{value}`.".strip()
        if text:
            spec["description"] = text
        return spec

    def _enum(self, schema: JsonSchema) -> PackageSchema:
        values = schema["enum"]
        docs = schema.get("x-enum-descriptions") or [""] * len(values)
        members = []
        for value, doc in zip(values, docs, strict=True):
            member: dict[str, Any] = {"name": _pascal(str(value)), "value": value}
            if doc:
                member["description"] = self.describe(doc)
            members.append(member)
        kind = {str: "string", int: "integer", float: "number", bool: "boolean"}[type(values[0])]
        spec: PackageSchema = {"type": kind, "enum": members}
        if schema.get("description"):
            spec["description"] = self.describe(schema["description"])
        return spec

    def _object(self, owner: str, schema: JsonSchema) -> PackageSchema:
        properties = {key: self._described({**self.spec(sub, owner, key), "plain": True}, sub)
                      for key, sub in schema.get("properties", {}).items()}
        spec: PackageSchema = {"type": "object", "properties": properties}
        if schema.get("required"):
            spec["required"] = list(schema["required"])
        if schema.get("description"):
            spec["description"] = self.describe(schema["description"])
        return spec

    def spec(self, schema: JsonSchema, owner: str, prop: str) -> PackageSchema:
        """The type spec of a property ``prop`` of definition ``owner`` whose JSON Schema is ``schema``."""
        if "$ref" in schema:
            return self.definition(schema["$ref"].rsplit("/", 1)[1])
        if "anyOf" in schema:
            branches = [s for s in schema["anyOf"] if s.get("type") != "null"]
            if len(branches) == 1:
                return self.spec(branches[0], owner, prop)
            return {"oneOf": [self.spec(s, owner, prop) for s in branches]}
        if "enum" in schema:
            name = self.inline_enums[owner, prop]
            if name not in self.types:
                self.taken.add(name)
                self.types[name] = self._enum(schema)
            return self._ref(name)
        kind = schema.get("type")
        if kind in ("string", "integer", "number", "boolean"):
            return {"type": kind}
        if kind == "array":
            return {"type": "array", "items": {**self.spec(schema.get("items", {}), owner, prop), "plain": True}}
        if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
            values = self.spec(schema["additionalProperties"], owner, prop)
            return {"type": "object", "additionalProperties": {**values, "plain": True}}
        if not kind or kind == "object":
            return {"$ref": "pulumi.json#/Any"}
        raise ValueError(f"{owner}.{prop}: no package type for JSON Schema {schema}")


def typed_inputs(schema: PackageSchema, typed: Mapping[str, JsonSchema], defs: Mapping[str, JsonSchema],
                 describe: Callable[[str], str] = lambda text: text) -> PackageSchema:
    """``schema`` (the package schema the host inferred) with every component input named in ``typed`` typed
    by its JSON Schema (``$ref`` into ``defs``, or an array of such), and the types that takes added;
    ``describe`` rewrites every description (the models' reST as the schema's Markdown, say)."""
    out = copy.deepcopy(schema)
    package = out["name"]
    resources = out.get("resources", {})
    taken = {token.rsplit(":", 1)[1] for token in [*resources, *out.get("types", {})]}
    types = _Types(package, defs, taken, describe)
    for resource in resources.values():
        for key, prop in resource.get("inputProperties", {}).items():
            if key in typed:
                spec = types.spec(typed[key], "", key)
                resource["inputProperties"][key] = {**spec, "plain": True,
                                                    **({"description": prop["description"]}
                                                       if "description" in prop else {})}
    out["types"] = {**out.get("types", {}),
                    **{f"{package}:index:{name}": spec for name, spec in types.types.items()}}
    _describe_all(out, describe)
    return out


def _describe_all(value: Any, describe: Callable[[str], str]) -> None:
    """Every ``description`` string in ``value`` rewritten by ``describe`` (idempotent rewrites only)."""
    if isinstance(value, dict):
        for key, sub in value.items():
            if key == "description" and isinstance(sub, str):
                value[key] = describe(sub)
            else:
                _describe_all(sub, describe)
    elif isinstance(value, list):
        for sub in value:
            _describe_all(sub, describe)
