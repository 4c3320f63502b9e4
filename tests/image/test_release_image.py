"""A release built from a tag, as .github/workflows/release.yml builds it, up to the push (tools/release.py build).

The checkout is this working tree committed into a scratch repository and tagged ``v<VERSION>`` (the tag's
commit time fixed, so ``SOURCE_DATE_EPOCH`` is known). It is built twice, each time into a buildah storage of
its own (the debootstrap base imported again): the image digests are one (the build is reproducible), and
the archive holds the image under that digest, its SBOM lists what the image runs, the wheel carries the
version. Needs what tests/image/test_agent_image.py needs (root, buildah, debootstrap, an index for pip).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from nvgpu.version import VERSION
from tests.kit.tools import missing

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
#: The tag's commit time: 2026-12-06T00:00:00Z.
EPOCH = 1796515200


def _scratch_checkout(where: Path) -> Path:
    """This working tree (tracked and untracked-not-ignored files) as a repository with the release tag."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, where / rel)
    env = dict(os.environ, GIT_AUTHOR_DATE=f"@{EPOCH}", GIT_COMMITTER_DATE=f"@{EPOCH}")
    git = ["git", "-C", str(where), "-c", "user.name=release", "-c", "user.email=release@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", f"Release {VERSION}"], ["tag", f"v{VERSION}"]):
        subprocess.run([*git, *args], check=True, env=env, capture_output=True)
    return where


def _build(checkout: Path, out: Path, storage: Path) -> tuple[dict[str, Any], float]:
    env = dict(os.environ)
    if list(LOCAL_CAS.glob("*.crt")):
        env["CA_DIR"] = str(LOCAL_CAS)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(checkout / "tools" / "release.py"), "build", "--tag", f"v{VERSION}",
                           "--out", str(out), "--buildah-root", str(storage)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    record: dict[str, Any] = json.loads(done.stdout)
    return record, time.monotonic() - started


@pytest.mark.timeout(3000)
def test_a_tag_builds_the_image_reproducibly_and_the_packages(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing("the release build needs root (buildah's chroot isolation)")
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            missing(f"the release build needs {tool}: apt-get install buildah debootstrap (make deps does)")
    checkout = _scratch_checkout(tmp_path / "checkout")
    first, took_first = _build(checkout, tmp_path / "dist1", tmp_path / "storage1")
    second, took_second = _build(checkout, tmp_path / "dist2", tmp_path / "storage2")
    print(f"release build: {took_first:.0f} s, again in a fresh storage {took_second:.0f} s")
    try:
        assert first["sourceDateEpoch"] == EPOCH and first["version"] == VERSION
        assert first["image"]["digest"] == second["image"]["digest"], "one commit on one base: one digest"
        # Every file alike but the sdist (setuptools stamps its gzip header with the time it was written).
        assert {k: v for k, v in first["files"].items() if not k.endswith(".tar.gz")} == {
            k: v for k, v in second["files"].items() if not k.endswith(".tar.gz")}
        out = tmp_path / "dist1"
        for name, digest in first["files"].items():
            assert subprocess.run(["sha256sum", str(out / name)], capture_output=True, text=True,
                                  check=True).stdout.split()[0] == digest.removeprefix("sha256:"), name
        with tarfile.open(out / first["image"]["archive"]) as tar:
            index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
            manifest = json.load(tar.extractfile(  # type: ignore[arg-type]
                "blobs/sha256/" + first["image"]["digest"].removeprefix("sha256:")))
            config = json.load(tar.extractfile(  # type: ignore[arg-type]
                "blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:")))
        assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == VERSION
        assert config["created"] == "2026-12-06T00:00:00Z", config["created"]
        assert config["config"]["Entrypoint"] == ["python", "-m", "node_agent"]
        labels = config["config"]["Labels"]
        assert (labels["org.opencontainers.image.version"], labels["org.opencontainers.image.revision"]) == (
            VERSION, first["commit"])
        assert first["image"]["baseLayer"] == config["rootfs"]["diff_ids"][0]
        # What a mirror does with the archive (skopeo/buildah read it, the digest kept), then the agent runs.
        buildah = ["buildah", "--storage-driver", "vfs", "--root", str(tmp_path / "loaded" / "root"),
                   "--runroot", str(tmp_path / "loaded" / "run")]
        loaded = subprocess.run([*buildah, "pull", "--quiet", f"oci-archive:{out / first['image']['archive']}"],
                                capture_output=True, text=True, timeout=300, check=True).stdout.strip()
        digests = subprocess.run([*buildah, "images", "--digests", "--format", "{{.Digest}}"], capture_output=True,
                                 text=True, timeout=60, check=True).stdout.split()
        assert digests == [first["image"]["digest"]]
        ctr = subprocess.run([*buildah, "from", "--quiet", "--pull-never", loaded], capture_output=True, text=True,
                             timeout=60, check=True).stdout.strip()
        shown = subprocess.run([*buildah, "run", "--isolation", "chroot", ctr, "--", "python", "-m", "node_agent",
                                "--version"], capture_output=True, text=True, timeout=120, check=False)
        assert shown.stdout == f"nvidia-gpu node agent {VERSION}\n", shown.stderr

        sbom = json.loads((out / f"nvidia-gpu-agent-{VERSION}.sbom.cdx.json").read_text())
        names = {c["purl"].split("@")[0] for c in sbom["components"]}
        pins = [ln.split("==") for ln in (REPO / "requirements-agent.txt").read_text().splitlines() if "==" in ln]
        for name, version in pins:
            assert f"pkg:pypi/{name.lower()}@{version}" in {c["purl"] for c in sbom["components"]}, name
        assert {"pkg:deb/debian/python3", "pkg:deb/debian/libc6"} <= names
        assert not any("pulumi" in n or n.endswith("/pip") for n in names), "only what the image holds"
        assert sbom["metadata"]["component"]["purl"].startswith("pkg:oci/nvidia-gpu-agent@sha256%3A")
        assert (out / f"nvidia-gpu-agent-{VERSION}.sbom.cdx.json").read_bytes() == (
            tmp_path / "dist2" / f"nvidia-gpu-agent-{VERSION}.sbom.cdx.json").read_bytes()

        with zipfile.ZipFile(out / f"nvidia_gpu-{VERSION}-py3-none-any.whl") as wheel:
            metadata = wheel.read(f"nvidia_gpu-{VERSION}.dist-info/METADATA").decode()
            assert f"\nVersion: {VERSION}\n" in metadata and "nvgpu/version.py" in wheel.namelist()
        schema = json.loads((out / f"nvidia-gpu-{VERSION}.schema.json").read_text())
        assert (schema["name"], schema["version"]) == ("nvidia-gpu", VERSION)
        notes = (out / "release-notes.md").read_text()
        assert notes.strip() and "## [" not in notes, "the CHANGELOG entry's body"
    finally:
        for storage in ("storage1", "storage2", "loaded"):
            subprocess.run(["buildah", "--storage-driver", "vfs", "--root", str(tmp_path / storage / "root"),
                            "--runroot", str(tmp_path / storage / "run"), "rmi", "--all", "--force"],
                           capture_output=True, check=False)
