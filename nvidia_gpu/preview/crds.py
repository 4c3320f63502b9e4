"""The vendored CustomResourceDefinitions (``nvidia_gpu/preview/crds/*.yaml``) as strict JSON-schema validators.

A CRD's ``openAPIV3Schema`` is close to JSON Schema; three changes make it as strict as the built-in
kinds' ``-strict`` schemas: objects that list ``properties`` reject unknown keys unless they carry
``x-kubernetes-preserve-unknown-fields``, the root accepts ``apiVersion``/``kind``/``metadata`` (which
CRD schemas leave implicit), and for server-side-apply patches ``required`` is dropped, because a
patch only names the fields it owns.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from nvgpu import yamltext

CRD_DIR = Path(__file__).parent / "crds"

_METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "maxLength": 253,
            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        },
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class CrdVersion:
    group: str
    version: str
    kind: str
    scope: str
    served: bool
    schema: dict[str, Any]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


_COMBINATORS = ("oneOf", "anyOf", "allOf", "not")


def _strict(schema: Any, patch: bool, branch: bool = False) -> Any:
    """Strict copy of ``schema``; ``branch`` marks a combinator branch, which constrains but never closes an object."""
    if isinstance(schema, list):
        return [_strict(s, patch, branch) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "required" and patch:
            continue
        if key in _COMBINATORS:
            if patch:
                # Cross-field rules (``oneOf`` on nodeType, say) need the whole object, which a patch is not.
                continue
            out[key] = _strict(value, patch, branch=True)
        elif key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: _strict(v, patch) for k, v in value.items()}
        else:
            out[key] = _strict(value, patch)
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in schema and "additionalProperties" not in schema and not preserve and not branch:
        out["additionalProperties"] = False
    return out


@cache
def load_crds(directory: Path = CRD_DIR) -> dict[tuple[str, str], CrdVersion]:
    """``(apiVersion, kind) → CrdVersion`` for every served version of every CRD in ``directory``."""
    found: dict[tuple[str, str], CrdVersion] = {}
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=yamltext.SAFE_LOADER):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for v in spec["versions"]:
                crd = CrdVersion(
                    group=spec["group"],
                    version=v["name"],
                    kind=spec["names"]["kind"],
                    scope=spec["scope"],
                    served=bool(v.get("served", True)),
                    schema=v["schema"]["openAPIV3Schema"],
                )
                found[(crd.api_version, crd.kind)] = crd
    return found


@cache
def validator(api_version: str, kind: str, patch: bool) -> jsonschema.protocols.Validator | None:
    crd = load_crds().get((api_version, kind))
    if crd is None:
        return None
    schema = _strict(copy.deepcopy(crd.schema), patch)
    props = schema.setdefault("properties", {})
    props.setdefault("apiVersion", {"type": "string", "const": api_version})
    props.setdefault("kind", {"type": "string", "const": kind})
    metadata = copy.deepcopy(_METADATA_SCHEMA)
    if crd.scope == "Namespaced":
        metadata["properties"]["namespace"] = {"type": "string"}
    props["metadata"] = metadata
    schema["additionalProperties"] = False
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    result: jsonschema.protocols.Validator = cls(schema)
    return result
