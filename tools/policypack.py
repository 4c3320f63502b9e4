"""Assemble the policy pack a platform team publishes: ``make policy-pack`` -> ``out/policy-pack/``.

The repository's ``policies/`` is the development pack: its requirements install this checkout (``-e ..``),
so a rule edited here is what ``pulumi preview --policy-pack policies`` runs, at the price of the whole
project's dependencies (a 278 MB virtualenv) and a directory that only works inside a clone. The assembled
pack is self-contained instead, which is what ``pulumi policy publish`` needs (it uploads the pack
directory; the Pulumi Cloud, or a CI job with ``--policy-pack <dir>``, then installs it from its own
``requirements.txt`` in a fresh virtualenv)::

    out/policy-pack/
      PulumiPolicy.yaml  __main__.py  config.json     the same files as policies/ (one source: copied)
      requirements.txt                                the rules' runtime, pinned as this repository tests
                                                      it, then ./wheels/<the rules wheel>; nothing else
      wheels/nvidia_gpu_policies-<version>-py3-none-any.whl
      .gitignore                                      venv/: what `pulumi policy publish` leaves out

The rules wheel (distribution ``nvidia-gpu-policies``) holds this checkout's ``nvgpu`` (the stack config
schema and the GPU catalogue the rules check against) and ``nvidia_gpu.policies``, nothing of the
components or the preview, and declares the library's own compatible ranges (pyproject.toml) for what
they import. It is written here rather than by a build backend so that ``make policy-pack`` runs offline
from the project's venv (whose setuptools predates the PEP 639 metadata) and is byte-for-byte
reproducible: the same sources give the same wheel, whoever builds it. ``nvidia_gpu`` has no
``__init__`` in it (a namespace package), so the wheel never overwrites the library's top level; it is
meant for the pack's own venv, where the library is not (installed beside the library, the two would share
the files of ``nvgpu`` and ``nvidia_gpu.policies``).

Commands (the Makefile's ``policy-pack``, ``policy-pack-cache`` and ``policy-publish``):

* ``build [--out DIR]``: assemble the pack (offline, from this checkout and its venv).
* ``cache``: once, with network: the pinned third-party wheels for this machine into
  ``$XDG_CACHE_HOME/nvidia-gpu/wheels`` (so the tests install the pack offline, ``PIP_NO_INDEX=1
  PIP_FIND_LINKS=<cache>``, as a policy group's runner installs it online), and the archiver below.
* ``uploads DIR``: what ``pulumi policy publish`` would upload from DIR, listed by the CLI's own archive
  code (tools/policypack_archive.go, built against the modules tools/pulumi pins). The CLI leaves out
  whatever any ``.gitignore`` from the pack up to ``/`` ignores: this checkout's ignores ``out/``, so
  ``out/policy-pack`` itself would upload nothing, and ``publish`` stages the pack outside the checkout.
* ``publish [ORG] [--stage DIR]``: assemble in a temporary directory (or DIR, kept), ``pulumi install``
  its venv, ``pulumi policy publish [ORG]`` (a Pulumi Cloud login; a self-managed backend refuses it).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ModuleNotFoundError:  # not the project's venv
    sys.exit(f"policy-pack: {sys.executable} lacks the packaging module: run me with .venv/bin/python (make venv)")

REPO = Path(__file__).resolve().parents[1]
#: The development pack, whose manifest, entry point and default config the assembled pack copies.
PACK_SOURCE = REPO / "policies"
PACK_FILES = ("PulumiPolicy.yaml", "__main__.py", "config.json")
DEFAULT_OUT = REPO / "out" / "policy-pack"
DIST_NAME = "nvidia-gpu-policies"
SUMMARY = "CrossGuard rules of nvidia-gpu (nvidia_gpu.policies) and the shared core they check against (nvgpu)"
#: Source trees the wheel carries, relative to the repository root.
PACKAGES = ("nvgpu", "nvidia_gpu/policies")
#: What those packages import: the library's own declared dependencies (pyproject.toml) filtered to these.
RUNTIME = ("pulumi-policy", "pulumi", "pydantic", "pyyaml", "protobuf", "grpcio")
#: The venv's installers: never pinned (``pip freeze`` leaves them out too); a fresh venv brings its own.
INSTALLERS = ("pip", "setuptools", "wheel")
#: The CLI's own archive code as a small program (see :func:`build_archiver`).
ARCHIVER_SOURCE = REPO / "tools" / "policypack_archive.go"
#: Fixed zip timestamp (the earliest a zip can hold): the wheel's bytes depend on the sources only.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


class PackBuildError(Exception):
    """A one-line reason the pack cannot be assembled."""


@dataclass(frozen=True)
class Assembled:
    out: Path
    wheel: Path
    pins: dict[str, str]


def project_version() -> str:
    """The one version (nvgpu/version.py), read without importing: this runs before any install."""
    text = (REPO / "nvgpu" / "version.py").read_text()
    m = re.search(r'^VERSION\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if m is None:
        raise PackBuildError(f"{REPO / 'nvgpu' / 'version.py'}: no VERSION = \"...\" line")
    return m.group(1)


def declared_ranges() -> list[str]:
    """The library's Requires-Dist entries for what the rules import (pyproject.toml is the one source)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {canonicalize_name(n) for n in RUNTIME}
    picked = [d for d in deps if canonicalize_name(Requirement(d).name) in wanted]
    missing = wanted - {canonicalize_name(Requirement(d).name) for d in picked}
    if missing:
        raise PackBuildError(f"pyproject.toml [project].dependencies: no entry for {', '.join(sorted(missing))}")
    return picked


def pack_pins() -> dict[str, str]:
    """Exact pins: ``policies/requirements.txt`` for the direct dependencies, and for the rest of their
    closure the versions installed beside them in the venv that runs the tests (so the published pack
    resolves to exactly what CI ran)."""
    direct: dict[str, str] = {}
    for line in (PACK_SOURCE / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            direct[canonicalize_name(m.group(1))] = m.group(2)
    pins: dict[str, str] = {}
    todo = [canonicalize_name(n) for n in RUNTIME]
    while todo:
        name = todo.pop()
        if name in pins or name in INSTALLERS:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise PackBuildError(f"{name} is not installed in {sys.prefix}: run `make venv`") from None
        if name in direct and direct[name] != dist.version:
            raise PackBuildError(f"{name}: policies/requirements.txt pins {direct[name]}, {sys.prefix} has "
                                 f"{dist.version}: run `make venv`")
        pins[name] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    missing = sorted(set(direct) - set(pins))
    if missing:
        raise PackBuildError(f"policies/requirements.txt pins {', '.join(missing)}, which the rules never need")
    return dict(sorted(pins.items()))


def _source_files() -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for package in PACKAGES:
        root = REPO / package
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append((path.relative_to(REPO).as_posix(), path))
    return files


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(dest: Path, version: str) -> Path:
    """The rules wheel (PEP 427, metadata 2.4), reproducible: sorted entries, fixed times and modes."""
    stem = f"{DIST_NAME.replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    metadata = "".join([
        "Metadata-Version: 2.4\n",
        f"Name: {DIST_NAME}\n",
        f"Version: {version}\n",
        f"Summary: {SUMMARY}\n",
        "License-Expression: Apache-2.0\n",
        "Requires-Python: >=3.11\n",
        *(f"Requires-Dist: {spec}\n" for spec in declared_ranges()),
    ])
    wheel_meta = ("Wheel-Version: 1.0\nGenerator: nvidia-gpu tools/policypack.py\nRoot-Is-Purelib: true\n"
                  "Tag: py3-none-any\n")
    entries = [(name, path.read_bytes()) for name, path in _source_files()]
    entries += [(f"{dist_info}/METADATA", metadata.encode()), (f"{dist_info}/WHEEL", wheel_meta.encode())]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    wheel = dest / f"{stem}-py3-none-any.whl"
    wheel.write_bytes(buffer.getvalue())
    return wheel


def _requirements(version: str, pins: dict[str, str], wheel: Path) -> str:
    lines = [
        f"# nvidia-gpu policy pack {version}: the rules (the wheel below: nvgpu + nvidia_gpu.policies) and their",
        "# runtime, pinned as the repository tests them. Written by `make policy-pack` (tools/policypack.py) from",
        "# policies/requirements.txt and the project's venv: edit those, not this file. Install from this directory:",
        "#   python3 -m venv venv && venv/bin/pip install -r requirements.txt   (or `pulumi install`)",
        *(f"{name}=={ver}" for name, ver in pins.items()),
        f"./wheels/{wheel.name}",
    ]
    return "\n".join(lines) + "\n"


def _clear(out: Path) -> None:
    """Replace a previous pack, never anything else: refuse a non-empty directory that is not one."""
    if not out.exists():
        return
    if not out.is_dir() or out.is_symlink():
        raise PackBuildError(f"{out}: exists and is not a directory; choose another --out")
    if any(out.iterdir()) and not (out / "PulumiPolicy.yaml").is_file():
        raise PackBuildError(f"{out}: a non-empty directory that is not a policy pack; choose another --out")
    shutil.rmtree(out)


def assemble(out: Path) -> Assembled:
    out = out.absolute()
    if out == PACK_SOURCE or PACK_SOURCE in out.parents:
        raise PackBuildError(f"{out}: inside {PACK_SOURCE}; choose a directory outside the development pack")
    version = project_version()
    pins = pack_pins()
    _clear(out)
    (out / "wheels").mkdir(parents=True)
    for name in PACK_FILES:
        shutil.copyfile(PACK_SOURCE / name, out / name)
    wheel = build_wheel(out / "wheels", version)
    (out / "requirements.txt").write_text(_requirements(version, pins, wheel))
    # `pulumi policy publish` tars the directory minus what .gitignore files say; the venv stays behind.
    (out / ".gitignore").write_text("venv/\n__pycache__/\n")
    return Assembled(out, wheel, pins)


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nvidia-gpu"


def wheel_cache() -> Path:
    return cache_root() / "wheels"


def download_wheels(dest: Path) -> None:
    """The pinned third-party wheels for this machine (network), for offline installs of the pack."""
    pins = pack_pins()
    dest.mkdir(parents=True, exist_ok=True)
    have = {(canonicalize_name(p.name.split("-")[0]), p.name.split("-")[1]) for p in dest.glob("*.whl")}
    # The CLI's install (`pulumi install`, a policy group's runner) first runs `pip install --upgrade pip
    # setuptools wheel` in the fresh venv: offline, those come from here too (the current ones).
    specs = [*(f"{name}=={ver}" for name, ver in pins.items() if (name, ver) not in have),
             *(name for name in INSTALLERS if name not in {n for n, _ in have})]
    if not specs:
        return  # all there: a warm `make test` needs no network
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                    "--only-binary=:all:", "-d", str(dest), *specs], check=True)


class ArchiverMissing(PackBuildError):
    """The archiver cannot be built here (no Go, or its modules are not in the module cache)."""


def _go_version() -> str:
    if shutil.which("go") is None:
        raise ArchiverMissing("Go is not on PATH: install it (make deps says which release)")
    return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def build_archiver() -> Path:
    """The CLI's archive code as a program (tools/policypack_archive.go against tools/pulumi's pinned
    modules), built once per source, module list and Go release into the cache; offline when the Go module
    cache holds the modules (``make tools`` fetched them), else Go fetches them as ``GOPROXY`` allows."""
    module = REPO / "tools" / "pulumi"
    inputs = [ARCHIVER_SOURCE.read_bytes(), (module / "go.mod").read_bytes(), (module / "go.sum").read_bytes(),
              _go_version().encode()]
    digest = hashlib.sha256(b"\0".join(inputs)).hexdigest()[:16]
    target = cache_root() / "policy-archive" / f"policy-archive-{digest}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="policy-archive-") as tmp:
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(module / name, Path(tmp) / name)
        shutil.copyfile(ARCHIVER_SOURCE, Path(tmp) / "main.go")
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        done = subprocess.run(["go", "build", "-trimpath", "-o", str(partial), "."], cwd=tmp, env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            last = next((ln.strip() for ln in reversed(done.stderr.splitlines()) if ln.strip()), "no output")
            raise ArchiverMissing(f"building the CLI's archiver failed ({last}): run `make policy-pack-cache`")
        os.replace(partial, target)
    return target


def uploads(pack_dir: Path) -> list[tuple[str, int]]:
    """What ``pulumi policy publish`` run in ``pack_dir`` would upload: (name in the tarball, size)."""
    done = subprocess.run([str(build_archiver()), str(pack_dir.absolute())], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise PackBuildError(f"{pack_dir}: {done.stderr.strip()}")
    return [(name, int(size)) for name, size in (ln.rsplit("\t", 1) for ln in done.stdout.splitlines())]


def publish(org: str | None, stage: Path | None) -> int:
    """Assemble the pack in ``stage`` (default: a fresh temporary directory, removed afterwards), install
    its venv as the CLI does and run ``pulumi policy publish [org]`` there; the CLI's exit status."""
    if stage is not None and (stage.absolute() == REPO or REPO in stage.absolute().parents):
        raise PackBuildError(f"{stage.absolute()}: inside this checkout, and `pulumi policy publish` leaves out "
                             "every file a .gitignore up the tree ignores (this one ignores out/): stage it outside")
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise PackBuildError("pulumi is not on PATH: install the Pulumi CLI (https://www.pulumi.com/docs/install/)")
    keep = stage is not None
    where = (stage or Path(tempfile.mkdtemp(prefix="nvidia-gpu-policy-pack-"))).absolute()
    try:
        assemble(where)
        for step in (["install"], ["policy", "publish", *([org] if org else [])]):
            done = subprocess.run([pulumi, *step], cwd=where, check=False)
            if done.returncode != 0:
                print(f"policy-pack: `pulumi {' '.join(step)}` in {where} exited {done.returncode}", file=sys.stderr)
                return done.returncode
        return 0
    finally:
        if not keep:
            shutil.rmtree(where, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/policypack.py", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="assemble the self-contained pack directory")
    build.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the pack directory (default: out/policy-pack)")
    sub.add_parser("cache", help="download the pinned wheels and build the CLI's archiver (network, once)")
    listing = sub.add_parser("uploads", help="list what `pulumi policy publish` would upload from DIR")
    listing.add_argument("dir", type=Path)
    pub = sub.add_parser("publish", help="assemble, install and `pulumi policy publish` (Pulumi Cloud login)")
    pub.add_argument("org", nargs="?", default=None, help="the organization (default: your default one)")
    pub.add_argument("--stage", type=Path, default=None,
                     help="assemble here and keep it (outside this checkout; default: a temporary directory)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            done = assemble(args.out)
            print(f"{done.out}: {len(done.pins)} pinned packages + {done.wheel.relative_to(done.out)}")
        elif args.command == "cache":
            download_wheels(wheel_cache())
            print(wheel_cache())
            print(build_archiver())
        elif args.command == "uploads":
            listed = uploads(args.dir)
            if not listed:
                raise PackBuildError(f"{args.dir.absolute()}: `pulumi policy publish` would upload nothing here "
                                     "(a .gitignore in it or above it ignores every file)")
            for name, size in listed:
                print(f"{name}\t{size}")
        else:
            return publish(args.org, args.stage)
    except ArchiverMissing as e:
        print(f"policy-pack: {e}", file=sys.stderr)
        return 3
    except PackBuildError as e:
        print(f"policy-pack: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"policy-pack: {' '.join(map(str, e.cmd[:4]))} ... exited {e.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
