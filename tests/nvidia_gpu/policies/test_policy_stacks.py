"""The shipped stacks pass every policy, in process and through the real pack; the preview step fails on violations.

The program runs under the preview's mock engine exactly as ``make preview`` runs it; every recorded
resource then goes to every policy directly (the program-to-policy bridge) and, separately, through
the pack process over gRPC.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pulumi_policy import ResourceValidationPolicy, StackValidationPolicy

from nvgpu.version import VERSION
from nvidia_gpu.policies.pack import POLICIES
from nvidia_gpu.preview import engine, stackfile
from nvidia_gpu.preview.model import PreviewResult, Problem, RecordedResource
from nvidia_gpu.preview.pipeline import new_result
from nvidia_gpu.preview.policyrun import preview_step
from nvidia_gpu.preview.policyrun.analyzer_client import AnalyzerResource, StackContext
from nvidia_gpu.preview.policyrun.offline import PROJECT_CONFIG, load_policy_config, main, run_pack
from tests.nvidia_gpu.policies.policy_fixtures import check, check_stack, container, daemonset

ROOT = Path(__file__).resolve().parents[3]
#: Every committed stack (a hand-kept list once left the drivers stack out, which then failed its own pack).
STACKS = tuple(sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml")))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded() -> dict[str, PreviewResult]:
    out = {}
    for stack in STACKS:
        result = new_result(ROOT, stack)
        stackfile.load(result)
        engine.run(result)
        assert result.problems == [], result.problems
        out[stack] = result
    return out


def _analyzer_resources(result: PreviewResult) -> list[AnalyzerResource]:
    return [AnalyzerResource(r.type_token, r.urn, r.name, r.inputs, r.parent_urn or "", r.dependencies)
            for r in result.resources]


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stack_passes_every_policy_in_process(
    stack: str, recorded: dict[str, PreviewResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = recorded[stack]
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(result.engine_config))
    kube = [r for r in result.resources if r.is_kubernetes_object]
    assert len(kube) >= 20
    violations: list[str] = []
    for p in POLICIES:
        if isinstance(p, ResourceValidationPolicy):
            for r in kube:
                violations += [f"{p.name} {r.name}: {m}" for m in check(p.name, r.type_token, r.inputs)]
        else:
            assert isinstance(p, StackValidationPolicy)
            violations += [f"{p.name}: {m}" for m, _ in check_stack(p.name, [(r.type_token, r.inputs) for r in kube])]
    assert violations == []


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stack_passes_through_the_pack(stack: str, recorded: dict[str, PreviewResult]) -> None:
    result = recorded[stack]
    run = run_pack(_analyzer_resources(result), StackContext(result.project, stack, result.engine_config),
                   load_policy_config(PROJECT_CONFIG))
    assert run.diagnostics == ()
    assert run.resources == len(result.resources)


def test_a_broken_device_plugin_is_caught_through_the_pack(recorded: dict[str, PreviewResult]) -> None:
    result = recorded["dev"]
    resources = _analyzer_resources(result)
    i = next(i for i, r in enumerate(resources) if r.name == "h100-mig-device-plugin")
    props = copy.deepcopy(dict(resources[i].props))
    props["spec"]["template"]["spec"]["tolerations"] = []
    resources[i] = AnalyzerResource(resources[i].type, resources[i].urn, resources[i].name, props)
    run = run_pack(resources, StackContext(result.project, "dev", result.engine_config))
    assert [(d.policy_name, d.resource_name, d.message.splitlines()[-1]) for d in run.mandatory] == [(
        "gpu-daemonset-scheduling",
        "h100-mig-device-plugin",
        "DaemonSet 'device-plugin-h100-mig' does not tolerate the GPU taint nvidia.com/gpu=present:NoSchedule",
    )]


def test_preview_step_turns_mandatory_violations_into_problems(tmp_path: Path) -> None:
    privileged = container("exporter", securityContext={"privileged": True})
    ds = daemonset("exporter", role="exporter", containers=[privileged])
    urn = "urn:pulumi:dev::nvidia-gpu::kubernetes:apps/v1:DaemonSet::exporter"
    result = PreviewResult(project="nvidia-gpu", stack="dev", project_dir=ROOT, out_dir=tmp_path,
                           stack_file=ROOT / "Pulumi.dev.yaml")
    result.resources = (RecordedResource("kubernetes:apps/v1:DaemonSet", "exporter", urn, None, True, None, ds),)
    preview_step.run(result)
    assert result.problems == [Problem(
        "policies", "kubernetes:apps/v1:DaemonSet: exporter",
        "host-access-allow-listed: DaemonSet 'exporter' (role 'exporter'): container 'exporter' is privileged",
    )]
    (out,) = result.report_sections
    assert out.startswith(f"Policies:\n    ❌ nvidia-gpu@v{VERSION} (local: policies)\n"
                          "        - [mandatory]  host-access-allow-listed  (kubernetes:apps/v1:DaemonSet: exporter)\n")
    assert out.endswith("Policy violations: 1 mandatory, 0 advisory")


def _write_plan(result: PreviewResult, path: Path) -> None:
    path.write_text(json.dumps({"project": result.project, "stack": result.stack,
                                "resources": [r.as_json() for r in result.resources]}))


def test_offline_command_on_a_clean_plan(
    recorded: dict[str, PreviewResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    _write_plan(recorded["dev"], plan)
    assert main(["--plan", str(plan), "--stack-file", str(ROOT / "Pulumi.dev.yaml")]) == 0
    assert capsys.readouterr().out == (
        f"Policies:\n    ✅ nvidia-gpu@v{VERSION} (local: policies)\nPolicy violations: 0 mandatory, 0 advisory\n"
    )


def test_offline_command_fails_on_mandatory_violations(
    recorded: dict[str, PreviewResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    _write_plan(recorded["prod"], plan)
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"host-access-allow-listed": {"privilegedRoles": []}}))
    code = main(["--plan", str(plan), "--stack-file", str(ROOT / "Pulumi.prod.yaml"), "--policy-pack-config",
                 str(config)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"    ❌ nvidia-gpu@v{VERSION} (local: policies)\n" in out
    assert "- [mandatory]  host-access-allow-listed  (kubernetes:apps/v1:DaemonSet: " in out
    assert "container 'mig-manager' is privileged" in out  # the device plugin is not, outside MPS groups


def test_offline_command_rejects_a_bad_config(
    recorded: dict[str, PreviewResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    _write_plan(recorded["dev"], plan)
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"pinned-images": {"requireDigest": "yes"}}))
    assert main(["--plan", str(plan), "--policy-pack-config", str(config)]) == 2
    assert "pinned-images.requireDigest: 'yes' is not of type 'boolean'" in capsys.readouterr().err
