"""The shipped CI workflows and policy config stay wired to what exists: pack, config, stacks, make targets."""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml
from _pytest.mark.expression import Expression

from nvgpu.version import VERSION
from nvidia_gpu.policies.pack import PACK_NAME, POLICIES
from nvidia_gpu.preview.policyrun.analyzer_client import PackManifest, reconcile_config
from nvidia_gpu.preview.policyrun.offline import PROJECT_CONFIG, load_policy_config
from nvidia_gpu.sdk.analyzer import PackInfo, PolicyInfo

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = ROOT / ".github" / "workflows"


def _info() -> PackInfo:
    """The pack's info built from the policy objects, without a servicer or a process."""
    return PackInfo(PACK_NAME, VERSION, tuple(
        PolicyInfo(p.name, p.description, p.enforcement_level.value if p.enforcement_level else "advisory",
                   p.config_schema.properties if p.config_schema else {})
        for p in POLICIES
    ))


def _steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


def _workflows() -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(WORKFLOWS.glob("*.yml"))}


def test_project_policy_config_is_valid_for_the_pack() -> None:
    levels = reconcile_config(_info(), load_policy_config(PROJECT_CONFIG))
    assert set(levels) == {p.name for p in POLICIES}


def test_every_pulumi_action_runs_the_pack_with_the_project_config() -> None:
    actions = [s for doc in _workflows().values() for s in _steps(doc) if str(s.get("uses", "")).startswith(
        "pulumi/actions@")]
    assert {a["with"]["command"] for a in actions} == {"preview", "up"}
    for action in actions:
        assert (ROOT / action["with"]["policyPacks"] / "PulumiPolicy.yaml").is_file()
        assert ROOT / action["with"]["policyPackConfigs"] == PROJECT_CONFIG
    preview = next(a for a in actions if a["with"]["command"] == "preview")
    assert preview["with"]["comment-on-pr"] is True


#: Shipped stacks that are examples of a configuration, with no cluster of their own: previewed offline in
#: every pull request, never previewed against a cluster or deployed.
EXAMPLE_STACKS = ("drivers",)


def test_previews_cover_every_shipped_stack_offline_and_with_pulumi() -> None:
    every = sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml"))
    assert set(EXAMPLE_STACKS) <= set(every)
    stacks = [s for s in every if s not in EXAMPLE_STACKS]
    jobs = _workflows()["preview.yml"]["jobs"]
    assert sorted(jobs["offline"]["strategy"]["matrix"]["stack"]) == every
    assert sorted(jobs["pulumi"]["strategy"]["matrix"]["stack"]) == stacks
    assert any("make preview STACK=${{ matrix.stack }}" in str(s.get("run")) for s in jobs["offline"]["steps"])
    deploy = _workflows()["deploy.yml"]["jobs"]
    assert sorted(j["with"]["stack"] for j in deploy.values() if "with" in j) == stacks
    assert deploy["up-prod"]["needs"] == "up-dev"


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, _, version = line.partition("==")
            out[name.strip().lower()] = version.strip()
    return out


def test_pack_requirements_pin_what_the_project_pins() -> None:
    pack = _pins(ROOT / "policies" / "requirements.txt")
    project = _pins(ROOT / "requirements.txt")
    assert pack and {name: project.get(name) for name in pack} == pack
    assert "-e .." in (ROOT / "policies" / "requirements.txt").read_text().splitlines()


def test_pack_runs_in_its_own_virtualenv_when_present(tmp_path: Path) -> None:
    (tmp_path / "PulumiPolicy.yaml").write_text("runtime:\n  name: python\n  options:\n    virtualenv: venv\n")
    manifest = PackManifest.load(tmp_path)
    assert manifest.python(tmp_path) == sys.executable  # no venv yet: the CLI would fail, offline falls back
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    assert manifest.python(tmp_path) == str(tmp_path / "venv" / "bin" / "python")


def test_pr_previews_use_their_own_read_only_environments_and_skip_secretless_runs() -> None:
    """A pull request from any branch must not get the deploy environments' write credentials (or wait on
    their approvals); forks and Dependabot get no secrets at all, so their Pulumi job is skipped."""
    preview = _workflows()["preview.yml"]["jobs"]["pulumi"]
    assert preview["environment"] == "${{ matrix.stack }}-preview"
    assert "github.event.pull_request.head.repo.full_name == github.repository" in preview["if"]
    assert "dependabot[bot]" in preview["if"]
    up = _workflows()["pulumi-up.yml"]["jobs"]["up"]
    assert up["environment"] == "${{ inputs.stack }}"


def test_the_backend_and_the_stack_names_are_configurable() -> None:
    for name in ("preview.yml", "pulumi-up.yml"):
        for action in (s for s in _steps(_workflows()[name]) if str(s.get("uses", "")).startswith("pulumi/actions@")):
            assert action["with"]["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}", name
            assert "vars.PULUMI_ORG" in action["with"]["stack-name"], name
            assert set(action["env"]) == {"PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE"}, name
        checks = [s for s in _steps(_workflows()[name]) if "nvidia_gpu.preview.kubecontext" in str(s.get("run"))]
        assert checks, f"{name}: the kube context is not checked before Pulumi runs"


_TIERS = ("unit", "cluster-test", "compare-test", "image-test")


def _tier_expressions() -> dict[str, str]:
    """Each tier's ``pytest -m`` expression, read from the Makefile's recipe (written ``-m "..."``)."""
    text = (ROOT / "Makefile").read_text()
    out = {}
    for tier in _TIERS:
        recipe = text.split(f"\n{tier}:", 1)[1].split("\n\n", 1)[0]
        out[tier] = recipe.split("-m pytest", 1)[1].split(' -m "', 1)[1].split('"', 1)[0]
    return out


def _marked(markers: tuple[str, ...]) -> Callable[..., bool]:
    def matcher(name: str, /, **kwargs: str | int | bool | None) -> bool:
        return name in markers

    return matcher


def test_the_tiers_split_make_test_without_gap_or_overlap() -> None:
    """Every combination of the tier markers runs in exactly one tier, so the tiers together are make test."""
    exprs = {tier: Expression.compile(e) for tier, e in _tier_expressions().items()}
    markers = ("cluster", "compare", "image", "slow")
    for n in range(len(markers) + 1):
        for marked in combinations(markers, n):
            runs = [t for t, e in exprs.items() if e.evaluate(_marked(marked))]
            assert len(runs) == 1, f"a test marked {marked or 'nothing'} runs in {runs or 'no tier'}"


def test_the_workflow_runs_every_tier_as_a_job_the_fast_one_without_go() -> None:
    jobs = _workflows()["test.yml"]["jobs"]

    def runs(job: dict[str, Any]) -> str:
        return " ".join(str(s.get("run", "")) for s in job["steps"])

    def uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
        return [s for s in job["steps"] if str(s.get("uses", "")).startswith(action)]

    assert "make check" in runs(jobs["check"]) and not uses(jobs["check"], "actions/setup-go@")
    for job, target in (("cluster", "cluster-test"), ("compare", "compare-test"), ("image", "image-test")):
        assert f"make deps {target}" in runs(jobs[job]), job
        assert jobs[job]["needs"] == "check"
        assert uses(jobs[job], "actions/checkout@")[0]["with"]["fetch-depth"] == 0
        assert uses(jobs[job], "actions/setup-go@"), job
