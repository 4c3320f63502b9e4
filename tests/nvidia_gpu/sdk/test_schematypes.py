"""JSON Schema as a package schema's types (nvidia_gpu.sdk.schematypes), on a small pydantic model."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from nvidia_gpu.sdk import schematypes


class Mode(StrEnum):
    """How it runs."""

    FAST_PATH = "fast-path"
    SLOW = "slow"


class Limits(BaseModel):
    """Limits."""

    model_config = ConfigDict(alias_generator=to_camel)
    pull_policy: Literal["IfNotPresent", "Always"] = "IfNotPresent"


class Widget(BaseModel):
    """A widget."""

    model_config = ConfigDict(alias_generator=to_camel)
    name: str
    mode: Mode = Mode.SLOW
    count: Annotated[int, Field(ge=1)] = 2
    limits: Limits | None = None
    tags: dict[str, str] = {}
    sizes: list[int] = []
    either: Annotated[Limits, BeforeValidator(lambda v: v, json_schema_input_type=Limits | str)]
    pull_policy: Literal["IfNotPresent", "Always"] = "Always"
    anything: Any = None


INFERRED: dict[str, Any] = {"name": "pkg", "resources": {
    "pkg:index:Gadget": {"inputProperties": {"widget": {"type": "object", "description": "The ``widget``."},
                                             "other": {"type": "string"}}, "isComponent": True},
    "pkg:index:Limits": {"inputProperties": {}, "isComponent": True}}}


def _refined() -> dict[str, Any]:
    schema = Widget.model_json_schema(by_alias=True)
    defs = schema.pop("$defs")
    defs["Widget"] = schema
    return schematypes.typed_inputs(INFERRED, {"widget": {"$ref": "#/$defs/Widget"}}, defs,
                                    lambda text: text.replace("``", "`"))


def test_models_become_object_types_and_enums() -> None:
    schema = _refined()
    types = schema["types"]
    widget = schema["resources"]["pkg:index:Gadget"]["inputProperties"]["widget"]
    assert widget == {"$ref": "#/types/pkg:index:Widget", "plain": True, "description": "The `widget`."}
    props = types["pkg:index:Widget"]["properties"]
    assert types["pkg:index:Widget"]["required"] == ["name", "either"]
    assert props["mode"]["$ref"] == "#/types/pkg:index:Mode"
    assert [(m["name"], m["value"]) for m in types["pkg:index:Mode"]["enum"]] == [("FastPath", "fast-path"),
                                                                               ("Slow", "slow")]
    assert props["count"] == {"type": "integer", "plain": True, "description": "Default: `2`."}
    assert props["tags"]["additionalProperties"] == {"type": "string", "plain": True}
    assert props["sizes"]["items"] == {"type": "integer", "plain": True}
    assert props["either"]["oneOf"] == [{"$ref": "#/types/pkg:index:LimitsSettings"}, {"type": "string"}]
    assert props["anything"]["$ref"] == "pulumi.json#/Any"
    assert schema["resources"]["pkg:index:Gadget"]["inputProperties"]["other"] == {"type": "string"}


def test_names_stay_apart_from_the_resources_and_shared_literals_get_one_enum() -> None:
    types = _refined()["types"]
    # A model named like a resource gets "Settings": the SDKs would have two classes of one name.
    assert "pkg:index:LimitsSettings" in types and "pkg:index:Limits" not in types
    # The same Literal under the same key in two models is one enum named after the key.
    assert types["pkg:index:LimitsSettings"]["properties"]["pullPolicy"]["$ref"] == "#/types/pkg:index:PullPolicy"
    assert types["pkg:index:Widget"]["properties"]["pullPolicy"]["$ref"] == "#/types/pkg:index:PullPolicy"
    assert [m["value"] for m in types["pkg:index:PullPolicy"]["enum"]] == ["IfNotPresent", "Always"]
    assert all("default" not in p for t in types.values() for p in t.get("properties", {}).values())
