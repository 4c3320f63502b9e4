"""The publishable policy pack (``make policy-pack`` -> ``out/policy-pack``, tools/policypack.py).

It must be self-contained (nothing in it points outside it, its requirements are pinned third-party
packages plus the rules wheel it carries) and reproducible; installed from its own requirements alone
into a fresh venv by the real CLI (``pulumi install``, offline from the wheel cache ``make
policy-pack-cache`` fills), it must serve the same violations over gRPC as the repository's development
pack (``policies/``, the whole checkout installed) does today, and be what ``pulumi policy publish``
uploads (listed by the CLI's own archive code). The Pulumi Cloud is not reachable here, so publishing
is followed up to the CLI's refusal of a self-managed backend. Never constructs ``PolicyPack`` in this
process.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvgpu.version import VERSION
from nvidia_gpu.preview.policyrun.analyzer_client import (
    PACK_DIR,
    AnalyzerResource,
    Diagnostic,
    PackProcess,
    StackContext,
)
from tests.kit.tools import missing, required_bin
from tests.nvidia_gpu.policies.policy_fixtures import CM_TYPE, DS_TYPE, config_map, container, daemonset

REPO = Path(__file__).resolve().parents[3]
BUILDER = REPO / "tools" / "policypack.py"
WHEEL = f"nvidia_gpu_policies-{VERSION}-py3-none-any.whl"
#: What the rules import, as policies/requirements.txt pins it (the rest of the closure follows from these).
DIRECT = ("pulumi", "pulumi-policy", "pydantic", "pyyaml", "protobuf", "grpcio")
#: A fresh venv of the pack, measured at 94 MB (pip, setuptools and wheel upgraded by the CLI included);
#: the development pack's `-e ..` venv is 278 MB.
MAX_VENV_BYTES = 150 * 1024 * 1024


def _build(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BUILDER), "build", "--out", str(out)], capture_output=True,
                          text=True, check=False, timeout=120)


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    out = tmp_path / "pack"
    done = _build(out)
    assert done.returncode == 0, done.stderr
    return out


def _pins(text: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, re.MULTILINE)}


@pytest.mark.slow
def test_the_pack_holds_only_itself(pack: Path) -> None:
    files = sorted(p.relative_to(pack).as_posix() for p in pack.rglob("*") if not p.is_dir())
    assert files == [".gitignore", "PulumiPolicy.yaml", "__main__.py", "config.json", "requirements.txt",
                     f"wheels/{WHEEL}"]
    assert not [p for p in pack.rglob("*") if p.is_symlink()]  # the CLI's archive follows links
    for name in ("PulumiPolicy.yaml", "__main__.py", "config.json"):
        assert (pack / name).read_bytes() == (PACK_DIR / name).read_bytes(), name
    # `pulumi policy publish` leaves out what a .gitignore in the pack names: the venv an install creates.
    assert (pack / ".gitignore").read_text().splitlines() == ["venv/", "__pycache__/"]

    lines = [ln for ln in (pack / "requirements.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    *pinned, local = lines
    assert all(re.fullmatch(r"[a-z0-9-]+==[A-Za-z0-9.]+", ln) for ln in pinned), pinned
    assert local == f"./wheels/{WHEEL}"
    assert (pack / local).resolve().parent == (pack / "wheels").resolve()
    pins = _pins("\n".join(pinned))
    repo_pins = _pins((PACK_DIR / "requirements.txt").read_text())
    assert {name: pins[name] for name in DIRECT} == {name: repo_pins[name] for name in DIRECT}
    assert not {"pip", "setuptools", "wheel", "pulumi-kubernetes", "kubernetes-validate", "jsonschema"} & set(pins)


@pytest.mark.slow
def test_the_rules_wheel_carries_the_rules_and_the_core_from_this_checkout(pack: Path) -> None:
    with zipfile.ZipFile(pack / "wheels" / WHEEL) as zf:
        names = zf.namelist()
        contents = {n: zf.read(n) for n in names}
    dist_info = f"nvidia_gpu_policies-{VERSION}.dist-info"
    sources = {n for n in names if not n.startswith(dist_info + "/")}
    expected = {p.relative_to(REPO).as_posix() for d in ("nvgpu", "nvidia_gpu/policies")
                for p in (REPO / d).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert sources == expected
    assert "nvidia_gpu/__init__.py" not in names  # a namespace: never overwrites the library's top level
    for name in sources:
        assert contents[name] == (REPO / name).read_bytes(), name
    record = contents[f"{dist_info}/RECORD"].decode().splitlines()
    for row in record[:-1]:
        path, digest, size = row.rsplit(",", 2)
        data = contents[path]
        assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert int(size) == len(data)
    assert record[-1] == f"{dist_info}/RECORD,,"
    meta = contents[f"{dist_info}/METADATA"].decode().splitlines()
    assert f"Version: {VERSION}" in meta and "Name: nvidia-gpu-policies" in meta
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    requires = [ln.removeprefix("Requires-Dist: ") for ln in meta if ln.startswith("Requires-Dist: ")]
    assert requires == [d for d in declared if re.split(r"[<>=]", d)[0].lower() in DIRECT]


@pytest.mark.slow
def test_the_pack_build_is_reproducible(tmp_path: Path, pack: Path) -> None:
    again = tmp_path / "again"
    assert _build(again).returncode == 0
    for name in ("requirements.txt", f"wheels/{WHEEL}"):
        assert (again / name).read_bytes() == (pack / name).read_bytes(), name
    assert _build(pack).returncode == 0  # a previous pack is replaced


@pytest.mark.slow
def test_the_build_never_replaces_a_directory_that_is_not_a_pack(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    done = _build(tmp_path)
    assert done.returncode == 1
    assert done.stderr == (f"policy-pack: {tmp_path}: a non-empty directory that is not a policy pack; "
                           "choose another --out\n")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    inside = _build(PACK_DIR / "dist")
    assert inside.returncode == 1 and "inside" in inside.stderr and not (PACK_DIR / "dist").exists()


# --- installed from its own requirements by the real CLI, served over gRPC, published as far as it goes ----

EXPORTER = daemonset("exporter", role="exporter",
                     containers=[container("exporter", securityContext={"privileged": True})])
MPS = config_map({"MPS": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["envvar"]}},
                          "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 100}]}}}},
                 name="dp")
#: An invalid stack: a driver below the model's minimum, a privileged exporter, MPS replicas over the
#: maximum with the envvar device list.
RESOURCES = [
    AnalyzerResource(DS_TYPE, "urn:pulumi:dev::nvidia-gpu::kubernetes:apps/v1:DaemonSet::exporter", "exporter",
                     EXPORTER),
    AnalyzerResource(CM_TYPE, "urn:pulumi:dev::nvidia-gpu::kubernetes:core/v1:ConfigMap::dp", "dp", MPS),
]
STACK = StackContext("nvidia-gpu", "dev", {"nvidia-gpu:nodeGroups": [
    {"name": "h200", "nodeGroup": "gpu-h200", "gpu": {"model": "H200-141GB", "driverVersion": "535.104.05"}}]})
POLICY_CONFIG = json.loads((PACK_DIR / "config.json").read_text())


def _serve(pack_dir: Path) -> tuple[tuple[object, ...], list[Diagnostic]]:
    with PackProcess(pack_dir, stack=STACK) as served:
        served.configure(POLICY_CONFIG)
        diags = [d for r in RESOURCES for d in served.analyze(r)] + served.analyze_stack(RESOURCES)
        assert served.info is not None
        return (served.info.name, served.info.version, served.info.policies), diags


CLOUD_ONLY = "error: this command requires the Pulumi Cloud backend; run `pulumi login`"


@dataclass(frozen=True)
class Published:
    """``make policy-publish`` run against a self-managed backend, its staging directory kept."""

    stage: Path
    env: dict[str, str]
    done: subprocess.CompletedProcess[str]


def _cli_env(home: Path, bin_dir: Path, wheels: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PULUMI_", "PIP_")) and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    home.mkdir()
    (home / "state").mkdir()
    # The venv the CLI creates must not come from this test's venv: its python3 is the system's.
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix)]
    env.update(HOME=str(home), PULUMI_HOME=str(home / ".pulumi"), PULUMI_SKIP_UPDATE_CHECK="true",
               PULUMI_BACKEND_URL=(home / "state").as_uri(), PATH=os.pathsep.join([str(bin_dir), *path]),
               PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1", GOPROXY="off",
               XDG_CACHE_HOME=str(wheels.parent.parent))
    if shutil.which("go"):  # the archiver builds offline from the account's Go caches, whatever HOME says
        for var in ("GOCACHE", "GOMODCACHE", "GOPATH"):
            value = subprocess.run(["go", "env", var], capture_output=True, text=True, check=True).stdout.strip()
            if value:
                env[var] = value
    return env


def _wheel_cache(requirements: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nvidia-gpu" / "wheels"
    have = {p.name.split("-")[0].lower().replace("_", "-") + "==" + p.name.split("-")[1]
            for p in cache.glob("*.whl")} if cache.is_dir() else set()
    absent = sorted(f"{n}=={v}" for n, v in _pins(requirements).items() if f"{n}=={v}" not in have)
    if absent:
        missing(f"{cache} lacks {', '.join(absent)}: run `make policy-pack-cache` (downloads them once)")
    return cache


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    """The pack assembled, installed by ``pulumi install`` from its own requirements (offline, from the wheel
    cache) and handed to ``pulumi policy publish``: once for the module, an install takes a minute."""
    bin_dir = required_bin("pulumi", "pulumi-language-python")
    root = tmp_path_factory.mktemp("publish")
    wheels = _wheel_cache((PACK_DIR / "requirements.txt").read_text())
    env = _cli_env(root / "home", bin_dir, wheels)
    stage = root / "stage"
    done = subprocess.run([sys.executable, str(BUILDER), "publish", "my-org", "--stage", str(stage)], env=env,
                          capture_output=True, text=True, check=False, timeout=540, stdin=subprocess.DEVNULL)
    assert (stage / "venv" / "bin" / "python").exists(), done.stdout[-4000:] + done.stderr[-4000:]
    return Published(stage, env, done)


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_publish_installs_the_pack_and_stops_only_at_the_cloud_login(published: Published) -> None:
    """A self-managed backend holds no policy packs (nor policy groups): the CLI refuses, in one line, after
    the install. There the pack is used as a directory, ``--policy-pack <dir>`` on every preview and update."""
    assert published.done.returncode == 1
    assert published.done.stderr.splitlines()[-2:] == [
        CLOUD_ONLY, f"policy-pack: `pulumi policy publish my-org` in {published.stage} exited 1"]
    assert "Finished installing dependencies" in published.done.stdout


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_the_installed_pack_holds_the_rules_and_their_runtime_only(published: Published) -> None:
    python = published.stage / "venv" / "bin" / "python"

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-c", code], cwd=published.stage, env=published.env, capture_output=True,
                              text=True, check=False, timeout=60)

    where = run("import nvgpu, nvidia_gpu.policies as p; print(nvgpu.__file__); print(p.__file__)")
    assert where.returncode == 0, where.stderr
    assert all(Path(ln).is_relative_to(published.stage / "venv") for ln in where.stdout.splitlines()), where.stdout
    for absent in ("nvidia_gpu.components", "nvidia_gpu.preview", "pulumi_kubernetes", "kubernetes_validate"):
        assert "ModuleNotFoundError" in run(f"import {absent}").stderr, absent
    # The pins agree with every package's own requirements (pulumi-policy: protobuf~=5.29.5, grpcio~=1.71).
    check = subprocess.run([str(python), "-m", "pip", "check"], env=published.env, capture_output=True, text=True,
                           check=False, timeout=60)
    assert (check.returncode, check.stdout) == (0, "No broken requirements found.\n")
    size = sum(p.lstat().st_size for p in (published.stage / "venv").rglob("*") if p.is_file() and not p.is_symlink())
    print(f"policy pack venv: {size / 1e6:.0f} MB")
    assert size < MAX_VENV_BYTES


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_the_installed_pack_reports_what_the_development_pack_does(
    published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pack process gets only what the CLI passes it: no PYTHONPATH back into this checkout.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert PackProcess(published.stage).python == str(published.stage / "venv" / "bin" / "python")
    installed_info, installed = _serve(published.stage)
    repo_info, today = _serve(PACK_DIR)
    assert installed_info == repo_info
    assert installed == today
    assert {d.policy_name for d in today} >= {"driver-meets-gpu-minimum", "host-access-allow-listed",
                                               "sharing-parameters-valid", "gpus-only-as-allocated"}


def _uploads(pack_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(BUILDER), "uploads", str(pack_dir)], env=env, capture_output=True,
                          text=True, check=False, timeout=300)
    if done.returncode == 3:
        missing(done.stderr.strip())
    return done


def _uploaded(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return sorted(line.split("\t")[0] for line in done.stdout.splitlines())


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_publish_uploads_the_pack_without_its_venv(published: Published) -> None:
    """Listed by the CLI's own archive code (the pinned CLI's ``archive.TGZ``, what publish uploads)."""
    files = [p.relative_to(published.stage).as_posix() for p in published.stage.rglob("*")
             if p.is_file() and not p.is_relative_to(published.stage / "venv") and "__pycache__" not in p.parts]
    assert (published.stage / "venv").is_dir()
    assert _uploaded(_uploads(published.stage, published.env)) == sorted(f"package/{f}" for f in files)


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_the_pack_under_the_checkouts_out_dir_would_upload_nothing(published: Published, tmp_path: Path) -> None:
    """Why ``make policy-publish`` stages the pack outside the checkout: the CLI also honours the .gitignore
    files above the pack, and this repository's ignores ``out/``."""
    checkout = tmp_path / "checkout"
    shutil.copytree(published.stage, checkout / "out" / "policy-pack", ignore=shutil.ignore_patterns("venv"))
    shutil.copyfile(REPO / ".gitignore", checkout / ".gitignore")
    nothing = _uploads(checkout / "out" / "policy-pack", published.env)
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (1, "", (
        f"policy-pack: {checkout / 'out' / 'policy-pack'}: `pulumi policy publish` would upload nothing here "
        "(a .gitignore in it or above it ignores every file)\n"))
    done = subprocess.run([sys.executable, str(BUILDER), "publish", "--stage", str(REPO / "out" / "policy-stage")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert (done.returncode, done.stderr.splitlines()) == (1, [
        f"policy-pack: {REPO / 'out' / 'policy-stage'}: inside this checkout, and `pulumi policy publish` leaves "
        "out every file a .gitignore up the tree ignores (this one ignores out/): stage it outside"])
