"""The workflows' first check: the stack's kube context is in the CI secret's kubeconfig."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nvidia_gpu.preview import kubecontext

REPO = Path(__file__).resolve().parents[3]


def _kubeconfig(path: Path, *names: str, current: str | None = None) -> Path:
    contexts = [{"name": n, "context": {"cluster": "c", "user": "u"}} for n in names]
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": current,
                                    "contexts": contexts}))
    return path


def test_the_shipped_stacks_context_is_found(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config", "other", "dev")
    assert kubecontext.main(["--stack", "dev", "--project-dir", str(REPO), str(config)]) == 0


def test_a_missing_context_says_which_and_what_there_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _kubeconfig(tmp_path / "config", "kubernetes-admin@prod")
    assert kubecontext.main(["--stack", "prod", "--project-dir", str(REPO), str(config)]) == 1
    err = capsys.readouterr().err
    assert "no context 'prod', which Pulumi.prod.yaml names in nvidia-gpu:cluster.kubeContext" in err
    assert "the kubeconfig has: kubernetes-admin@prod" in err


def test_without_a_kube_context_the_current_one_must_exist(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.ci.yaml"
    doc = yaml.safe_load((REPO / "Pulumi.prod.yaml").read_text())
    doc["config"]["nvidia-gpu:cluster"].pop("kubeContext")
    stack.write_text(yaml.safe_dump(doc))
    assert kubecontext.problem(stack, _kubeconfig(tmp_path / "a", "x", current="x")) is None
    found = kubecontext.problem(stack, _kubeconfig(tmp_path / "b", "x", current="gone"))
    assert found is not None and "current-context 'gone' is not one of its contexts (x)" in found


def test_an_unreadable_kubeconfig_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    found = kubecontext.problem(REPO / "Pulumi.dev.yaml", tmp_path / "missing")
    assert found is not None and "cannot read the kubeconfig" in found


def test_the_provider_merges_the_kubeconfig_path_list(tmp_path: Path) -> None:
    """``$KUBECONFIG`` is a path list the provider merges, as kubectl does; a missing file is skipped."""
    a = _kubeconfig(tmp_path / "a", "staging", current="staging")
    b = _kubeconfig(tmp_path / "b", "prod")
    files = kubecontext.kubeconfig_files({"KUBECONFIG": f"{a}:{tmp_path / 'gone'}:{b}", "HOME": str(tmp_path)})
    assert files == [a, tmp_path / "gone", b]
    assert kubecontext.context_problem("prod", files) is None
    assert kubecontext.context_problem(None, files) is None  # the first file's current context
    wrong = kubecontext.context_problem("dev", files, "Pulumi.dev.yaml")
    assert wrong is not None and "\n" not in wrong
    assert wrong.startswith(f"{a}, {b}: no context 'dev', which Pulumi.dev.yaml names") and "prod, staging" in wrong


def test_without_kubeconfig_the_home_file_is_read_and_none_at_all_is_left_to_the_provider(tmp_path: Path) -> None:
    assert kubecontext.kubeconfig_files({"HOME": str(tmp_path)}) == [tmp_path / ".kube" / "config"]
    assert kubecontext.context_problem("dev", [tmp_path / ".kube" / "config"]) is None  # in-cluster, maybe


def test_an_unreadable_kubeconfig_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "config"
    bad.write_text("contexts: [\n  - {")
    wrong = kubecontext.context_problem("dev", [bad])
    assert wrong is not None and wrong.startswith(f"{bad}: cannot read the kubeconfig") and "\n" not in wrong
