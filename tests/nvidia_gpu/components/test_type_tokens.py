"""Every built-in Kubernetes object is registered under a token the real provider knows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_gpu.components.register import type_token
from nvidia_gpu.sdk.k8stypes import known_type_tokens


@pytest.mark.parametrize(
    ("api_version", "kind", "expected"),
    [
        ("v1", "Namespace", "kubernetes:core/v1:Namespace"),
        ("apps/v1", "DaemonSet", "kubernetes:apps/v1:DaemonSet"),
        ("deckhouse.io/v1", "NodeGroup", "kubernetes:deckhouse.io/v1:NodeGroup"),
    ],
)
def test_type_token(api_version: str, kind: str, expected: str) -> None:
    assert type_token(api_version, kind) == expected


def test_dev_stack_tokens_exist_in_provider(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    subprocess.run(
        [sys.executable, "-m", "nvidia_gpu.preview", "--no-server-dry-run", "--stack", "dev", "--out", str(tmp_path)],
        cwd=root, check=True, capture_output=True, timeout=300,
    )
    plan = json.loads(next(tmp_path.rglob("plan.json")).read_text())
    known = known_type_tokens()
    builtin_groups = {t.split(":")[1].split("/")[0] for t in known}
    for res in plan["resources"]:
        token: str = res["type"]
        if not token.startswith("kubernetes:"):
            continue
        group_version = token.split(":")[1]
        assert "/" in group_version, f"{token}: the provider spells every group/version with a slash"
        group = group_version.split("/")[0]
        if group in builtin_groups:
            assert token in known, f"{token} is not a pulumi_kubernetes resource type"
