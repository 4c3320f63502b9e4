"""End to end: ``python -m nvidia_gpu.preview`` as a subprocess on the shipped stacks and on broken ones."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def _preview(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # Schemas and policies only: the server dry-run is proven in tests/cluster (it needs the control plane).
    return subprocess.run(
        [sys.executable, "-m", "nvidia_gpu.preview", "--no-server-dry-run", *args], cwd=cwd, capture_output=True,
        text=True, timeout=120, check=False,
    )


def test_dev_stack_renders_and_validates_clean(tmp_path: Path) -> None:
    out = tmp_path / "dev"
    proc = _preview("--stack", "dev", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "No problems" in proc.stdout
    assert "to create" in proc.stdout and "By node group:" in proc.stdout

    files = sorted(p.name for p in (out / "manifests").iterdir())
    # Kinds first, then the namespace: both before anything that uses them.
    assert files[:2] == ["001-customresourcedefinition-gpus.gpu.nvidia-gpu.io.yaml", "002-namespace-nvidia-gpu.yaml"]
    assert [int(f[:3]) for f in files] == list(range(1, len(files) + 1))
    kinds = [yaml.safe_load(p.read_text())["kind"] for p in sorted((out / "manifests").iterdir())]
    order = ["CustomResourceDefinition", "Namespace",
             "RuntimeClass", "ClusterRole", "Role", "ServiceAccount", "ClusterRoleBinding", "RoleBinding",
             "ConfigMap", "DeviceClass", "Service", "DaemonSet"]
    ranks = [order.index(k) if k in order else len(order) for k in kinds]
    assert ranks == sorted(ranks), f"not in apply order: {kinds}"
    assert "NodeGroup" in kinds
    for path in (out / "manifests").iterdir():
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert len(docs) == 1, path.name

    plan = json.loads((out / "plan.json").read_text())
    assert plan["stack"] == "dev" and plan["project"] == "nvidia-gpu"
    types = {r["type"] for r in plan["resources"]}
    assert {"nvidia-gpu:index:GpuPlatform", "nvidia-gpu:index:GpuNodeGroup", "nvidia-gpu:index:SharingPolicy"} <= types
    urns = {r["urn"] for r in plan["resources"]}
    assert all(r["parent"] in urns or r["parent"].endswith("pulumi:pulumi:Stack::nvidia-gpu-dev")
               for r in plan["resources"])
    assert len(plan["manifests"]) == len(files)

    # Users' GPU pods (runtimeClassName: nvidia) get the nvidia handler, on set-up GPU nodes only.
    assert files[2] == "003-runtimeclass-nvidia.yaml"
    rc = yaml.safe_load((out / "manifests" / files[2]).read_text())
    assert rc["apiVersion"] == "node.k8s.io/v1" and "namespace" not in rc["metadata"]
    assert rc["handler"] == "nvidia"
    assert rc["scheduling"] == {
        "nodeSelector": {"node.deckhouse.io/gpu-setup-complete": ""},
        "tolerations": [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    (entry,) = [r for r in plan["resources"] if r["type"] == "kubernetes:node.k8s.io/v1:RuntimeClass"]
    (platform,) = [r for r in plan["resources"] if r["type"] == "nvidia-gpu:index:GpuPlatform"]
    assert entry["name"] == "nvidia-gpu-runtime-class" and entry["parent"] == platform["urn"]


def test_prod_stack_renders_and_validates_clean(tmp_path: Path) -> None:
    proc = _preview("--stack", "prod", "--out", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in (tmp_path / "manifests").iterdir()}
    assert any(n.endswith("-daemonset-gpu-setup-h100-train.yaml") for n in names)


def _project_with(tmp_path: Path, stack_text: str) -> Path:
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "Pulumi.broken.yaml").write_text(stack_text)
    return tmp_path


def test_broken_stack_fails_with_a_readable_problem_list(tmp_path: Path) -> None:
    text = (ROOT / "Pulumi.dev.yaml").read_text()
    text = text.replace("partitionCount: 8", "partitionCount: 0").replace("sharing: Exclusive", "sharing: Exclusiv")
    project = _project_with(tmp_path, text)
    proc = _preview("--stack", "broken", "--project-dir", str(project), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert "2 problem(s):" in proc.stderr
    assert "[config] nvidia-gpu:nodeGroups[1].gpu.timeSlicing.partitionCount:" in proc.stderr
    assert "[config] nvidia-gpu:nodeGroups[2].gpu.sharing:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists(), "nothing may be rendered for an invalid config"


def test_missing_stack_file_is_a_usage_error(tmp_path: Path) -> None:
    proc = _preview("--stack", "nope", "--project-dir", str(_project_with(tmp_path, "config: {}\n")))
    assert proc.returncode == 2
    assert "Pulumi.nope.yaml" in proc.stderr
