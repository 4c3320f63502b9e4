"""The release's checks and rewrites (tools/release.py): one version everywhere, refusals in one line.

What needs buildah (the image built from a tag, twice to one digest) is tests/image/test_release_image.py;
the workflow that calls the script is linted with the others (tests/repo/test_workflows.py).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nvgpu.stackconfig import AgentImage, load_stack_file
from nvgpu.version import VERSION
from nvidia_gpu.package import schema
from tests.kit.scripts import load_tool

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "release.py"
DIGEST = "sha256:" + "0123456789abcdef" * 4


release = load_tool("release")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The files a release reads, copied from the repository."""
    for rel in ["nvgpu/version.py", "CHANGELOG.md", "policies/PulumiPolicy.yaml",
                *(p.name for p in REPO.glob("Pulumi.*.yaml"))]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, tmp_path / rel)
    return tmp_path


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_the_repository_is_releasable_at_its_version() -> None:
    done = _cli(REPO, "check", "--tag", f"v{VERSION}")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"release v{VERSION}: version {VERSION}, CHANGELOG, policy pack and stacks agree\n"


def test_one_version_for_the_library_the_agent_the_package_and_the_pack() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nvgpu.version.VERSION"}
    assert yaml.safe_load((REPO / "policies" / "PulumiPolicy.yaml").read_text())["version"] == VERSION
    agent = subprocess.run([sys.executable, "-m", "node_agent", "--version"], cwd=REPO, capture_output=True,
                           text=True, timeout=60, check=False)
    assert agent.returncode == 0 and agent.stdout == f"nvidia-gpu node agent {VERSION}\n", agent.stderr

    assert json.loads(schema())["version"] == VERSION
    for stack in sorted(REPO.glob("Pulumi.*.yaml")):
        assert load_stack_file(stack).cluster.agent_image.tag == VERSION, stack.name


Mutation = Callable[[Path], object]

REFUSALS: list[tuple[str, Mutation, str]] = [
    ("v9.9.9", lambda t: None,
     f"release: tag 'v9.9.9' does not match VERSION '{VERSION}' in nvgpu/version.py: tag the release v{VERSION}, "
     "or change VERSION (tools/release.py set-version)"),
    (f"v{VERSION}", lambda t: _edit(t / "CHANGELOG.md", f"## [{VERSION}]", "## [0.0.1]"),
     f"release: CHANGELOG.md: no entry '## [{VERSION}] - YYYY-MM-DD' (entries: Unreleased, 0.0.1)"),
    (f"v{VERSION}", lambda t: (t / "CHANGELOG.md").unlink(),
     f"release: CHANGELOG.md: missing; a release needs its entry '## [{VERSION}] - YYYY-MM-DD'"),
    (f"v{VERSION}", lambda t: (t / "CHANGELOG.md").write_text(f"# Changelog\n\n## [{VERSION}]\n\n- x\n"),
     f"release: CHANGELOG.md: the entry '## [{VERSION}]' has no release date: write '## [{VERSION}] - YYYY-MM-DD'"),
    (f"v{VERSION}", lambda t: (t / "CHANGELOG.md").write_text(f"## [{VERSION}] - 2026-12-06\n## [0.0.1] - 2026-01-01"),
     f"release: CHANGELOG.md: the entry '## [{VERSION}]' is empty: say what the release changes"),
    (f"v{VERSION}", lambda t: _edit(t / "policies" / "PulumiPolicy.yaml", f"version: {VERSION}", "version: 0.0.1"),
     f"release: policies/PulumiPolicy.yaml: version is '0.0.1', the release is '{VERSION}'"),
    (f"v{VERSION}", lambda t: _edit(t / "Pulumi.prod.yaml", f"tag: {VERSION}", "tag: 0.0.1"),
     f"release: Pulumi.prod.yaml: nvidia-gpu:cluster.agentImage.tag is '0.0.1', the release is '{VERSION}' "
     "(the components and the agent are released together)"),
    (f"v{VERSION}", lambda t: _edit(t / "Pulumi.drivers.yaml", f"tag: {VERSION}\n",
                                    f"tag: {VERSION}\n      digest: sha256:abc\n"),
     "release: Pulumi.drivers.yaml: nvidia-gpu:cluster.agentImage.digest 'sha256:abc' is not sha256:<64 hex digits>"),
    ("v0.1", lambda t: (t / "nvgpu" / "version.py").write_text('VERSION = "0.1"\n'),
     "release: nvgpu/version.py: VERSION '0.1' is not MAJOR.MINOR.PATCH"),
]


@pytest.mark.parametrize(("tag", "mutate", "message"), REFUSALS, ids=[m.split(":")[1].strip() for _, _, m in REFUSALS])
def test_a_release_that_does_not_agree_is_refused_in_one_line(tree: Path, tag: str, mutate: Mutation,
                                                              message: str) -> None:
    mutate(tree)
    done = _cli(tree, "check", "--tag", tag)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", message + "\n")


def test_the_notes_are_the_changelog_entry_then_how_to_install_the_pushed_image(tree: Path, tmp_path: Path) -> None:
    done = _cli(tree, "notes", "--tag", f"v{VERSION}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("The first release.\n\n### Added\n") and "## [" not in done.stdout
    out = tmp_path / "dist"
    out.mkdir()
    (out / "release.json").write_text(json.dumps({"version": VERSION, "image": {
        "digest": DIGEST, "repository": "ghcr.io/example/nvidia-gpu-agent"}}))
    pushed = _cli(tree, "notes", "--tag", f"v{VERSION}", "--out", str(out)).stdout
    snippet = pushed.split("```yaml\n", 1)[1].split("```", 1)[0]
    image = AgentImage.model_validate(yaml.safe_load(snippet)["agentImage"])
    assert image.ref == f"ghcr.io/example/nvidia-gpu-agent:{VERSION}@{DIGEST}"


def test_pin_writes_the_pushed_digest_into_every_stack_keeping_the_rest(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "dist"
    out.mkdir()
    before = {p.name: p.read_text() for p in tree.glob("Pulumi.*.yaml")}
    (out / "release.json").write_text(json.dumps({"version": VERSION, "image": {"digest": DIGEST}}))
    unpushed = _cli(tree, "pin", "--out", str(out))
    assert (unpushed.returncode, unpushed.stderr) == (
        1, f"release: {out / 'release.json'}: the image was not pushed (tools/release.py push)\n")
    (out / "release.json").write_text(json.dumps({"version": VERSION, "image": {
        "digest": DIGEST, "repository": "ghcr.io/example/nvidia-gpu-agent"}}))
    done = _cli(tree, "pin", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"pinned {name}: tag {VERSION}, digest {DIGEST}" for name in sorted(before)]
    for name, text in before.items():
        stack = tree / name
        image = load_stack_file(stack).cluster.agent_image
        original = load_stack_file(REPO / name).cluster.agent_image
        # The repository stays the stack's own (a mirror serves the same digest); the reference renders pinned.
        assert (image.repository, image.tag, image.digest) == (original.repository, VERSION, DIGEST)
        assert image.ref == f"{original.repository}:{VERSION}@{DIGEST}"
        new = stack.read_text()
        assert new.replace(f"      digest: {DIGEST}\n", "") == text, "only the digest line is added"
        assert yaml.safe_load(new)["config"].keys() == yaml.safe_load(text)["config"].keys()
    again = _cli(tree, "pin", "--out", str(out))
    assert again.returncode == 0 and again.stdout == "", "pinned twice changes nothing"
    assert _cli(tree, "check", "--tag", f"v{VERSION}").returncode == 0


def test_set_version_starts_the_next_release_everywhere(tree: Path) -> None:
    _edit(tree / "Pulumi.prod.yaml", f"tag: {VERSION}\n", f"tag: {VERSION}\n      digest: {DIGEST}\n")
    _edit(tree / "CHANGELOG.md", "## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n\n- Something.\n")
    done = _cli(tree, "set-version", "9.8.7")
    assert done.returncode == 0, done.stderr
    assert 'VERSION = "9.8.7"' in (tree / "nvgpu" / "version.py").read_text()
    assert yaml.safe_load((tree / "policies" / "PulumiPolicy.yaml").read_text())["version"] == "9.8.7"
    for stack in tree.glob("Pulumi.*.yaml"):
        image = load_stack_file(stack).cluster.agent_image
        assert (image.tag, image.digest) == ("9.8.7", None), "the old release's digest is not the new tag's"
    log = (tree / "CHANGELOG.md").read_text()
    assert "## [Unreleased]\n\n## [9.8.7] - " in log and log.index("- Something.") < log.index(f"## [{VERSION}]")
    check = _cli(tree, "check", "--tag", "v9.8.7")
    assert check.returncode == 0, check.stderr
    bad = _cli(tree, "set-version", "10")
    assert (bad.returncode, bad.stderr) == (1, "release: version '10' is not MAJOR.MINOR.PATCH\n")


def test_set_version_without_an_unreleased_section_changes_nothing(tree: Path) -> None:
    _edit(tree / "CHANGELOG.md", "## [Unreleased]\n", "")
    before = {p: p.read_text() for p in tree.rglob("*") if p.is_file()}
    done = _cli(tree, "set-version", "9.8.7")
    assert (done.returncode, done.stderr) == (
        1, "release: CHANGELOG.md: no '## [Unreleased]' section to turn into the release's entry\n")
    assert {p: p.read_text() for p in tree.rglob("*") if p.is_file()} == before


def test_a_stack_without_an_agent_image_block_cannot_be_pinned() -> None:
    with pytest.raises(release.ReleaseError, match=r"^Pulumi.x.yaml: no 'agentImage:' mapping under nvidia-gpu"):
        release._rewrite_agent_image("config:\n  nvidia-gpu:cluster:\n    namespace: x\n", {"tag": "1.0.0"},
                                     "Pulumi.x.yaml")


def test_the_image_digest_is_the_archives_manifest(tmp_path: Path) -> None:
    archive = tmp_path / "image.oci.tar"
    with tarfile.open(archive, "w") as tar:
        index = json.dumps({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": DIGEST, "size": 1}]}).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        tar.addfile(info, io.BytesIO(index))
    assert release.oci_archive_digest(archive) == DIGEST


def test_a_build_needs_the_tagged_commit_checked_out_clean(tmp_path: Path) -> None:
    """``build`` refuses a tag that is not there, before anything is built."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=lambda d, names: [n for n in names if n not in {
        "nvgpu", "version.py", "CHANGELOG.md", "policies", "PulumiPolicy.yaml", "tools", "release.py"}
        and not n.startswith("Pulumi.")])
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)
    done = _cli(repo, "build", "--tag", f"v{VERSION}", "--out", str(tmp_path / "dist"), "--no-image")
    assert (done.returncode, done.stderr) == (
        1, f"release: tag 'v{VERSION}' is not in {repo}: a release builds a tagged commit (git tag v{VERSION})\n")
    subprocess.run([*git, "tag", f"v{VERSION}"], check=True)
    (repo / "CHANGELOG.md").write_text((repo / "CHANGELOG.md").read_text() + "\n- more\n")
    done = _cli(repo, "build", "--tag", f"v{VERSION}", "--out", str(tmp_path / "dist"), "--no-image")
    assert (done.returncode, done.stderr) == (
        1, f"release: the working tree differs from tag v{VERSION} (M CHANGELOG.md, ...): a release builds exactly "
           "the tagged commit\n")
    assert not (tmp_path / "dist").exists()


def test_the_workflow_runs_on_release_tags_and_calls_what_the_script_has() -> None:
    """Every ``tools/release.py`` call in release.yml names a subcommand and options the script accepts."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    assert workflow[True]["push"] == {"tags": ["v*"]}  # YAML 1.1 reads the key `on` as true
    scripts = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    calls = [line.split("tools/release.py", 1)[1].split() for script in scripts
             for line in script.replace("\\\n", " ").splitlines() if re.search(r"python\S*\s+tools/release\.py", line)]
    assert {call[0] for call in calls} == {"check", "build", "push", "notes", "pin"}
    for command, *rest in calls:
        usage = _cli(REPO, command, "--help").stdout
        for option in (word for word in rest if word.startswith("--")):
            assert option in usage, f"release.yml passes {option} to `{command}`, which does not take it"
