"""The upstream CDI JSON schema (``cncf-tags/container-device-interface``; provenance in
tests/node_agent/deviceplugin/data/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "deviceplugin" / "data"


def cdi_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "cdi-schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "cdi-defs.json").read_text())
    # The schema refers to its definitions by their upstream file name, defs.json.
    registry = Registry().with_resource("defs.json", Resource.from_contents(defs, default_specification=DRAFT7))
    return jsonschema.Draft7Validator(schema, registry=registry)
