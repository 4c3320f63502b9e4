"""Render a committed stack with the offline preview and put it into a control plane."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from localcluster import Kube
from localcluster.dryrun import DryRunReport, Item, dry_run
from nvidia_gpu.preview.model import PreviewResult
from nvidia_gpu.preview.pipeline import run_preview
from nvidia_gpu.preview.serverdryrun import deckhouse_placeholder

REPO = Path(__file__).resolve().parents[2]


@cache
def rendered(stack: str) -> PreviewResult:
    out = Path(tempfile.mkdtemp(prefix=f"nvgpu-{stack}-"))
    result = run_preview(REPO, stack, out)
    assert result.manifests, f"stack {stack} rendered nothing: {[str(p) for p in result.problems]}"
    return result


def items(stack: str) -> list[Item]:
    return [Item(m.filename, m.object, m.patch) for m in rendered(stack).manifests]


@dataclass(frozen=True)
class AppliedStack:
    name: str
    report: DryRunReport
    objects: tuple[dict[str, Any], ...]

    def object(self, kind: str, name: str) -> dict[str, Any]:
        return next(o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]


def apply_stack(kube: Kube, stack: str) -> AppliedStack:
    its = items(stack)
    report = dry_run(kube, its, ephemeral=True, commit=True, placeholder=deckhouse_placeholder)
    assert report.ok, "\n".join(f"{label}: {msg}" for label, msg in report.refused)
    return AppliedStack(stack, report, tuple(i.object for i in its))
