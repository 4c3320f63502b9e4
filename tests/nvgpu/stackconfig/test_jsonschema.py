"""The stack config's JSON Schema carries the models' own documentation: every field and enum is described."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from nvgpu.attrdocs import attribute_docs
from nvgpu.stackconfig import AgentImage, Cluster, NodeGroup, StackConfig
from nvgpu.stackconfig.jsonschema import json_schemas, markdown


def test_every_field_of_the_stack_config_is_documented() -> None:
    """What the component package's types, and so the TypeScript and Go SDKs, show for each key."""
    _, defs = json_schemas([StackConfig])
    undocumented = [f"{name}.{key}" for name, spec in defs.items() for key, prop in spec.get("properties", {}).items()
                    if not prop.get("description")]
    assert undocumented == []
    assert [name for name, spec in defs.items() if not spec.get("description")] == []


def test_the_schema_is_the_models_in_the_config_spelling() -> None:
    (cluster, group), defs = json_schemas([Cluster, NodeGroup])
    assert cluster == {"$ref": "#/$defs/Cluster"} and group == {"$ref": "#/$defs/NodeGroup"}
    assert "kubernetesVersion" in defs["Cluster"]["properties"] and "title" not in defs["Gpu"]["properties"]["model"]
    # What a before-validator also accepts is in the schema: one image reference, a comma list of strategies.
    assert defs["Cluster"]["properties"]["agentImage"]["anyOf"] == [{"$ref": "#/$defs/AgentImage"}, {"type": "string"}]
    assert {"type": "string"} in defs["Gpu"]["properties"]["deviceListStrategy"]["anyOf"]
    exporter = defs["MetricsExporter"]
    assert exporter["enum"] == ["agent", "dcgm", "none"] and exporter["x-enum-varnames"] == ["AGENT", "DCGM", "NONE"]
    assert exporter["x-enum-descriptions"][1].startswith("NVIDIA's dcgm-exporter image")


class Base(TypedDict):
    a: int
    """The a."""


class Derived(Base):
    #: The b, over
    #: two lines.
    b: NotRequired[str]


def test_docs_are_read_from_comments_and_strings_through_bases() -> None:
    assert attribute_docs(Derived) == {"a": "The a.", "b": "The b, over two lines."}
    assert attribute_docs(AgentImage)["tag"].startswith("The image tag")


def test_markdown() -> None:
    assert markdown("A ``x`` of :mod:`~nvgpu.devicelist` and\n    :func:`nvgpu.a.b`.\n\n  Next.") == (
        "A `x` of `devicelist` and `nvgpu.a.b`.\n\nNext.")
