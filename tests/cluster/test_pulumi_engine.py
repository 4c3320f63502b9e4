"""The real Pulumi engine: ``pulumi preview``, ``up``, an update, and ``destroy`` of the dev stack against a
control plane of its own, with the pinned CLI, language host and Kubernetes provider (``make tools``).

The stack runs from a copy of the project's entry files in a temporary directory (the repository's
packages on ``PYTHONPATH``), so config changes never touch the committed ``Pulumi.dev.yaml``; state lives
in a file backend there. The cluster is prepared as a Deckhouse user's would be: the NodeGroups exist
(the stack only patches their node template), the tenant namespace of the claim quota exists, and kwok
Nodes of each group have finished node setup, so every GPU DaemonSet really rolls out under the
provider's await.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane, Kube
from localcluster.objects import create_kwok_node, wait_for
from nvgpu import labels
from nvgpu.version import VERSION
from nvidia_gpu.components.manifests.meta import group_object_name
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.manifests.workloads import AGENT, CONTAINER_DRIVER_ROOT, HOST_ROOT
from nvidia_gpu.preview.pipeline import run_preview
from nvidia_gpu.preview.policyrun.offline import resources_from_plan
from tests.cluster.agents import (
    REPO,
    AgentIdentity,
    agent_command,
    config_map_files,
    container_env,
    identity,
    one_run,
    with_config_dir,
)
from tests.cluster.mig_manager import Rendered, layout, start_manager
from tests.cluster.pulumi_project import (
    NODE_GROUPS,
    Project,
    assert_same_objects,
    make_project,
    object_key,
    settled,
    snapshot,
)
from tests.kit.fakehost import FakeHost, build_fake_host

STACK = "dev"


@pytest.fixture(scope="module")
def project(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Project:
    p = make_project(cluster, tmp_path_factory.mktemp("engine"), STACK)
    p.pulumi("stack", "init", STACK)
    return p


@pytest.fixture(scope="module")
def before(cluster: ControlPlane, project: Project) -> dict[str, Any]:
    return snapshot(cluster.admin())


def _preview_steps(project: Project) -> list[dict[str, Any]]:
    done = project.pulumi("preview", "--json")
    steps: list[dict[str, Any]] = json.loads(done.stdout)["steps"]
    return steps


def test_0_someone_elses_fixed_name_objects_are_reported_before_up(cluster: ControlPlane, project: Project,
                                                                   before: dict[str, Any]) -> None:
    """NVIDIA's DRA driver already installed its DeviceClass ``gpu.nvidia.com``: the provider would apply
    over it (server-side apply upserts) and ``destroy`` would delete it, so the preview against the cluster
    (``python -m nvidia_gpu.preview --server-dry-run KUBECONFIG``) reports it first."""
    kube = cluster.admin()
    theirs = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
              "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    kube.apply(theirs, field_manager="helm")
    try:
        result = run_preview(REPO, STACK, project.directory.parent / "preview-out",
                             server_kubeconfig=Path(project.env["KUBECONFIG"]), server_context=STACK)
    finally:
        kube.delete("resource.k8s.io/v1", "DeviceClass", "gpu.nvidia.com")
    found = [p.message for p in result.problems if "already exists" in p.message]
    assert found == ["DeviceClass gpu.nvidia.com already exists, managed by helm: `pulumi up` would take it over "
                     "and `pulumi destroy` would delete it; remove it first, or turn this stack's off where the "
                     "stack config allows (cluster.runtimeClass.create, cluster.dra.createDeviceClasses)"], \
        [str(p) for p in result.problems]


def test_1_preview_lists_what_the_offline_preview_renders(project: Project, before: dict[str, Any]) -> None:
    steps = _preview_steps(project)
    assert_same_objects(steps, STACK)
    assert {s["op"] for s in steps} <= {"create", "read", "same"}


def _policy_pack(project: Project) -> Path:
    """The repository's pack, with its runtime pointed at the project's venv (the README's ``policies/venv``)."""
    pack = project.directory.parent / "policies"
    if not pack.exists():
        shutil.copytree(REPO / "policies", pack, ignore=shutil.ignore_patterns("__pycache__", "venv"))
        meta = yaml.safe_load((pack / "PulumiPolicy.yaml").read_text())
        meta["runtime"]["options"]["virtualenv"] = str(REPO / ".venv")
        (pack / "PulumiPolicy.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return pack


def test_1b_the_cli_runs_the_policy_pack(project: Project) -> None:
    """``pulumi preview --policy-pack``: the dev stack passes CI's configuration of the pack; a stricter
    configuration (images by digest) makes the mandatory policy stop the preview with its message."""
    pack = _policy_pack(project)
    done = project.pulumi("preview", "--policy-pack", str(pack), "--policy-pack-config",
                          str(REPO / "policies/config.json"))
    assert f"nvidia-gpu@v{VERSION}" in done.stdout
    strict = json.loads((REPO / "policies/config.json").read_text())
    strict["pinned-images"] = {"requireDigest": True}
    (pack.parent / "strict.json").write_text(json.dumps(strict))
    done = project.pulumi("preview", "--policy-pack", str(pack), "--policy-pack-config",
                          str(pack.parent / "strict.json"), check=False)
    assert done.returncode != 0, done.stdout[-3000:]
    assert "pinned-images" in done.stdout and "mandatory" in done.stdout, done.stdout[-3000:]


RECORDER = """\
import json
from pathlib import Path

from pulumi_policy import EnforcementLevel, PolicyPack, StackValidationPolicy


def plain(value):
    if hasattr(value, "keys"):
        return {k: plain(value[k]) for k in value.keys()}
    if isinstance(value, (list, tuple)) or type(value).__name__.endswith("ListProxy"):
        return [plain(v) for v in value]
    return value


def record(args, report_violation):
    out = [{"type": r.resource_type, "urn": r.urn, "name": r.name, "props": plain(r.props),
            "parent": r.parent.urn if r.parent else "", "dependencies": sorted(d.urn for d in r.dependencies)}
           for r in args.resources]
    (Path(__file__).parent / "seen.json").write_text(json.dumps(out, default=repr, sort_keys=True))


PolicyPack("recorder", [StackValidationPolicy(name="record", description="what AnalyzeStack is sent",
                                              validate=record, enforcement_level=EnforcementLevel.ADVISORY)])
"""


def _seen_by_analyze_stack(project: Project) -> list[dict[str, Any]]:
    """What the real engine sends a stack policy at ``pulumi preview``, recorded by a pack that only records."""
    pack = project.directory.parent / "recorder"
    pack.mkdir(exist_ok=True)
    (pack / "PulumiPolicy.yaml").write_text(yaml.safe_dump(
        {"description": "records AnalyzeStack", "version": "0.0.1",
         "runtime": {"name": "python", "options": {"virtualenv": str(REPO / ".venv")}}}))
    (pack / "__main__.py").write_text(RECORDER)
    project.pulumi("preview", "--policy-pack", str(pack))
    seen: list[dict[str, Any]] = json.loads((pack / "seen.json").read_text())
    return seen


def test_1c_the_offline_runner_sends_the_stack_policies_what_the_engine_sends(project: Project, tmp_path: Path) -> None:
    """``AnalyzeStack`` at ``pulumi preview``, recorded, against the offline runner's request built from
    ``plan.json``: the same resources (URN, type, name, parent, dependencies), and every property the
    offline runner sends is in the engine's with the same value. The engine sends more: at preview the
    provider answers with the server's dry-run of each object (defaults, ``metadata.uid``,
    ``managedFields``), which the offline runner has no server to ask for; the stack policies must
    therefore never rely on a field being absent."""
    engine = {r["urn"]: r for r in _seen_by_analyze_stack(project)}
    assert run_preview(REPO, STACK, tmp_path).ok
    offline = {r.urn: r for r in resources_from_plan(json.loads((tmp_path / "plan.json").read_text()))}
    assert set(engine) == set(offline), (sorted(set(engine) - set(offline)), sorted(set(offline) - set(engine)))
    problems: dict[str, Any] = {}
    for urn in sorted(engine):
        e, o = engine[urn], offline[urn]
        diff: dict[str, Any] = {k: (e[k], v) for k, v in (("type", o.type), ("name", o.name), ("parent", o.parent),
                                ("dependencies", sorted(o.dependencies))) if e[k] != v}
        props = json.loads(json.dumps(dict(o.props)))
        meta = props.get("metadata") or {}
        engine_owners = (e["props"].get("metadata") or {}).get("ownerReferences") or []
        if meta.get("ownerReferences") == [] and all(
                (r.get("kind"), r.get("name")) == ("Namespace", "nvidia-gpu") for r in engine_owners):
            # A shared definition's owner is the stack's Namespace, by UID: the engine has the one the server's
            # dry-run of the new Namespace answered at preview (or none yet); the mock engine has none to give.
            del meta["ownerReferences"]
        missing = _not_contained(props, e["props"], "")
        if missing:
            diff["props"] = missing
        if diff:
            problems[urn] = diff
    assert not problems, json.dumps(problems, indent=1)[:6000]


def _not_contained(offline: Any, engine: Any, path: str) -> list[str]:
    """Where ``offline`` is not part of ``engine`` (a dict's keys, a list item by item, equal scalars)."""
    if isinstance(offline, dict) and isinstance(engine, dict):
        return [m for k, v in offline.items()
                for m in (_not_contained(v, engine[k], f"{path}.{k}") if k in engine else [f"{path}.{k} missing"])]
    if isinstance(offline, list) and isinstance(engine, list) and len(offline) == len(engine):
        return [m for i, (a, b) in enumerate(zip(offline, engine, strict=True))
                for m in _not_contained(a, b, f"{path}[{i}]")]
    return [] if offline == engine or (isinstance(offline, int) and float(offline) == engine) else [
        f"{path}: {offline!r} != {engine!r}"]


def test_2_up_creates_everything_and_the_daemonsets_roll_out(cluster: ControlPlane, project: Project) -> None:
    """``up`` with the policy pack: its stack policies now see what the engine sends after the apply (the
    provider's outputs, with the server's defaults and metadata), and still pass the dev stack."""
    done = project.pulumi("up", "--yes", "--skip-preview", "--policy-pack", str(_policy_pack(project)),
                          "--policy-pack-config", str(REPO / "policies/config.json"))
    assert f"nvidia-gpu@v{VERSION}" in done.stdout
    kube = cluster.admin()
    daemonsets = kube.list("apps/v1", "DaemonSet", "nvidia-gpu")
    assert daemonsets
    scheduled = {d["metadata"]["name"]: d["status"].get("numberReady", 0) for d in daemonsets
                 if d["status"].get("desiredNumberScheduled")}
    # Every GPU group's agents went to its set-up kwok node and are ready: the provider's await passed.
    assert len(scheduled) >= len(NODE_GROUPS) and all(n >= 1 for n in scheduled.values()), scheduled
    ng = kube.get("deckhouse.io/v1", "NodeGroup", "gpu-a100")
    managers = {m["manager"] for m in ng["metadata"]["managedFields"]}
    assert "nvidia-gpu.nvidia-gpu" in managers, managers  # the stable field manager, not a random one


def test_3_a_second_up_changes_nothing(project: Project) -> None:
    project.pulumi("up", "--yes", "--expect-no-changes")


def test_4_a_partition_count_change_updates_only_what_it_must(cluster: ControlPlane, project: Project) -> None:
    config = yaml.safe_load(project.config_file().read_text())
    groups = config["config"]["nvidia-gpu:nodeGroups"]
    l4 = next(g for g in groups if g["name"] == "l4-shared")
    l4["gpu"]["timeSlicing"]["partitionCount"] = 4
    project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    steps = _preview_steps(project)
    changed = {object_key(s["newState"]["inputs"], s["newState"]["type"]): s["op"] for s in steps
               if s["op"] not in ("same", "read") and s["newState"]["type"].startswith("kubernetes:")}
    assert set(changed.values()) == {"update"}, changed  # nothing replaced
    assert ("ConfigMap", "nvidia-gpu", "device-plugin-config-l4-shared") in changed
    allowed = {("ConfigMap", "nvidia-gpu", "device-plugin-config-l4-shared"),
               ("DaemonSet", "nvidia-gpu", "gpu-labeller-l4-shared"),
               ("DaemonSet", "nvidia-gpu", "device-plugin-l4-shared")}
    assert set(changed) <= allowed, changed
    project.pulumi("up", "--yes", "--skip-preview")
    data = cluster.admin().get("v1", "ConfigMap", "device-plugin-config-l4-shared", "nvidia-gpu")["data"]
    assert "replicas: 4" in data["TimeSlicing"]


def test_5_taints_another_manager_owns_are_refused_at_preview(cluster: ControlPlane, project: Project) -> None:
    kube = cluster.admin()
    taint = {"key": "team", "value": "ml", "effect": "NoSchedule"}
    ours = kube.get("deckhouse.io/v1", "NodeGroup", "gpu-h200")["spec"]["nodeTemplate"]["taints"]
    # Another manager (a person, GitOps) takes the atomic list over with a taint of its own.
    kube.patch("deckhouse.io/v1", "NodeGroup", "gpu-h200", {"spec": {"nodeTemplate": {"taints": [*ours, taint]}}})
    done = project.pulumi("preview", check=False)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "Deckhouse NodeGroup 'gpu-h200' has taints this stack does not declare: team=ml:NoSchedule" in out, out
    assert "extraTaints" in out and "/spec/nodeTemplate/taints" in out
    assert "Traceback" not in out, out[-3000:]  # the refusal alone, not the SDK's stack

    # The first half of the advice alone (declare it) still leaves the list another manager's: refused at
    # preview too, never a server-side-apply conflict halfway through up.
    text = project.config_file().read_text()
    config = yaml.safe_load(text)
    (group,) = [g for g in config["config"]["nvidia-gpu:nodeGroups"] if g.get("nodeGroup") == "gpu-h200"]
    group["extraTaints"] = [*group.get("extraTaints", []), taint]
    try:
        project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
        done = project.pulumi("preview", check=False)
        out = done.stdout + done.stderr
        assert done.returncode != 0 and "spec.nodeTemplate.taints is managed by" in out, out[-3000:]
        # The whole advice: hand the list over, as the message says; the stack's up then applies the
        # declared taint with its own, and owns the list.
        kube.patch("deckhouse.io/v1", "NodeGroup", "gpu-h200", {"spec": {"nodeTemplate": {"taints": None}}})
        project.pulumi("up", "--yes", "--refresh")
        live = kube.get("deckhouse.io/v1", "NodeGroup", "gpu-h200")
        assert taint in live["spec"]["nodeTemplate"]["taints"]
        managers = {m["manager"] for m in live["metadata"]["managedFields"]
                    if "f:taints" in m.get("fieldsV1", {}).get("f:spec", {}).get("f:nodeTemplate", {})}
        assert len(managers) == 1 and managers != {"kubectl-patch"}, managers
    finally:
        project.config_file().write_text(text)
    # Declared no more: the stack's list goes back to its own taints.
    project.pulumi("up", "--yes", "--refresh", "--skip-preview")
    assert kube.get("deckhouse.io/v1", "NodeGroup", "gpu-h200")["spec"]["nodeTemplate"]["taints"] == ours


def _preview_with(project: Project, line: str, instead: str) -> tuple[int, str]:
    """``pulumi preview`` with one line of the stack's config replaced (put back after): its code and output."""
    text = project.config_file().read_text()
    assert line in text
    project.config_file().write_text(text.replace(line, instead))
    try:
        done = project.pulumi("preview", check=False)
    finally:
        project.config_file().write_text(text)
    return done.returncode, done.stdout + done.stderr


def test_5a_a_mistyped_nodegroup_fails_at_preview(project: Project) -> None:
    code, out = _preview_with(project, "nodeGroup: gpu-h100\n", "nodeGroup: gpu-h100x\n")
    assert code != 0 and "gpu-h100x" in out and "does not exist" in out, out[-3000:]


def test_5a2_a_kube_context_the_kubeconfig_lacks_fails_in_one_line(project: Project) -> None:
    """The provider alone answers a wrong ``kubeContext`` with pages of Python and gRPC traceback; the
    program says which context is missing and which there are, in one line, before registering anything."""
    code, out = _preview_with(project, "kubeContext: dev\n", "kubeContext: kubernetes-admin@dev\n")
    assert code != 0, out[-3000:]
    # The CLI shows a program's error twice (the progress line and the Diagnostics): one message.
    (line,) = {x.split("error: ", 1)[1] for x in out.splitlines() if "no context 'kubernetes-admin@dev'" in x}
    assert "Pulumi.dev.yaml names in nvidia-gpu:cluster.kubeContext" in line and "the kubeconfig has: dev" in line
    assert "Traceback" not in out and "grpc" not in out.lower(), out[-3000:]


def test_5b_a_removed_group_leaves_its_nodegroup_and_namespace_clean(cluster: ControlPlane, project: Project) -> None:
    """Removing a node group deletes its agents and configs and takes our node template off its Deckhouse
    NodeGroup (Deckhouse then takes the labels and the GPU taint off its nodes)."""
    kube = cluster.admin()
    assert kube.get("deckhouse.io/v1", "NodeGroup", "gpu-a30")["spec"].get("nodeTemplate")
    config = yaml.safe_load(project.config_file().read_text())
    config["config"]["nvidia-gpu:nodeGroups"] = [g for g in config["config"]["nvidia-gpu:nodeGroups"]
                                                 if g["name"] != "a30-mps"]
    project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    project.pulumi("up", "--yes", "--skip-preview")
    ng = kube.get("deckhouse.io/v1", "NodeGroup", "gpu-a30")
    assert not ng["spec"].get("nodeTemplate"), ng["spec"]
    assert "nvidia-gpu.nvidia-gpu" not in {m["manager"] for m in ng["metadata"].get("managedFields", [])}
    left = [o["metadata"]["name"] for api, kind in (("apps/v1", "DaemonSet"), ("v1", "ConfigMap"))
            for o in kube.list(api, kind, "nvidia-gpu") if "a30-mps" in o["metadata"]["name"]]
    assert not left, left
    assert not [o for o in kube.list("deckhouse.io/v1alpha1", "NodeGroupConfiguration")
                if "a30-mps" in o["metadata"]["name"]]


def _deckhouse_applies(kube: Kube, node: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Deckhouse's node-manager, as far as this test needs it: the NodeGroup's node template onto its Node
    (template labels set, labels the old template had and the new one lacks removed, template taints
    replaced, foreign taints kept)."""
    current = kube.get("v1", "Node", node)
    stale = {k: None for k in old.get("labels", {}) if k not in new.get("labels", {})}
    old_taints = old.get("taints", [])
    taints = [t for t in current["spec"].get("taints", [])
              if {k: v for k, v in t.items() if k != "timeAdded"} not in old_taints]
    taints += [t for t in new.get("taints", []) if t not in taints]
    kube.patch("v1", "Node", node, {"metadata": {"labels": {**stale, **new.get("labels", {})}},
                                    "spec": {"taints": taints}})


def _deckhouse_approves_and_drains(kube: Kube, node: str) -> None:
    """Deckhouse's node-manager for a disruptive update: approve it, then drain (no GPU workload is on this
    node) and mark it drained; the MIG manager then uncordons and gives the node back."""
    meta = kube.get("v1", "Node", node)["metadata"]
    notes = meta.get("annotations", {})
    if labels.DISRUPTION_REQUIRED in notes and labels.DISRUPTION_APPROVED not in notes:
        kube.patch("v1", "Node", node, {"metadata": {"annotations": {labels.DISRUPTION_APPROVED: ""}}})
    if labels.DRAINING in notes and labels.DRAINED not in notes:
        kube.patch("v1", "Node", node, {"spec": {"unschedulable": True}})
        kube.patch("v1", "Node", node, {"metadata": {"annotations": {labels.DRAINED: notes[labels.DRAINING]}}})


def test_5c_a_group_leaving_mig_gets_its_gpus_rolled_back_then_its_labels_cleared(
        cluster: ControlPlane, project: Project, tmp_path: Path) -> None:
    """h100-mig switches from MIG to TimeSlicing. ``up`` replaces nothing and gives the NodeGroup's
    template ``nvidia.com/mig.config=all-disabled``; once Deckhouse has put that on the Node, the
    stack's MIG manager (running as its DaemonSet's pod on that Node, the live ConfigMap, a simulated
    DGX H100 in the group's old layout) turns MIG off on every GPU through Deckhouse's disruption
    flow, gives the node back, and then clears its MIG labels (the Deckhouse flow)."""
    kube = cluster.admin()
    node, machine = "engine-gpu-h100", "dgx-h100"
    template = kube.get("deckhouse.io/v1", "NodeGroup", "gpu-h100")["spec"]["nodeTemplate"]
    first = template["labels"][labels.MIG_CONFIG]
    _deckhouse_applies(kube, node, {}, template)
    ds = kube.get("apps/v1", "DaemonSet", "nvidia-gpu-mig-manager", "nvidia-gpu")["spec"]["template"]["spec"]
    (container,) = ds["containers"]
    volumes = {v["name"]: v for v in ds["volumes"]}
    config_map = kube.get("v1", "ConfigMap", volumes["config"]["configMap"]["name"], "nvidia-gpu")
    manager_view = Rendered(container, volumes, config_map["data"]["config.yaml"], template)
    host = build_fake_host(tmp_path / "host", machine).root
    (tmp_path / "mig.yaml").write_text(manager_view.config_text)
    applied = subprocess.run(agent_command("--host-root", str(host), "--nvml", f"simulated:{machine}", "mig", "apply",
                                           "--config", str(tmp_path / "mig.yaml"), "--name", first),
                             capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert all(layout(host, machine)), "the group's MIG layout is on every GPU"
    manager = start_manager(manager_view, identity(kube, "nvidia-gpu-mig-manager", node, tmp_path / "id"), tmp_path,
                            machine=machine)
    try:
        wait_for(lambda: kube.get("v1", "Node", node)["metadata"]["labels"].get(labels.MIG_CONFIG_STATE) == "success",
                 timeout=60, what="the manager recording the template's layout as applied")

        config = yaml.safe_load(project.config_file().read_text())
        (group,) = [g for g in config["config"]["nvidia-gpu:nodeGroups"] if g["name"] == "h100-mig"]
        group["gpu"] = {k: v for k, v in group["gpu"].items() if k != "mig"} | {
            "sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4}}
        project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
        ops = {s["op"] for s in _preview_steps(project)}
        assert not ops & {"replace", "create-replacement", "delete-replaced", "delete"}, ops
        project.pulumi("up", "--yes", "--skip-preview")
        new = kube.get("deckhouse.io/v1", "NodeGroup", "gpu-h100")["spec"]["nodeTemplate"]
        assert new["labels"][labels.MIG_CONFIG] == "all-disabled"
        _deckhouse_applies(kube, node, template, new)

        def labels_cleared() -> dict[str, Any] | None:
            # Only the Node: the GPUs are read once the manager is done (mid-change, an instance it is
            # destroying can vanish between the simulator's list and its lookup).
            _deckhouse_approves_and_drains(kube, node)
            n = kube.get("v1", "Node", node)
            done = labels.MIG_CONFIG not in n["metadata"]["labels"] and not n["spec"].get("unschedulable")
            return n if done else None

        after = wait_for(labels_cleared, timeout=120, interval=0.5, what="the node given back, its MIG labels cleared")
        assert not any(layout(host, machine)), "the labels were cleared before MIG was off on every GPU"
        assert manager.alive(), manager.text()
    finally:
        manager.stop()
    meta = after["metadata"]
    assert labels.MIG_CONFIG_STATE not in meta["labels"]
    assert not [k for k in meta["labels"] if k.startswith(labels.GPU_DEPLOY_PREFIX)], meta["labels"]
    assert not [t for t in after["spec"].get("taints", []) if t["key"] == labels.MIG_RECONFIGURE_TAINT_KEY]
    assert {k: meta["labels"].get(k) for k in new["labels"] if k != labels.MIG_CONFIG} == {
        k: v for k, v in new["labels"].items() if k != labels.MIG_CONFIG}


def test_6_destroy_leaves_the_cluster_as_it_was(cluster: ControlPlane, project: Project,
                                                before: dict[str, Any]) -> None:
    """Destroy gives the cluster back as it was. (With a DRA plugin's pod publishing its pool, the plugin withdraws
    it before its RBAC and DaemonSet go: ``test_real_node_deckhouse.py``, on a real node.)"""
    project.pulumi("destroy", "--yes")
    kube = cluster.admin()
    wait_for(lambda: kube.get_or_none("v1", "Namespace", "nvidia-gpu") is None, timeout=60,
             what="the stack's namespace gone")
    after = settled(kube, before)
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                             if before.get(k) != after.get(k)}
    assert not [s for s in kube.list("resource.k8s.io/v1", "ResourceSlice")]


@pytest.mark.timeout(600)  # four engine runs, a node's teardown, and the module's control plane stopped after
def test_7_prod_stack_previews_applies_and_destroys(cluster: ControlPlane,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """The prod stack (daemonset backend, images by digest) on the same 1.34 control plane: the only one
    ``make tools`` builds; prod targets 1.33, whose schemas the offline preview still checks it against.
    Its OnDelete setup DaemonSet carries ``pulumi.com/skipAwait``, so ``up`` does not wait on it."""
    prod = make_project(cluster, tmp_path_factory.mktemp("engine-prod"), "prod")
    prod.pulumi("stack", "init", "prod")
    done = prod.pulumi("preview", "--json")
    assert_same_objects(json.loads(done.stdout)["steps"], "prod")
    kube = cluster.admin()
    before = snapshot(kube)
    prod.pulumi("up", "--yes", "--skip-preview")
    setup = [d for d in kube.list("apps/v1", "DaemonSet", "gpu-system") if "setup" in d["metadata"]["name"]]
    assert setup and all(d["metadata"]["annotations"].get("pulumi.com/skipAwait") == "true" for d in setup)
    prod.pulumi("up", "--yes", "--expect-no-changes")
    _removed_group_is_torn_down_on_its_node(kube, prod, tmp_path_factory.mktemp("engine-prod-node"))
    prod.pulumi("destroy", "--yes")
    wait_for(lambda: kube.get_or_none("v1", "Namespace", "gpu-system") is None, timeout=60, what="gpu-system gone")
    assert settled(kube, before) == before


#: Stands in for the kubelet keeping a deleted pod (and so its bound token) while its preStop hook runs.
KUBELET_HOLD = "engine-test.nvidia-gpu.io/kubelet-prestop"
PROD_NS = "gpu-system"
PROD_GROUP = "l4-inference"


def _in_pod(args: list[str], root: Path) -> list[str]:
    """A container's agent arguments with its volume mount paths mapped onto the fake host root (the host
    root and the driver root, which is the host's own ``/`` on this stack). The fake root is also the
    default ``--host-root`` of containers that mount none: a container sees the host's ``/sys``."""
    return [str(root) if a in (HOST_ROOT, CONTAINER_DRIVER_ROOT) else a for a in args]


def _run_in_pod(args: list[str], host: FakeHost, agent: AgentIdentity, container: dict[str, Any],
                node: str) -> dict[str, Any]:
    """``python -m node_agent ARGS`` as the pod's container runs it: its environment, its token; the
    fake host's tools (systemctl, modprobe) on ``PATH`` and its simulated GPUs."""
    cmd = agent_command("--host-root", str(host.root), "--host-exec", "direct", "--nvml", host.nvml_spec,
                        "--kubeconfig", str(agent.kubeconfig), "--json", *_in_pod(args, host.root))
    env = host.env(PYTHONPATH=str(REPO), **container_env(container, node))
    env = {k: v for k, v in env.items() if not k.startswith("KUBERNETES_SERVICE_")}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{args}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def _host_files(host: FakeHost) -> dict[str, bytes]:
    """Every file of the host but the agent's own state (check verdicts) and the GPU simulator's."""
    skip = ("var/lib/nvidia-gpu-agent/", "var/log/", "run/nvidia-gpu-sim/")
    return {k: v for k, v in host.snapshot("/").items() if not k.startswith(skip)}


def _release(kube: Kube, pod: dict[str, Any]) -> None:
    """Drop the stand-in kubelet's hold on ``pod`` (nothing to do once the pod is gone)."""
    if kube.get_or_none("v1", "Pod", pod["metadata"]["name"], PROD_NS):
        kube.patch("v1", "Pod", pod["metadata"]["name"], {"metadata": {"finalizers": None}}, PROD_NS)


def _removed_group_is_torn_down_on_its_node(kube: Kube, prod: Project, work: Path) -> None:
    """The daemonset backend: a node of ``l4-inference`` set up by its setup pod (runtime drop-in, sysctl,
    gate label) and labelled by its labeller (GPU labels, the group's labels and taint). The group is
    removed from the config and ``pulumi up`` deletes its DaemonSets (in the foreground: it waits for
    the pods); the setup pod's preStop hook, run as the kubelet runs it while the pod is terminating,
    withdraws every label and taint of ours and rolls the host back to the byte."""
    node = "engine-prod-l4"
    create_kwok_node(kube, node, {"node.kubernetes.io/instance-type": "g6.12xlarge",
                                  "topology.kubernetes.io/zone": "eu-west-1a"})
    setup_ds = group_object_name(AgentRole.NODE_SETUP.value, PROD_GROUP)
    labeller_ds = group_object_name(AgentRole.LABELLER.value, PROD_GROUP)
    setup = identity(kube, setup_ds, node, work / "setup", namespace=PROD_NS)
    pod = setup.pod
    kube.patch("v1", "Pod", pod["metadata"]["name"], {"metadata": {"finalizers": [KUBELET_HOLD]}}, PROD_NS)
    try:
        host = build_fake_host(work / "host", "l4x2", containerd=2, deckhouse=False)
        before_node = kube.get("v1", "Node", node)
        before_host = _host_files(host)
        init = pod["spec"]["initContainers"][0]
        done = _run_in_pod(init["args"], host, setup, init, node)
        assert done["complete"], done
        assert _host_files(host) != before_host, "setup changed nothing on the host"
        labeller = identity(kube, labeller_ds, node, work / "labeller", namespace=PROD_NS)
        lab = labeller.pod["spec"]["containers"][0]
        volumes = {v["name"]: v for v in labeller.pod["spec"]["volumes"]}
        configs = config_map_files(kube.get("v1", "ConfigMap", volumes["config"]["configMap"]["name"], PROD_NS)[
            "data"], work / "labeller-configs")  # the device plugin's ConfigMap, as the labeller mounts it
        _run_in_pod(with_config_dir(one_run(lab["args"]), configs), host, labeller, lab, node)
        labelled = kube.get("v1", "Node", node)
        assert labelled["spec"].get("taints"), "the labeller put the group's taint on"
        assert "nvidia.com/gpu.product" in labelled["metadata"]["labels"]

        config = yaml.safe_load(prod.config_file().read_text())
        config["config"]["nvidia-gpu:nodeGroups"] = [g for g in config["config"]["nvidia-gpu:nodeGroups"]
                                                     if g["name"] != PROD_GROUP]
        prod.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
        up = subprocess.Popen(["pulumi", "up", "--yes", "--skip-preview", "--non-interactive"], cwd=prod.directory,
                              env=prod.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            def terminating() -> dict[str, Any] | None:
                p = kube.get_or_none("v1", "Pod", pod["metadata"]["name"], PROD_NS)
                return p if p and p["metadata"].get("deletionTimestamp") else None

            dying = wait_for(terminating, timeout=300, what="the setup pod terminating")
            hold = dying["spec"]["containers"][0]
            command = hold["lifecycle"]["preStop"]["exec"]["command"]
            assert command[:len(AGENT)] == list(AGENT)
            torn = _run_in_pod(command[len(AGENT):], host, setup, hold, node)
            assert torn["complete"], torn
        finally:
            _release(kube, pod)  # the kubelet is done with the pod: the delete (and so `up`) can finish
            out, _ = up.communicate(timeout=300)
        assert up.returncode == 0, out[-6000:]
    finally:
        _release(kube, pod)
    after = kube.get("v1", "Node", node)
    assert after["metadata"]["labels"] == before_node["metadata"]["labels"]
    assert after["metadata"].get("annotations") == before_node["metadata"].get("annotations")
    assert after["spec"].get("taints") == before_node["spec"].get("taints")
    assert _host_files(host) == before_host
    assert not [d for d in kube.list("apps/v1", "DaemonSet", PROD_NS) if PROD_GROUP in d["metadata"]["name"]]
    kube.delete("v1", "Node", node)
