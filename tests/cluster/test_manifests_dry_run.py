"""Proof 1: every object the preview renders for every committed stack is accepted by the real API
server (server-side apply, ``dryRun=All``), and the preview reports what a real server refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import Kube
from localcluster.dryrun import dry_run
from tests.cluster import stack as stack_helpers

REPO = Path(__file__).resolve().parents[2]
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in REPO.glob("Pulumi.*.yaml"))


@pytest.mark.parametrize("stack", STACKS)
def test_every_rendered_object_is_accepted(kube: Kube, stack: str) -> None:
    report = dry_run(kube, stack_helpers.items(stack), ephemeral=True)
    assert report.refused == []
    assert report.checked == len(stack_helpers.items(stack))
    assert report.warnings == []
