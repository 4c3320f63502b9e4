"""The policy pack over a whole stack without the Pulumi CLI: ``python -m nvidia_gpu.preview.policyrun.offline``.

Reads the resources the offline preview recorded (``out/<stack>/plan.json``) and the stack file, starts
the real pack process through :mod:`nvidia_gpu.preview.policyrun.analyzer_client` (``Analyze`` per resource, then
``AnalyzeStack``), prints the ``Policies:`` section like ``pulumi preview`` and exits 1 when a mandatory
policy is violated. ``--policy-pack-config`` takes the same JSON file as the CLI's flag; by default the
project's own ``policies/config.json`` (what CI passes the CLI) is used.

Exit status: 0 clean or advisory only, 1 mandatory violations, 2 bad input or a pack that fails to start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nvidia_gpu.preview.policyrun.analyzer_client import (
    PACK_DIR,
    ROOT_STACK_TYPE,
    AnalyzerResource,
    Diagnostic,
    PackError,
    PackProcess,
    PolicyConfigError,
    StackContext,
)
from nvidia_gpu.preview.policyrun.report import format_policies, summary_line
from nvidia_gpu.sdk.analyzer import PackInfo

#: The project's policy config: CI passes it to the CLI (``policyPackConfigs``) and the offline runs use it.
PROJECT_CONFIG = PACK_DIR / "config.json"


@dataclass(frozen=True)
class PolicyRun:
    info: PackInfo
    diagnostics: tuple[Diagnostic, ...]
    resources: int
    start_seconds: float
    analyze_seconds: float

    @property
    def mandatory(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.mandatory]


def run_pack(
    resources: Sequence[AnalyzerResource],
    stack: StackContext,
    policy_config: Mapping[str, Any] | None = None,
    pack_dir: Path = PACK_DIR,
    python: str | None = None,
    *,
    started: PackProcess | None = None,
) -> PolicyRun:
    """Start the pack (or take one ``started`` already, which the caller stops), configure it, analyze
    every resource and the stack, stop it."""
    with contextlib.ExitStack() as stop:
        pack = started if started is not None else stop.enter_context(PackProcess(pack_dir, stack, python=python))
        assert pack.info is not None
        pack.configure(policy_config or {})
        began = time.perf_counter()
        diagnostics = pack.analyze_all(resources)
        elapsed = time.perf_counter() - began
        return PolicyRun(pack.info, tuple(diagnostics), len(resources), pack.start_seconds, elapsed)


def source_label(pack_dir: Path) -> str:
    """How the CLI names a local pack: ``local: <directory name>``."""
    return f"local: {pack_dir.resolve().name}"


def stack_file_config(path: Path) -> dict[str, Any]:
    """The ``config:`` map of ``Pulumi.<stack>.yaml`` without secrets (only the CLI can decrypt them)."""
    doc = yaml.safe_load(path.read_text()) or {}
    raw = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if not (isinstance(v, dict) and set(v) == {"secure"})}


def load_policy_config(path: Path) -> dict[str, Any]:
    """A ``--policy-pack-config`` file: JSON (YAML accepted too) mapping policy names to settings."""
    text = path.read_text()
    doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise PolicyConfigError([f"{path}: expected an object mapping policy names to settings"])
    return doc


def resources_from_plan(doc: Mapping[str, Any]) -> list[AnalyzerResource]:
    """``plan.json``'s ``resources`` (type, urn, name, parent, dependencies, inputs) as analyzer resources,
    shaped as ``pulumi preview`` sends them to ``AnalyzeStack`` (checked against the real engine by
    ``tests/cluster/test_pulumi_engine.py``): the root stack resource first, with no properties; no
    read-only resources (``ResourceOptions(id=...)``), and so no dependency on one."""
    records = list(doc.get("resources") or [])
    urns = {str(r["urn"]) for r in records}
    out = []
    if doc.get("project") and doc.get("stack"):
        name = f"{doc['project']}-{doc['stack']}"
        out.append(AnalyzerResource(type=ROOT_STACK_TYPE, name=name, props={},
                                    urn=f"urn:pulumi:{doc['stack']}::{doc['project']}::{ROOT_STACK_TYPE}::{name}"))
    for r in records:
        out.append(AnalyzerResource(
            type=str(r["type"]), urn=str(r["urn"]), name=str(r["name"]), props=r.get("inputs") or {},
            parent=str(r.get("parent") or ""),
            dependencies=tuple(d for d in r.get("dependencies") or () if d in urns),
        ))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvidia_gpu.preview.policyrun.offline",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan.json written by the offline preview")
    parser.add_argument("--stack-file", type=Path, default=None,
                        help="Pulumi.<stack>.yaml whose config the pack sees (default: next to Pulumi.yaml)")
    parser.add_argument("--policy-pack", type=Path, default=PACK_DIR, help="policy pack directory")
    parser.add_argument("--policy-pack-config", type=Path, default=PROJECT_CONFIG,
                        help="JSON policy config, as for the CLI (default: policies/config.json)")
    args = parser.parse_args(argv)
    try:
        plan = json.loads(args.plan.read_text())
        project, stack = str(plan["project"]), str(plan["stack"])
        stack_file = args.stack_file or Path(f"Pulumi.{stack}.yaml")
        config = stack_file_config(stack_file) if stack_file.is_file() else {}
        policy_config = load_policy_config(args.policy_pack_config)
        run = run_pack(resources_from_plan(plan), StackContext(project, stack, config), policy_config,
                       args.policy_pack)
    except (OSError, ValueError, KeyError, PackError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_policies(run.info, run.diagnostics, source=source_label(args.policy_pack),
                          project=project, stack=stack))
    print(summary_line(run.diagnostics))
    return 1 if run.mandatory else 0


if __name__ == "__main__":
    sys.exit(main())
