"""``docs/security.md`` lists every API right the committed stacks grant their agents: its RBAC table is the
rules the stacks render (offline preview, in process), row for row, so a right cannot be added unseen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nvidia_gpu.preview import engine, stackfile
from nvidia_gpu.preview.pipeline import new_result

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
STACKS = tuple(sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml")))

pytestmark = pytest.mark.slow


def _rendered_rows() -> set[tuple[str, ...]]:
    rows: set[tuple[str, ...]] = set()
    for stack in STACKS:
        result = new_result(ROOT, stack)
        stackfile.load(result)
        engine.run(result)
        assert result.problems == [], result.problems
        ns = result.config.cluster.namespace if result.config is not None else ""
        for r in result.resources:
            kind = r.inputs.get("kind") if r.is_kubernetes_object else None
            if kind not in ("ClusterRole", "Role"):
                continue
            name = str(r.inputs["metadata"]["name"])
            agent = name.removeprefix(f"{ns}-")
            scope = "cluster" if kind == "ClusterRole" else "stack namespace"
            for rule in r.inputs.get("rules") or []:
                names = ", ".join(f"`<ns>{n.removeprefix(ns)}`" if n.startswith(ns) else n
                                  for n in rule.get("resourceNames") or [])
                rows.add((agent, scope, ", ".join(g or "core" for g in rule["apiGroups"]),
                          ", ".join(rule["resources"]), names, ", ".join(rule["verbs"])))
    return rows


def _documented_rows() -> set[tuple[str, ...]]:
    text = DOC.read_text()
    table = re.search(r"<!-- rbac-table -->\n(.*?)<!-- /rbac-table -->", text, re.S)
    assert table, "docs/security.md lost its rbac-table markers"
    lines = [ln for ln in table.group(1).splitlines()[2:] if ln.startswith("|")]
    return {tuple(cell.strip() for cell in ln.strip("|").split("|")) for ln in lines}


def test_the_security_page_lists_every_right_the_stacks_grant_and_nothing_else() -> None:
    rendered, documented = _rendered_rows(), _documented_rows()
    missing = sorted(rendered - documented)
    stale = sorted(documented - rendered)
    assert not missing and not stale, (
        "docs/security.md's RBAC table differs from the stacks:\n"
        + "".join(f"  missing: | {' | '.join(r)} |\n" for r in missing)
        + "".join(f"  not granted any more: | {' | '.join(r)} |\n" for r in stale))
