"""The preview's steps in process: recording, rendering order, schema and CRD validation, step plumbing."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pulumi
import pytest

from nvidia_gpu.preview import crds, render, stackfile, summary, validate
from nvidia_gpu.preview.engine import install_mocks, normalise, run_in_engine
from nvidia_gpu.preview.model import PreviewResult, Problem, RecordedResource, RenderedManifest
from nvidia_gpu.preview.pipeline import DEFAULT_STEPS, Step, new_result, run_steps
from nvidia_gpu.preview.policyrun import preview_step
from nvidia_gpu.preview.validate import BackgroundValidator, inline_refs, validate_manifest, validate_object

ROOT = Path(__file__).resolve().parents[3]


def _resource(obj: dict[str, Any], type_token: str | None = None) -> RecordedResource:
    token = type_token or f"kubernetes:{obj['apiVersion']}:{obj['kind']}"
    return RecordedResource(token, obj["metadata"]["name"], f"urn:{token}::{obj['metadata']['name']}", None, True,
                            None, obj)


def _manifest(obj: dict[str, Any], patch: bool = False) -> RenderedManifest:
    token = f"kubernetes:{obj['apiVersion']}:{obj['kind']}" + ("Patch" if patch else "")
    return RenderedManifest(1, "x.yaml", obj, _resource(obj, token), patch=patch)


CONFIG_MAP: dict[str, Any] = {
    "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}, "data": {"a": "b"},
}
NGC: dict[str, Any] = {
    "apiVersion": "deckhouse.io/v1alpha1",
    "kind": "NodeGroupConfiguration",
    "metadata": {"name": "gpu-check.sh"},
    "spec": {"weight": 30, "nodeGroups": ["gpu"], "bundles": ["*"], "content": "echo\n"},
}
NODE_GROUP_PATCH: dict[str, Any] = {
    "apiVersion": "deckhouse.io/v1",
    "kind": "NodeGroup",
    "metadata": {"name": "gpu", "annotations": {"pulumi.com/patchForce": "true"}},
    "spec": {"nodeTemplate": {"labels": {"a": "b"}, "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}},
}


def test_normalise_restores_integers_and_orders_keys() -> None:
    assert normalise({"spec": {"weight": 30.0, "ratio": 0.5}, "kind": "K", "apiVersion": "v"}) == {
        "apiVersion": "v", "kind": "K", "spec": {"ratio": 0.5, "weight": 30}}
    assert list(normalise({"z": 1, "metadata": {}, "apiVersion": "v"})) == ["apiVersion", "metadata", "z"]


def test_builtin_kinds_validate_strictly() -> None:
    assert validate_manifest(_manifest(CONFIG_MAP), "1.34") == []
    bad = copy.deepcopy(CONFIG_MAP)
    bad["dta"] = {}
    bad["metadata"]["labels"] = {"x": 5}
    problems = validate_manifest(_manifest(bad), "1.34")
    assert len(problems) == 2
    assert any("'dta' was unexpected" in p for p in problems)
    assert any(p.startswith("metadata.labels.x: 5 is not of type") for p in problems)


def test_custom_resources_validate_against_their_crd() -> None:
    assert validate_manifest(_manifest(NGC), "1.34") == []
    bad = copy.deepcopy(NGC)
    bad["spec"]["weight"] = "thirty"
    del bad["spec"]["bundles"]
    bad["spec"]["nodegroups"] = ["x"]
    problems = validate_manifest(_manifest(bad), "1.34")
    assert any("spec.weight" in p and "integer" in p for p in problems)
    assert any("'bundles' is a required property" in p for p in problems)
    assert any("'nodegroups' was unexpected" in p for p in problems)


def test_patches_skip_required_fields_but_not_types_or_unknown_keys() -> None:
    assert validate_manifest(_manifest(NODE_GROUP_PATCH, patch=True), "1.34") == []
    bad = copy.deepcopy(NODE_GROUP_PATCH)
    bad["spec"]["nodeTemplate"]["taints"][0]["effect"] = "Sometimes"
    bad["spec"]["nodeTemplate"]["lables"] = {}
    problems = validate_manifest(_manifest(bad, patch=True), "1.34")
    assert any("spec.nodeTemplate.taints[0].effect" in p for p in problems)
    assert any("'lables' was unexpected" in p for p in problems)


def test_unknown_kind_is_a_problem() -> None:
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    (problem,) = validate_manifest(_manifest(obj), "1.34")
    assert "no schema for example.com/v1 Widget" in problem


def test_vendored_crds_cover_the_deckhouse_kinds() -> None:
    found = crds.load_crds()
    assert ("deckhouse.io/v1alpha1", "NodeGroupConfiguration") in found
    assert ("deckhouse.io/v1", "NodeGroup") in found


def test_render_orders_namespaces_first_and_custom_resources_last() -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d", "namespace": "n"}, "spec": {}}
    resources = (_resource(NGC), _resource(ds), _resource(CONFIG_MAP), _resource(ns))
    files = [m.filename for m in render.render_manifests(resources)]
    assert files == ["001-namespace-n.yaml", "002-configmap-c.yaml", "003-daemonset-d.yaml",
                     "004-nodegroupconfiguration-gpu-check.sh.yaml"]


def test_a_patch_file_says_how_the_stack_applies_it() -> None:
    """The header names the patch's own field manager and no --force-conflicts: the stack never takes a
    field over, so applying the file by hand the way it says must not either."""
    patch = {"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
             "metadata": {"name": "gpu-l4", "annotations": {"pulumi.com/patchFieldManager": "nvidia-gpu.ns"}}}
    text = render.manifest_text(RenderedManifest(1, "001-nodegroup-gpu-l4.yaml", patch, _resource(patch), patch=True))
    assert "#   kubectl apply --server-side --field-manager=nvidia-gpu.ns -f <this file>\n" in text
    assert "--force-conflicts" not in text


def test_engine_config_encodes_like_the_pulumi_engine() -> None:
    encoded, secrets = stackfile.engine_config(
        {"nvidia-gpu:cluster": {"a": 1}, "kubernetes:context": "dev", "x:y": {"secure": "AAA"}})
    assert encoded == {"nvidia-gpu:cluster": '{"a": 1}', "kubernetes:context": "dev"}
    assert secrets == ["x:y"]


def test_a_later_step_sees_the_recorded_resources(tmp_path: Path) -> None:
    seen: list[PreviewResult] = []
    steps = (*DEFAULT_STEPS, Step("extra", seen.append))
    result = run_steps(new_result(ROOT, "dev", tmp_path), steps)
    assert result.ok, result.problems
    (same,) = seen
    assert same is result
    assert any(r.type_token == "kubernetes:apps/v1:DaemonSet" for r in result.resources)
    plugin = next(r for r in result.resources if r.name == "h100-mig-device-plugin")
    parent = result.parent_of(plugin)
    assert parent is not None and parent.type_token == "nvidia-gpu:index:GpuNodeGroup"
    assert {"config", "program", "render", "validate", "extra"} <= set(result.timings_ms)


def test_config_problems_stop_before_the_program_runs(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  nvidia-gpu:clustr: {}\n")
    result = run_steps(new_result(tmp_path, "bad", tmp_path / "out"))
    assert [p.subject for p in result.problems] == ["nvidia-gpu:cluster", "nvidia-gpu:nodeGroups", "nvidia-gpu:clustr"]
    assert result.resources == () and "program" not in result.timings_ms


@pytest.mark.parametrize("value", ["{secure: AAAA}"])
def test_secrets_in_our_namespace_are_refused(tmp_path: Path, value: str) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.s.yaml").write_text(f"config:\n  nvidia-gpu:cluster: {value}\n")
    result = run_steps(new_result(tmp_path, "s", tmp_path / "out"))
    assert [str(p) for p in result.problems] == [
        "[config] nvidia-gpu:cluster: is a secret, which the offline preview cannot decrypt"]


def test_deep_errors_survive_reference_inlining() -> None:
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "n"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicyy": "Always",
                                         "resources": {"limits": {"cpu": []}}}]},
            },
        },
    }
    problems = validate_manifest(_manifest(ds), "1.34")
    assert any(p.startswith("spec.template.spec.containers[0]:") and "'imagePullPolicyy'" in p for p in problems)
    assert any(p.startswith("spec.template.spec.containers[0].resources.limits.cpu:") for p in problems)


def test_inline_refs_keeps_recursive_references() -> None:
    defs = {"Node": {"type": "object", "properties": {"child": {"$ref": "/x#/$defs/Node"}}},
            "Leaf": {"type": "string"}}
    out = inline_refs({"properties": {"n": {"$ref": "/x#/$defs/Node"}, "l": {"$ref": "/x#/$defs/Leaf"}}}, defs, {})
    assert out["properties"]["l"] == {"type": "string"}
    assert out["properties"]["n"]["properties"]["child"] == {"$ref": "/x#/$defs/Node"}


def test_background_validator_gives_the_same_answers_as_in_process() -> None:
    bad = copy.deepcopy(CONFIG_MAP)
    bad["dta"] = {}
    worker = BackgroundValidator("1.34")
    try:
        worker.submit("good", CONFIG_MAP, False)
        worker.submit("bad", bad, False)
        worker.submit("patch", NODE_GROUP_PATCH, True)
        results = worker.results(timeout_s=60)
    finally:
        worker.close()
    assert results == {
        "good": [],
        "bad": validate_object(bad, "1.34"),
        "patch": [],
    }
    assert results["bad"]


def test_large_stacks_validate_while_the_program_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validate, "PARALLEL_MIN_GROUPS", 1)
    steps = [s for s in DEFAULT_STEPS if s.name in ("config", "validate-start", "program", "render", "validate")]
    result = run_steps(new_result(ROOT, "dev", tmp_path), steps)
    assert result.ok, result.problems
    assert result.listeners, "the worker should have been fed by the program step"
    assert result.handoff == {}


def test_summary_counts_per_kind_and_per_node_group(tmp_path: Path) -> None:
    steps = [s for s in DEFAULT_STEPS if s.name in ("config", "program", "render")]
    result = run_steps(new_result(ROOT, "prod", tmp_path), steps)
    lines = summary.summary_lines(result)
    text = "\n".join(lines)
    assert f"    + {len(result.resources)} to create" in lines
    assert " +   pulumi:pulumi:Stack" in text and "├─ nvidia-gpu:index:GpuNodeGroup" in text
    by_group = lines[lines.index("By node group:") + 1:]
    counted = {line.split()[1]: int(line.split()[0]) for line in by_group if line.startswith("    ") and line.strip()}
    assert {"h100-train", "l4-inference", "a100-mig", "(cluster-wide)"} <= set(counted)
    assert sum(counted.values()) == len(result.resources)
    kinds = lines[lines.index("By kind:") + 1: lines.index("By node group:") - 1]
    assert any(line.split()[-1] == "DaemonSet" for line in kinds)


def test_a_second_run_in_one_process_gets_its_own_root_stack() -> None:
    """The SDK keeps the first ``set_mocks``' root stack resource; a later run for another stack must not
    parent its components under the earlier stack's URN (CI's full suite ran a ``test`` stack first)."""
    parents = {}
    for stack in ("first", "second"):
        monitor = install_mocks("nvidia-gpu", stack)
        run_in_engine(lambda: pulumi.ComponentResource("nvidia-gpu:index:Probe", "probe"))
        (record,) = monitor.recorded_resources()
        parents[stack] = record.parent_urn
    assert parents == {stack: f"urn:pulumi:{stack}::nvidia-gpu::pulumi:pulumi:Stack::nvidia-gpu-{stack}"
                       for stack in ("first", "second")}


def test_the_pack_starts_with_the_config_and_stops_whatever_happens_after(tmp_path: Path) -> None:
    """The pack's process starts right after the config, on a thread, so its start overlaps the program's;
    a run that stops before the policy step (here a step that fails) still stops it."""
    seen: list[preview_step.StartingPack] = []

    def failing(result: PreviewResult) -> None:
        starting = result.handoff["policies"]
        assert isinstance(starting, preview_step.StartingPack)
        seen.append(starting)
        assert starting.wait().info is not None  # started meanwhile, and answering
        result.problems.append(Problem("boom", "x", "a step failed"))

    steps = [s for s in DEFAULT_STEPS if s.name in ("config", "policies-start")] + [Step("boom", failing)]
    result = run_steps(new_result(ROOT, "dev", tmp_path), steps)
    assert [p.step for p in result.problems] == ["boom"] and result.handoff == {}
    assert seen[0].pack._proc is None  # stopped by the pipeline
