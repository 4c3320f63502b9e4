#!/usr/bin/env python3
"""Release nvidia-gpu from a tag ``v<version>``: what .github/workflows/release.yml runs, and what runs here.

    python tools/release.py check --tag v0.1.0            the tag, the version and the files that repeat it agree
    python tools/release.py notes --tag v0.1.0            the CHANGELOG entry, for the GitHub release
    python tools/release.py build --tag v0.1.0 --out dist  everything a release publishes, up to the push
    python tools/release.py push --out dist --repository ghcr.io/org/nvidia-gpu-agent
    python tools/release.py pin --out dist                the example stacks' agentImage pinned to the pushed digest
    python tools/release.py set-version 0.2.0             start the next release (version, pack, stacks, CHANGELOG)

``build`` builds exactly the tagged commit (HEAD must be the tag, the tree clean) into ``--out``:

- the agent image (``node_agent/image/build.sh``) reproducibly: ``SOURCE_DATE_EPOCH`` is the tag's commit
  time, so the image's created time, history and files carry it, and one commit on one base builds to
  one digest; written as an OCI archive (``nvidia-gpu-agent-<v>.oci.tar``) whose manifest digest is the
  digest the registry will hold (``push`` copies the archive's blobs unchanged and compares);
- a CycloneDX SBOM of the image (``...sbom.cdx.json``), read from the image's own files: the Debian
  packages of its dpkg database and the Python distributions of its virtualenv (no scanner needed
  offline; the workflow attests it with GitHub's ``actions/attest-sbom``);
- the Python sdist and wheel (PEP 517 hooks of a pinned setuptools in a throwaway virtualenv, from
  ``git archive`` of the tag, never from the working tree's build litter);
- the component package's schema (``nvidia-gpu-<v>.schema.json``, versioned; ``pulumi package gen-sdk``
  takes it, and ``pulumi package add <repository>/provider@v<v>`` installs the package itself);
- ``release.json``: the version, the commit, the epoch, the image digest, its base (by layer) and every
  file's sha256.

Signing is the workflow's (keyless, GitHub's OIDC identity): it cannot be done, or tested, without a
registry and that identity. Every refusal is one line naming the file, the value and what is expected.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
IMAGE_NAME = "nvidia-gpu-agent"
#: The build backend the sdist and wheel are made with (pyproject's ``setuptools>=77``, pinned for a release).
SETUPTOOLS = "setuptools==80.9.0"
_CHANGELOG_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.+?))?\s*$", re.M)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_STACKS = "Pulumi.*.yaml"


class ReleaseError(Exception):
    """A refusal: the message is one line, shown as it is."""


@dataclass(frozen=True)
class Tree:
    """The files of one checkout a release reads and writes."""

    root: Path

    @property
    def version_file(self) -> Path:
        return self.root / "nvgpu" / "version.py"

    @property
    def changelog(self) -> Path:
        return self.root / "CHANGELOG.md"

    @property
    def policy_pack(self) -> Path:
        return self.root / "policies" / "PulumiPolicy.yaml"

    def stacks(self) -> list[Path]:
        return sorted(self.root.glob(_STACKS))

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def version(self) -> str:
        """``VERSION`` of nvgpu/version.py, read without importing it (another checkout's may differ)."""
        for node in ast.parse(self.version_file.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            if (any(isinstance(t, ast.Name) and t.id == "VERSION" for t in targets)
                    and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                return value.value
        raise ReleaseError(f"{self.rel(self.version_file)}: no VERSION = \"MAJOR.MINOR.PATCH\" assignment")


# -- check ---------------------------------------------------------------------------------------------------


def changelog_entry(tree: Tree, version: str) -> str:
    """The body of CHANGELOG.md's ``## [version] - YYYY-MM-DD`` section; refused when missing, undated or empty."""
    if not tree.changelog.is_file():
        raise ReleaseError(f"CHANGELOG.md: missing; a release needs its entry '## [{version}] - YYYY-MM-DD'")
    text = tree.changelog.read_text()
    headings = list(_CHANGELOG_HEADING.finditer(text))
    for i, m in enumerate(headings):
        if m.group("version") != version:
            continue
        if not (m.group("date") and _DATE.fullmatch(m.group("date"))):
            raise ReleaseError(f"CHANGELOG.md: the entry '{m.group(0).strip()}' has no release date: "
                               f"write '## [{version}] - YYYY-MM-DD'")
        end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
        body = text[m.end():end].strip()
        if not body:
            raise ReleaseError(f"CHANGELOG.md: the entry '## [{version}]' is empty: say what the release changes")
        return body
    found = ", ".join(m.group("version") for m in headings) or "none"
    raise ReleaseError(f"CHANGELOG.md: no entry '## [{version}] - YYYY-MM-DD' (entries: {found})")


def _agent_images(tree: Tree) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each example stack's ``nvidia-gpu:cluster.agentImage`` mapping."""
    for stack in tree.stacks():
        doc = yaml.safe_load(stack.read_text()) or {}
        image = ((doc.get("config") or {}).get("nvidia-gpu:cluster") or {}).get("agentImage")
        if isinstance(image, dict):
            yield stack, image


def check(tree: Tree, tag: str) -> str:
    """The version the tag releases, once the files that repeat it agree with nvgpu/version.py."""
    version = tree.version()
    if not _SEMVER.fullmatch(version):
        raise ReleaseError(f"{tree.rel(tree.version_file)}: VERSION {version!r} is not MAJOR.MINOR.PATCH")
    if tag != f"v{version}":
        raise ReleaseError(f"tag {tag!r} does not match VERSION {version!r} in {tree.rel(tree.version_file)}: "
                           f"tag the release v{version}, or change VERSION (tools/release.py set-version)")
    changelog_entry(tree, version)
    pack = yaml.safe_load(tree.policy_pack.read_text()).get("version")
    if str(pack) != version:
        raise ReleaseError(f"{tree.rel(tree.policy_pack)}: version is {pack!r}, the release is {version!r}")
    for stack, image in _agent_images(tree):
        if str(image.get("tag")) != version:
            raise ReleaseError(f"{tree.rel(stack)}: nvidia-gpu:cluster.agentImage.tag is {image.get('tag')!r}, "
                               f"the release is {version!r} (the components and the agent are released together)")
        digest = image.get("digest")
        if digest is not None and not _DIGEST.fullmatch(str(digest)):
            raise ReleaseError(f"{tree.rel(stack)}: nvidia-gpu:cluster.agentImage.digest {digest!r} is not "
                               "sha256:<64 hex digits>")
    return version


# -- rewriting the files that repeat the version ---------------------------------------------------------------


def _rewrite_agent_image(text: str, fields: dict[str, str | None], where: str) -> str:
    """``text`` (a stack file) with its ``agentImage:`` block's keys set (``None``: removed), comments kept."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if re.match(r"\s+agentImage:\s*(#.*)?$", ln)), None)
    if start is None:
        raise ReleaseError(f"{where}: no 'agentImage:' mapping under nvidia-gpu:cluster to pin")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    block = lines[start + 1:end]
    child = next((len(ln) - len(ln.lstrip()) for ln in block if ln.strip()), indent + 2)
    for key, value in fields.items():
        at = next((i for i, ln in enumerate(block) if re.match(rf"\s*{key}:", ln)), None)
        new = None if value is None else f"{' ' * child}{key}: {value}\n"
        if at is not None:
            if new is None:
                del block[at]
            else:
                block[at] = new
        elif new is not None:
            block.append(new)
    return "".join([*lines[:start + 1], *block, *lines[end:]])


def pin(tree: Tree, digest: str) -> list[Path]:
    """Every example stack's agent image pinned to the release: ``tag`` the version, ``digest`` the pushed
    image's; each keeps its repository (a mirror that copies blobs unchanged serves the same digest)."""
    if not _DIGEST.fullmatch(digest):
        raise ReleaseError(f"digest {digest!r} is not sha256:<64 hex digits>")
    version = tree.version()
    changed = []
    for stack, _ in list(_agent_images(tree)):
        text = stack.read_text()
        new = _rewrite_agent_image(text, {"tag": version, "digest": digest}, tree.rel(stack))
        if new != text:
            stack.write_text(new)
            changed.append(stack)
    return changed


def set_version(tree: Tree, version: str, today: str) -> None:
    """Start release ``version``: VERSION, the pack, the stacks' tag (their digest, the old image's, dropped)
    and CHANGELOG's Unreleased section renamed to the release's entry, a fresh Unreleased above it."""
    if not _SEMVER.fullmatch(version):
        raise ReleaseError(f"version {version!r} is not MAJOR.MINOR.PATCH")
    log = tree.changelog.read_text()
    if "## [Unreleased]" not in log:  # refused before any file is written
        raise ReleaseError("CHANGELOG.md: no '## [Unreleased]' section to turn into the release's entry")
    old = tree.version()
    text = tree.version_file.read_text()
    tree.version_file.write_text(text.replace(f'VERSION = "{old}"', f'VERSION = "{version}"'))
    pack = tree.policy_pack.read_text()
    tree.policy_pack.write_text(re.sub(r"(?m)^version:.*$", f"version: {version}", pack, count=1))
    for stack, _ in list(_agent_images(tree)):
        stack.write_text(_rewrite_agent_image(stack.read_text(), {"tag": version, "digest": None}, tree.rel(stack)))
    tree.changelog.write_text(log.replace("## [Unreleased]", f"## [Unreleased]\n\n## [{version}] - {today}", 1))


# -- build ---------------------------------------------------------------------------------------------------


def _run(argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
         what: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ReleaseError(f"{what} failed (exit {done.returncode}): {tail}")
    return done


def _git(tree: Tree, *args: str) -> str:
    return _run(["git", "-C", str(tree.root), *args], what=f"git {' '.join(args)}").stdout.strip()


def tagged_commit(tree: Tree, tag: str) -> tuple[str, int]:
    """The tag's commit and its committer time; refused unless the checkout is exactly that commit, clean."""
    found = subprocess.run(["git", "-C", str(tree.root), "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}"],
                           capture_output=True, text=True, check=False).stdout.strip()
    if not found:
        raise ReleaseError(f"tag {tag!r} is not in {tree.root}: a release builds a tagged commit (git tag {tag})")
    head = _git(tree, "rev-parse", "HEAD")
    if head != found:
        raise ReleaseError(f"HEAD is {head[:12]}, tag {tag} is {found[:12]}: check out the tag to release it")
    dirty = _git(tree, "status", "--porcelain", "--untracked-files=no")
    if dirty:
        raise ReleaseError(f"the working tree differs from tag {tag} ({dirty.splitlines()[0].strip()}, ...): "
                           "a release builds exactly the tagged commit")
    return found, int(_git(tree, "log", "-1", "--format=%ct", found))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Buildah:
    """buildah on the storage ``node_agent/image/build.sh`` uses (``BUILDAH_ROOT``, vfs)."""

    root: Path | None

    def args(self) -> list[str]:
        out = ["--storage-driver", "vfs"]
        if self.root is not None:
            out += ["--root", str(self.root / "root"), "--runroot", str(self.root / "run")]
        return out

    def __call__(self, *argv: str, what: str) -> str:
        return _run(["buildah", *self.args(), *argv], what=what).stdout.strip()


def _blob(digest: str) -> str:
    return f"blobs/sha256/{digest.removeprefix('sha256:')}"


def _json_member(tar: tarfile.TarFile, name: str) -> Any:
    member = tar.extractfile(name)
    if member is None:
        raise ReleaseError(f"the OCI archive has no {name}")
    return json.load(member)


def oci_archive_digest(archive: Path) -> str:
    """The manifest digest an OCI archive's ``index.json`` names: what a registry holds after a blob copy."""
    with tarfile.open(archive) as tar:
        manifests = _json_member(tar, "index.json")["manifests"]
    if len(manifests) != 1:
        raise ReleaseError(f"{archive.name}: {len(manifests)} manifests, one image expected")
    return str(manifests[0]["digest"])


#: Manifest annotations buildah adds that name the local base image by its digest in this machine's
#: storage: an import's time is in it, so they would make every build's digest differ (and they name an
#: image no registry holds). release.json records the base by its layer instead.
_LOCAL_ANNOTATIONS = ("org.opencontainers.image.base.digest", "org.opencontainers.image.base.name")


def normalize_oci_archive(src: Path, dst: Path, epoch: int) -> str:
    """``src`` rewritten to ``dst`` reproducibly: the manifest without buildah's local-base annotations, the
    tar's entries sorted, dated ``epoch`` and owned by root; the config and layer blobs unchanged. Returns the
    manifest digest."""
    with tarfile.open(src) as tar:
        index = _json_member(tar, "index.json")
        (entry,) = index["manifests"]
        old_name = _blob(entry["digest"])
        manifest = _json_member(tar, old_name)
        annotations = {k: v for k, v in manifest.get("annotations", {}).items() if k not in _LOCAL_ANNOTATIONS}
        manifest.pop("annotations", None)
        if annotations:
            manifest["annotations"] = annotations
        raw = json.dumps(manifest, separators=(",", ":")).encode()
        digest = f"sha256:{hashlib.sha256(raw).hexdigest()}"
        index["manifests"] = [{**entry, "digest": digest, "size": len(raw)}]
        generated = {"index.json": json.dumps(index, separators=(",", ":")).encode(), _blob(digest): raw}

        def info(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
            out = tarfile.TarInfo(name)
            out.size, out.mtime, out.uid, out.gid, out.uname, out.gname = size, epoch, 0, 0, "", ""
            out.type, out.mode = (tarfile.DIRTYPE, 0o755) if directory else (tarfile.REGTYPE, 0o644)
            return out

        blobs = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        blobs.pop(old_name, None)
        blobs.pop("index.json", None)
        names = sorted({*blobs, *generated})
        with tarfile.open(dst, "w", format=tarfile.USTAR_FORMAT) as out:
            for directory in ("blobs", "blobs/sha256"):
                out.addfile(info(directory, 0, directory=True))
            for name in names:
                if name in generated:
                    out.addfile(info(name, len(generated[name])), io.BytesIO(generated[name]))
                else:
                    member = blobs[name]
                    out.addfile(info(name, member.size), tar.extractfile(member))
    return digest


def build_image(tree: Tree, out: Path, buildah: Buildah, *, version: str, commit: str, epoch: int) -> dict[str, str]:
    """The agent image built reproducibly and written as an OCI archive; its digest and base."""
    local = f"localhost/{IMAGE_NAME}:{version}"
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), IMAGE_VERSION=version, IMAGE_REVISION=commit)
    if os.environ.get("GITHUB_REPOSITORY"):  # in the workflow: ghcr.io links the image to its repository
        env["IMAGE_SOURCE"] = f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{os.environ['GITHUB_REPOSITORY']}"
    if buildah.root is not None:
        env["BUILDAH_ROOT"] = str(buildah.root)
    done = _run(["bash", str(tree.root / "node_agent" / "image" / "build.sh"), local], env=env,
                what="node_agent/image/build.sh")
    base = next((ln.split()[-1] for ln in done.stderr.splitlines() if ln.startswith("image: building")), "")
    archive = out / f"{IMAGE_NAME}-{version}.oci.tar"
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        pushed = Path(tmp) / "image.oci.tar"
        buildah("push", "--quiet", local, f"oci-archive:{pushed}:{version}", what="buildah push to an OCI archive")
        digest = normalize_oci_archive(pushed, archive, epoch)
    with tarfile.open(archive) as tar:
        manifest = _json_member(tar, _blob(digest))
        config = _json_member(tar, _blob(manifest["config"]["digest"]))
    return {"local": local, "digest": digest, "archive": archive.name, "base": base,
            "baseLayer": config["rootfs"]["diff_ids"][0]}


@contextmanager
def _mounted(buildah: Buildah, image: str) -> Iterator[Path]:
    ctr = buildah("from", "--quiet", "--pull-never", image, what="buildah from")
    try:
        yield Path(buildah("mount", ctr, what="buildah mount"))
    finally:
        subprocess.run(["buildah", *buildah.args(), "rm", ctr], capture_output=True, check=False)


def _dpkg_packages(rootfs: Path) -> list[dict[str, Any]]:
    out = []
    for para in (rootfs / "var/lib/dpkg/status").read_text().split("\n\n"):
        fields = dict(re.findall(r"(?m)^([A-Za-z-]+): (.*)$", para))
        if "Package" not in fields or not fields.get("Status", "").endswith(" installed"):
            continue
        name, ver, arch = fields["Package"], fields["Version"], fields.get("Architecture", "all")
        out.append({"type": "library", "name": name, "version": ver,
                    "purl": f"pkg:deb/debian/{name}@{ver}?arch={arch}&distro=debian-12",
                    "bom-ref": f"pkg:deb/debian/{name}@{ver}?arch={arch}"})
    return out


def _python_packages(rootfs: Path) -> list[dict[str, Any]]:
    out = []
    for meta in sorted(rootfs.glob("opt/agent/lib/python3*/site-packages/*.dist-info/METADATA")):
        fields = dict(re.findall(r"(?m)^(Name|Version|License-Expression|License): (.*)$", meta.read_text()))
        name, ver = fields["Name"], fields["Version"]
        purl = f"pkg:pypi/{name.lower().replace('_', '-')}@{ver}"
        item: dict[str, Any] = {"type": "library", "name": name, "version": ver, "purl": purl, "bom-ref": purl}
        lic = fields.get("License-Expression")
        if lic:
            item["licenses"] = [{"expression": lic}]
        out.append(item)
    return out


def sbom(buildah: Buildah, image: str, version: str, digest: str, epoch: int) -> dict[str, Any]:
    """A CycloneDX 1.5 SBOM of the image from its own package databases; the same image gives the same bytes."""
    with _mounted(buildah, image) as rootfs:
        components = sorted(_dpkg_packages(rootfs) + _python_packages(rootfs), key=lambda c: str(c["bom-ref"]))
    return {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{IMAGE_NAME}@{digest}')}",
        "metadata": {
            "timestamp": datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "tools/release.py", "version": version}]},
            "component": {"type": "container", "name": IMAGE_NAME, "version": version,
                          "bom-ref": f"pkg:oci/{IMAGE_NAME}@{digest.replace(':', '%3A')}",
                          "purl": f"pkg:oci/{IMAGE_NAME}@{digest.replace(':', '%3A')}?tag={version}"},
        },
        "components": components,
    }


def build_python(tree: Tree, commit: str, epoch: int, out: Path) -> list[Path]:
    """The sdist and the wheel of the tagged commit, with a pinned setuptools in a throwaway virtualenv."""
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        archive = Path(tmp) / "src.tar"
        _git(tree, "archive", "--format=tar", "-o", str(archive), commit)
        with tarfile.open(archive) as tar:
            tar.extractall(src, filter="data")
        venv = Path(tmp) / "venv"
        _run([sys.executable, "-m", "venv", str(venv)], what="python -m venv")
        py = str(venv / "bin" / "python")
        _run([py, "-m", "pip", "install", "--quiet", SETUPTOOLS], what=f"pip install {SETUPTOOLS}")
        # The backend logs to stdout and rewrites sys.argv: the arguments are read first, the names come back
        # in a file.
        hooks = ("import json, sys\nfrom setuptools import build_meta as b\ndist, names = sys.argv[1:3]\n"
                 "built = [b.build_sdist(dist), b.build_wheel(dist)]\n"
                 "open(names, 'w').write(json.dumps(built))\n")
        dist, names_file = Path(tmp) / "dist", Path(tmp) / "names.json"
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
        _run([py, "-c", hooks, str(dist), str(names_file)], cwd=src, env=env, what="the sdist and wheel build")
        built = []
        for name in json.loads(names_file.read_text()):
            target = out / name
            shutil.copyfile(dist / name, target)
            built.append(target)
        return built


def build_schema(tree: Tree, version: str, out: Path) -> Path:
    """The component package's schema, served by this checkout's provider code, checked to carry the version."""
    code = "from nvidia_gpu.package import schema\nprint(schema())\n"
    text = _run([sys.executable, "-c", code], cwd=tree.root, env=dict(os.environ, PYTHONPATH=str(tree.root)),
                what="the component package's schema").stdout
    schema = json.loads(text)
    if schema.get("version") != version:
        raise ReleaseError(f"the component package's schema says version {schema.get('version')!r}, "
                           f"the release is {version!r}")
    path = out / f"nvidia-gpu-{version}.schema.json"
    path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return path


def build(tree: Tree, tag: str, out: Path, buildah: Buildah, *, image: bool = True) -> dict[str, Any]:
    """Everything the release publishes, in ``out``, with ``release.json`` describing it."""
    version = check(tree, tag)
    commit, epoch = tagged_commit(tree, tag)
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"version": version, "tag": tag, "commit": commit, "sourceDateEpoch": epoch}
    files = [*build_python(tree, commit, epoch, out), build_schema(tree, version, out)]
    if image:
        built = build_image(tree, out, buildah, version=version, commit=commit, epoch=epoch)
        doc = sbom(buildah, built["local"], version, built["digest"], epoch)
        sbom_path = out / f"{IMAGE_NAME}-{version}.sbom.cdx.json"
        sbom_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        files += [out / built["archive"], sbom_path]
        record["image"] = {k: built[k] for k in ("digest", "archive", "base", "baseLayer")}
    notes = out / "release-notes.md"
    notes.write_text(changelog_entry(tree, version) + "\n")
    record["files"] = {p.name: f"sha256:{_sha256(p)}" for p in sorted(files)}
    (out / "release.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def push(out: Path, repository: str) -> str:
    """The OCI archive copied to ``repository:<version>`` blob for blob; the registry's digest must be the
    archive's (``skopeo copy --preserve-digests`` refuses a copy that would change it). Returns ``repo@digest``."""
    record = json.loads((out / "release.json").read_text())
    image = record.get("image")
    if not image:
        raise ReleaseError(f"{out / 'release.json'}: no image was built (build without --no-image)")
    if shutil.which("skopeo") is None:
        raise ReleaseError("skopeo is not installed: the push copies the OCI archive unchanged "
                           "(apt-get install skopeo)")
    digestfile = out / "pushed.digest"
    _run(["skopeo", "copy", "--preserve-digests", "--digestfile", str(digestfile),
          f"oci-archive:{out / image['archive']}", f"docker://{repository}:{record['version']}"], what="skopeo copy")
    pushed = digestfile.read_text().strip()
    if pushed != image["digest"]:
        raise ReleaseError(f"the registry holds {pushed}, the built archive is {image['digest']}")
    record["image"]["repository"] = repository
    (out / "release.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return f"{repository}@{pushed}"


def notes(tree: Tree, tag: str, out: Path | None) -> str:
    """The GitHub release's text: the CHANGELOG entry, and once pushed (``out``'s release.json) the image by
    digest as a stack config takes it."""
    version = check(tree, tag)
    text = changelog_entry(tree, version)
    record = json.loads((out / "release.json").read_text()) if out is not None else {}
    image = record.get("image") or {}
    if "repository" in image:
        repository, digest = image["repository"], image["digest"]
        text += (f"\n\n### Install\n\nThe agent image: `{repository}:{version}@{digest}`. In a stack:"
                 f"\n\n```yaml\n    agentImage:\n      repository: {repository}\n      tag: \"{version}\""
                 f"\n      digest: {digest}\n```\n\nThe library: `pip install nvidia_gpu-{version}-py3-none-any.whl`"
                 f" (attached). The component package: `pulumi package add <this repository>/provider@{tag}`.")
    return text


# -- command line --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this script's)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("check", "notes", "build"):
        p = sub.add_parser(name)
        p.add_argument("--tag", required=True, help="v<version>, e.g. $GITHUB_REF_NAME")
        if name == "notes":
            p.add_argument("--out", type=Path, default=None, help="a pushed release's directory: add how to install it")
        if name == "build":
            p.add_argument("--out", type=Path, default=Path("dist"))
            p.add_argument("--buildah-root", type=Path, default=None, help="buildah storage (default: buildah's own)")
            p.add_argument("--no-image", action="store_true", help="the Python and component packages only")
    p = sub.add_parser("push")
    p.add_argument("--out", type=Path, default=Path("dist"))
    p.add_argument("--repository", required=True, help="e.g. ghcr.io/<owner>/nvidia-gpu-agent")
    p = sub.add_parser("pin")
    p.add_argument("--out", type=Path, default=Path("dist"), help="the pushed release's directory (release.json)")
    p = sub.add_parser("set-version")
    p.add_argument("version")
    args = parser.parse_args(argv)
    tree = Tree(args.root.resolve())
    try:
        if args.command == "check":
            print(f"release {args.tag}: version {check(tree, args.tag)}, CHANGELOG, policy pack and stacks agree")
        elif args.command == "notes":
            print(notes(tree, args.tag, args.out))
        elif args.command == "build":
            record = build(tree, args.tag, args.out.resolve(), Buildah(args.buildah_root), image=not args.no_image)
            print(json.dumps(record, indent=2, sort_keys=True))
        elif args.command == "push":
            print(push(args.out.resolve(), args.repository))
        elif args.command == "pin":
            record = json.loads((args.out / "release.json").read_text())
            image = record.get("image") or {}
            if "repository" not in image:
                raise ReleaseError(f"{args.out / 'release.json'}: the image was not pushed (tools/release.py push)")
            if record["version"] != tree.version():
                raise ReleaseError(f"{args.out / 'release.json'} is release {record['version']}, this checkout's "
                                   f"VERSION is {tree.version()}")
            for stack in pin(tree, image["digest"]):
                print(f"pinned {tree.rel(stack)}: tag {record['version']}, digest {image['digest']}")
        elif args.command == "set-version":
            set_version(tree, args.version, datetime.now(UTC).strftime("%Y-%m-%d"))
            print(f"version {args.version}: write its CHANGELOG entry, commit, then tag v{args.version}")
    except ReleaseError as e:
        print(f"release: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
