"""nvidia_gpu as a library, with the real Pulumi engine against a control plane of the module's own.

* The move of ``components``/``policies``/``preview`` under ``nvidia_gpu`` keeps every URN: the dev stack
  deployed by the program as it was before the move previews with the current tree with nothing deleted
  or replaced (objects added since are creates of new URNs, changed arguments in-place updates).
* A user's program with a ``components/`` package of its own imports ``nvidia_gpu`` and deploys a node
  group (the collision the old top-level ``components`` package caused).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from localcluster import ControlPlane
from localcluster.objects import create_kwok_node, wait_for
from tests.cluster.pulumi_project import REPO, SETUP, Project, make_project

#: The last commit before the move into nvidia_gpu/ (top-level components/, policies/, preview/): the
#: program whose state the current tree must take over unchanged. Pinned, never "HEAD~n".
BEFORE_MOVE = "83d0d9d"


def _export_before_move(dest: Path) -> Path:
    """``git archive`` of :data:`BEFORE_MOVE` into ``dest``; fails (never skips) without the history."""
    if not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git checkout: this test exports commit {BEFORE_MOVE} (the program before "
                    "the move) with `git archive`; run it from a full `git clone`")
    try:
        done = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", BEFORE_MOVE],
                              capture_output=True, timeout=120, check=False)
    except FileNotFoundError:
        pytest.fail("git is not installed: this test exports the program before the move with `git archive`")
    if done.returncode != 0:
        pytest.fail(f"cannot export commit {BEFORE_MOVE} (the program before the move): "
                    f"{done.stderr.decode(errors='replace').strip()}. CI runs from a full `git clone`; a shallow "
                    "one lacks it (`git fetch --unshallow`)")
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(dest, filter="data")
    assert (dest / "components" / "program.py").is_file(), f"{BEFORE_MOVE} is not the tree before the move"
    return dest


def _program(project: Project, tree: Path) -> None:
    """Run ``tree``'s ``__main__.py`` with ``tree``'s packages first on the path and ``tree``'s stack config
    (a key added to the config since is one the old program refuses, as a user's upgrade brings both)."""
    shutil.copy(tree / "__main__.py", project.directory / "__main__.py")
    config = yaml.safe_load((tree / f"Pulumi.{project.stack}.yaml").read_text())
    config.pop("encryptionsalt", None)
    project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    project.env["PYTHONPATH"] = str(tree)


def _urns(project: Project) -> set[str]:
    state = json.loads(project.pulumi("stack", "export").stdout)
    return {r["urn"] for r in state["deployment"]["resources"]}


@pytest.mark.timeout(900)
def test_the_move_keeps_every_urn(cluster: ControlPlane, tmp_path: Path) -> None:
    old_tree = _export_before_move(tmp_path / "before-move")
    project = make_project(cluster, tmp_path / "engine")
    project.pulumi("stack", "init", project.stack)
    _program(project, old_tree)
    project.pulumi("up", "--yes", "--skip-preview")
    try:
        _preview_is_all_same(project)
    finally:
        project.pulumi("destroy", "--yes")


def _preview_is_all_same(project: Project) -> None:
    deployed = _urns(project)
    assert any(":nvidia-gpu:index:GpuNodeGroup::" in u for u in deployed), sorted(deployed)

    _program(project, REPO)
    # --show-sames: the JSON lists the unchanged steps too (by default only the changes).
    preview = json.loads(project.pulumi("preview", "--json", "--show-sames").stdout)
    ops = {s["urn"]: s["op"] for s in preview["steps"]}
    # What the move must not do: delete or replace anything it deployed. What the product has done since
    # (new objects, new arguments on existing ones) shows as creates of new URNs and in-place updates.
    assert set(preview["changeSummary"]) <= {"same", "read", "create", "update"}, preview["changeSummary"]
    # Reads are the KubernetesRead of each Deckhouse NodeGroup: looked at on every preview, never managed.
    reads = sorted(u for u, op in ops.items() if op == "read")
    assert all("$kubernetes:deckhouse.io/v1:NodeGroup::" in u for u in reads), reads
    # Every resource the old program deployed is one the current tree keeps, under the same URN.
    assert deployed <= set(ops), {"only deployed": sorted(deployed - set(ops))}
    kept = {u: ops[u] for u in deployed}
    assert set(kept.values()) <= {"same", "read", "update"}, {u: op for u, op in kept.items() if op == "create"}
    created = sorted(u for u, op in ops.items() if op == "create")
    assert not set(created) & deployed, created
    same = sum(op == "same" for op in kept.values())
    updated = sorted(u for u, op in kept.items() if op == "update")
    print(f"\n{len(deployed)} resources deployed before the move: {same} same, {len(reads)} read, "
          f"{len(updated)} updated in place {updated}; {len(created)} new since {created}")


USER_NAMING = '''\
"""The user's own package named ``components`` (as in pulumi/examples), imported by their program."""


def team_namespace(team: str) -> str:
    return f"{team}-gpu"
'''

USER_MAIN = '''\
"""A user's program: its own provider and ``components`` package, nvidia_gpu's public API only."""

import pulumi
import pulumi_kubernetes as k8s

import nvidia_gpu
from components.naming import team_namespace

provider = k8s.Provider("team-cluster", enable_server_side_apply=True, enable_config_map_mutable=True)
opts = pulumi.ResourceOptions(provider=provider)
# The namespace name comes from another resource (an Output), as a platform team's directory would give it.
team = k8s.core.v1.ConfigMap("team", metadata={"name": "team-ml", "namespace": "default"},
                             data={"namespace": team_namespace("ml")}, opts=opts)
platform = nvidia_gpu.GpuPlatform("gpu", nvidia_gpu.GpuPlatformArgs(
    cluster={"kubernetesVersion": "1.34", "nodeSetup": "daemonset", "runtimeClass": {"create": False}},
    namespace=team.data["namespace"],
    agent_image="registry.example.com/team/nvidia-gpu-agent:1.2.3",
    extra_labels={"team": "ml"},
), opts=opts)
group = nvidia_gpu.GpuNodeGroup("ml-a100", nvidia_gpu.GpuNodeGroupArgs(
    platform=platform,
    group={"name": "ml-a100", "nodeSelector": {"matchLabels": {"example.com/gpu-pool": "ml"}},
           "gpu": {"model": "A100-80GB"}},
), opts=opts)
pulumi.export("namespace", platform.namespace)
'''


@pytest.mark.timeout(600)
def test_a_user_program_with_its_own_components_package_deploys_a_node_group(cluster: ControlPlane,
                                                                            tmp_path: Path) -> None:
    project = make_project(cluster, tmp_path / "user")
    for name in ("__main__.py", f"Pulumi.{project.stack}.yaml"):
        (project.directory / name).unlink()
    meta = yaml.safe_load((project.directory / "Pulumi.yaml").read_text())
    (project.directory / "Pulumi.yaml").write_text(yaml.safe_dump(
        {"name": "team-gpus", "runtime": meta["runtime"]}, sort_keys=False))
    (project.directory / "components").mkdir()
    (project.directory / "components" / "__init__.py").write_text('"""The user\'s own components."""\n')
    (project.directory / "components" / "naming.py").write_text(USER_NAMING)
    (project.directory / "__main__.py").write_text(USER_MAIN)
    # nvidia_gpu as installed in the venv, not this checkout's root on the path.
    project.env.pop("PYTHONPATH", None)
    kube = cluster.admin()
    create_kwok_node(kube, "team-ml-gpu", {"example.com/gpu-pool": "ml", SETUP: ""})

    project.pulumi("stack", "init", project.stack)
    done = project.pulumi("up", "--yes")
    assert "ModuleNotFoundError" not in done.stdout + done.stderr
    outputs = json.loads(project.pulumi("stack", "output", "--json").stdout)
    assert outputs["namespace"] == "ml-gpu"
    daemonsets = {d["metadata"]["name"]: d for d in kube.list("apps/v1", "DaemonSet", "ml-gpu")}
    assert len(daemonsets) == 3, sorted(daemonsets)  # node setup, the labeller, the device plugin
    for name, ds in daemonsets.items():
        assert ds["metadata"]["labels"]["team"] == "ml", name
        assert ds["status"].get("desiredNumberScheduled") == 1, (name, ds["status"])
        assert ds["status"].get("numberReady", 0) >= 1, (name, ds["status"])  # the provider awaited the rollout

    project.pulumi("destroy", "--yes")
    wait_for(lambda: kube.get_or_none("v1", "Namespace", "ml-gpu") is None, timeout=60,
             what="the user's namespace gone")
    assert kube.list("apps/v1", "DaemonSet", "ml-gpu") == []
