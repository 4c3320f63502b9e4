"""``docs/reference/components.md``: the components' reference, generated from the registry and the package schema.

Every component of :mod:`nvidia_gpu.components.registry` with its token, its Python classes, what it
does, and the inputs and outputs the package serves (``nvidia_gpu.package``), then every type of the
package's settings objects (the stack config's models, as TypeScript and Go see them). Nothing here is
written by hand: ``make docs-reference`` (``tools/gendocs.py``, beside the other reference pages) writes the
page, and ``tests/repo/test_docs_reference.py`` fails when it is stale.
"""

from __future__ import annotations

import json
from typing import Any

from nvidia_gpu import package
from nvidia_gpu.components import registry

_TYPES = f"#/types/{registry.PACKAGE}:index:"


def _anchor(name: str) -> str:
    return name.lower()


def _type(spec: dict[str, Any]) -> str:
    """A type spec as the page writes it: ``string``, ``[Sharing](#sharing)``, ``NodeGroup[]``, ``map<string>``."""
    ref = spec.get("$ref", "")
    if ref.startswith(_TYPES):
        name = ref.removeprefix(_TYPES)
        return f"[{name}](#{_anchor(name)})"
    if ref == "pulumi.json#/Any":
        return "any"
    if "oneOf" in spec:
        return " or ".join(_type(s) for s in spec["oneOf"])
    if spec.get("type") == "array":
        return f"list of {_type(spec['items'])}"
    if spec.get("type") == "object" and "additionalProperties" in spec:
        return f"map of {_type(spec['additionalProperties'])}"
    return str(spec.get("type", "any"))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _properties(properties: dict[str, Any], required: list[str], *, inputs: bool) -> list[str]:
    head = ["| property | type | required | description |", "|---|---|---|---|"] if inputs else [
        "| property | type | description |", "|---|---|---|"]
    rows = []
    for key, spec in properties.items():
        kind = _type(spec) + (" (Input)" if inputs and not spec.get("plain") else "")
        cells = [f"`{key}`", kind, *(["yes" if key in required else ""] if inputs else []),
                 _cell(spec.get("description", ""))]
        rows.append("| " + " | ".join(cells) + " |")
    return [*head, *rows]


def body() -> str:
    """The page's body (``tools/gendocs.py`` puts the title and the do-not-edit line above it)."""
    schema = json.loads(package.schema())
    out = [
        "Every component is a Python class of the `nvidia_gpu` library (with its `...Args`) and a resource of the",
        f"`{registry.PACKAGE}` Pulumi package that YAML, TypeScript, Go, C# and Java programs use",
        "(`provider/PulumiPlugin.yaml`). The Python classes take the validated stack-config models or their",
        "keys; the package's resources take the stack config's objects (`cluster`, `group`, `groups`) as the",
        "typed objects below, validated by the same models.",
        "",
        "| component | type token | Python | settings |",
        "|---|---|---|---|",
    ]
    for c in registry.COMPONENTS:
        settings = ", ".join(f"`{s}`" for s in c.settings)
        out.append(f"| [{c.name}](#{_anchor(c.name)}) | `{c.token}` | `nvidia_gpu.{c.name}`, "
                   f"`nvidia_gpu.{c.args}` | {settings} |")
    for c in registry.COMPONENTS:
        resource = schema["resources"][c.token]
        out += ["", f"## {c.name}", "", resource["description"], "",
                f"Python: `nvidia_gpu.{c.name}(name, nvidia_gpu.{c.args}(...), opts)` (`{c.module}`). "
                f"Package: `{c.token}`.", "", "Inputs:", ""]
        out += _properties(resource["inputProperties"], resource.get("requiredInputs", []), inputs=True)
        outputs = resource.get("properties", {})
        out += ["", "Outputs:", "", *_properties(outputs, [], inputs=False)] if outputs else ["", "Outputs: none."]
    out += ["", "## Types", "", "The settings objects' types, from the stack config's models (`nvgpu.stackconfig`): "
            "a key's meaning, its default and what is allowed are the stack config's (README, \"Stack config "
            "reference\")."]
    for token, spec in sorted(schema["types"].items()):
        name = token.rsplit(":", 1)[1]
        out += ["", f"### {name}", "", spec.get("description", ""), ""]
        if "enum" in spec:
            out += ["| value | description |", "|---|---|"]
            out += [f"| `{m['value']}` | {_cell(m.get('description', ''))} |" for m in spec["enum"]]
        else:
            out += _properties(spec["properties"], spec.get("required", []), inputs=True)
    return "\n".join(out) + "\n"
