"""Proof 1: every object the preview renders for every committed stack is accepted by the real API
server (server-side apply, ``dryRun=All``), and the preview reports what a real server refuses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import ApiError, ControlPlane, Kube
from localcluster.dryrun import dry_run
from nvgpu.k8snames import label_value_problem, qualified_name_problem
from nvidia_gpu.preview import serverdryrun, validate
from nvidia_gpu.preview.pipeline import run_preview
from nvidia_gpu.preview.serverdryrun import deckhouse_placeholder
from tests.cluster import stack as stack_helpers
from tests.cluster.stack import AppliedStack

REPO = Path(__file__).resolve().parents[2]
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in REPO.glob("Pulumi.*.yaml"))


@pytest.mark.parametrize("stack", STACKS)
def test_every_rendered_object_is_accepted(kube: Kube, stack: str) -> None:
    report = dry_run(kube, stack_helpers.items(stack), ephemeral=True, placeholder=deckhouse_placeholder)
    assert report.refused == [] and report.missing == []
    assert report.checked == len(stack_helpers.items(stack))
    assert report.warnings == []


# --- Kubernetes' name rules: ours against the server's -------------------------------------------

KEYS = ["dedicated", "dedicated for ml", "node.kubernetes.io/instance-type", "example.com/a_b.c-d", "A1", "-a",
        "a-", "Bad_Prefix/x", "example.com/", "/x", "a" * 63, "a" * 64, "example.com/" + "b" * 63, "x.y/z/w"]
VALUES = ["", "a", "v1.2_3-x", "p5 48xlarge", "-a", "a-", "a" * 63, "a" * 64, "A.b", "a/b"]


def _server_accepts_label(kube: Kube, key: str, value: str) -> bool:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "name-rules", "labels": {key: value}}}
    try:
        kube.create(node, dry_run=True)
    except ApiError as e:
        assert e.status == 422, e
        return False
    return True


@pytest.mark.parametrize("key", KEYS)
def test_label_key_rule_matches_the_api_server(kube: Kube, key: str) -> None:
    assert (qualified_name_problem(key) is None) == _server_accepts_label(kube, key, "v")


@pytest.mark.parametrize("value", VALUES)
def test_label_value_rule_matches_the_api_server(kube: Kube, value: str) -> None:
    assert (label_value_problem(value) is None) == _server_accepts_label(kube, "k", value)


# --- the preview's server dry-run step -----------------------------------------------------------


def test_preview_fails_on_an_object_only_the_server_refuses(tmp_path: Path) -> None:
    """A DaemonSet that the strict schemas accept and the API server refuses fails the preview, with
    the manifest named and the server's own message."""
    result = run_preview(REPO, "prod", tmp_path)
    assert result.ok
    bad = next(m for m in result.manifests if m.kind == "DaemonSet")
    bad.object["spec"]["template"]["spec"]["tolerations"][0]["key"] = "dedicated for ml"
    validate.run(result)
    assert result.ok, "the schemas accept it: only the server can tell"
    result.server_mode = "auto"
    serverdryrun.run(result)
    assert [p.subject for p in result.problems] == [bad.filename]
    problem = result.problems[0]
    assert problem.step == "server-dry-run"
    assert "refused by kube-apiserver v1.34" in problem.message
    assert 'spec.template.spec.tolerations[0].key: Invalid value: "dedicated for ml"' in problem.message


def _preview(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvidia_gpu.preview", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, check=False)


def _manifests(out: Path) -> int:
    """How many objects the preview rendered (every one goes through the server)."""
    count = len(json.loads((out / "plan.json").read_text())["manifests"])
    assert count > 50, count
    return count


def test_make_preview_dry_runs_on_a_throwaway_control_plane(tmp_path: Path) -> None:
    proc = _preview("--stack", "dev", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Server dry-run (a throwaway control plane, up in" in proc.stdout
    n = _manifests(tmp_path)
    assert f"{n} of {n} objects accepted by kube-apiserver v1.34.4" in proc.stdout
    assert "precondition: NodeGroup gpu-h100 (patched by the stack, created by its owner)" in proc.stdout


def test_server_dry_run_against_a_users_cluster(control_plane: ControlPlane, dev_stack: AppliedStack,
                                                tmp_path: Path) -> None:
    """``--server-dry-run KUBECONFIG``: the session cluster plays the user's, with the dev stack in it."""
    before = {o["metadata"]["name"] for o in control_plane.admin().list("v1", "ConfigMap", "nvidia-gpu")}
    proc = _preview("--stack", "dev", "--out", str(tmp_path / "ok"), "--server-dry-run", str(control_plane.kubeconfig))
    assert proc.returncode == 0, proc.stderr
    n = _manifests(tmp_path / "ok")
    assert f"Server dry-run (your cluster (nothing written)): {n} of {n} objects accepted" in proc.stdout
    after = {o["metadata"]["name"] for o in control_plane.admin().list("v1", "ConfigMap", "nvidia-gpu")}
    assert before == after

    # A mistyped NodeGroup passes every offline check; the user's API server knows it does not exist.
    project = tmp_path / "project"
    project.mkdir()
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(REPO / name, project / name)
    (project / "Pulumi.typo.yaml").write_text((REPO / "Pulumi.dev.yaml").read_text()
                                              .replace("nodeGroup: gpu-h100", "nodeGroup: gpu-h100x"))
    proc = _preview("--stack", "typo", "--project-dir", str(project), "--out", str(tmp_path / "typo"),
                    "--server-dry-run", str(control_plane.kubeconfig))
    assert proc.returncode == 1
    missing = (r"\[server-dry-run\] \d{3}-nodegroup-gpu-h100x\.yaml: missing in the cluster: the stack patches "
               r"NodeGroup gpu-h100x, which does not exist: a patch never creates its target")
    assert re.search(missing, proc.stderr), proc.stderr
    assert proc.stderr.count("[server-dry-run]") == 1
