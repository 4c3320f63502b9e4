"""The component package's generated SDKs: a TypeScript and a Go program deploy the platform and two node groups to
the local control plane with the real CLI and engine, and destroy them; tsc refuses a program that misuses the
typed settings.

The SDKs are what ``pulumi package gen-sdk <repository>/provider`` generates from the schema the package serves
(its settings objects typed from the stack config's models, ``nvidia_gpu.sdk.schematypes``). The programs are
``tests/cluster/programs/{typescript,go}``.

Pulumi's Node.js and Go language hosts (``pulumi-language-nodejs``, ``pulumi-language-go``) are Go modules
that the module proxy this project builds its tools from refuses (403), as it does Pulumi's Python host.
``make tools`` builds their SDK generation (``tools/pulumi/pulumi-language-sdkgen``: the CLI's own
``codegen/nodejs`` and ``codegen/go``), which ``gen-sdk`` asks them for, but not their program runner. So the
programs run as Automation API inline programs: each program process serves the language runtime itself and
drives the pinned CLI (``pulumi up --client``), which runs the real engine, starts the component package from
``packages:`` in the project's ``Pulumi.yaml`` through the Python language host, and the pinned Kubernetes
provider. The resources, the SDK's code and the engine's work are what a ``runtime: nodejs`` or ``runtime: go``
program would do; only who starts the program differs.

Dependencies are fetched once into a cache outside the clone (beside the tools cache), so later runs are
offline: the TypeScript program's ``node_modules`` (``@pulumi/pulumi``, ``@pulumi/kubernetes``,
``typescript``; npm and Node.js 22 from ``tools/nodejs``) under ``<cache>/nvidia-gpu/npm/<key>``, the Go
program's modules in Go's module cache (``go env GOMODCACHE``) from the pinned ``go.sum``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane
from localcluster.objects import create_kwok_node, wait_for
from nvidia_gpu.components.register import PROVIDER_VERSION
from tests.cluster.pulumi_project import REPO, SETUP, Project, make_project
from tests.kit.tools import missing, required_bin

PROGRAMS = Path(__file__).resolve().parent / "programs"
POOL = "example.com/gpu-pool"
#: The Go SDK's import path (codegen/go's default: the schema names no repository); programs/go/go.mod replaces it.
GO_IMPORT_PATH = "example.com/pulumi-nvidia-gpu/sdk/go/nvidia-gpu"
#: Seconds for a program's up or destroy: the two groups' DaemonSets roll out under the provider's await.
DEPLOY_TIMEOUT_S = 600


def _cache_root() -> Path:
    """Beside the tools cache (``tools/build.sh``): ``$NVIDIA_GPU_TOOLS_CACHE/..`` or ``~/.cache/nvidia-gpu``."""
    tools = os.environ.get("NVIDIA_GPU_TOOLS_CACHE")
    if tools:
        return Path(tools).parent
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nvidia-gpu"


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = DEPLOY_TIMEOUT_S,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert done.returncode == 0, (f"{' '.join(cmd)}: rc {done.returncode}\n{done.stdout[-8000:]}\n"
                                      f"{done.stderr[-4000:]}")
    return done


@dataclass
class Sdks:
    """The generated SDKs and the CLI environment they were generated in."""

    nodejs: Path
    go: Path
    project: Project
    generate_s: float


@pytest.fixture(scope="module")
def sdks(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Sdks:
    """``pulumi package gen-sdk`` of the package, as a user's ``pulumi package add`` runs it: the engine starts
    the package through the Python language host and reads the schema it serves."""
    work = tmp_path_factory.mktemp("sdks")
    bin_dir = required_bin("pulumi-language-python", "pulumi-language-nodejs", "pulumi-language-go",
                           "pulumi-resource-kubernetes")
    project = make_project(cluster, work)
    # As in test_component_package: gen-sdk installs the package's own plugins; offline, from the pinned build.
    project.pulumi("plugin", "install", "resource", "kubernetes", PROVIDER_VERSION, "--file",
                   str((bin_dir / "pulumi-resource-kubernetes").resolve()))
    project.env.pop("PYTHONPATH", None)  # the package runs in the repository's venv, as PulumiPlugin.yaml says
    start = time.monotonic()
    out = work / "sdk"
    for language in ("nodejs", "go"):
        project.pulumi("package", "gen-sdk", str(REPO / "provider"), "--language", language, "--out", str(out))
    return Sdks(out / "nodejs", out / "go", project, time.monotonic() - start)


def _program_env(project: Project, bin_dir: Path) -> dict[str, str]:
    env = dict(project.env)
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def _write_project(directory: Path, name: str) -> None:
    """The project's ``Pulumi.yaml``: the package by path, as ``pulumi package add`` writes it (the runtime is
    the Automation API's: the program serves it)."""
    runtime = "nodejs" if name.endswith("ts") else "go"
    meta = {"name": name, "runtime": runtime, "packages": {"nvidia-gpu": str(REPO / "provider")}}
    (directory / "Pulumi.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


def _outputs(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    line = next(line for line in reversed(done.stdout.splitlines()) if line.startswith("OUTPUTS "))
    outputs: dict[str, Any] = json.loads(line.removeprefix("OUTPUTS "))
    return outputs


def _check_deployed(cluster: ControlPlane, outputs: dict[str, Any], namespace: str, team: str) -> None:
    kube = cluster.admin()
    assert outputs["namespace"] == namespace
    labels = {ls["gpu.nvidia-gpu.io/node-group"]: ls for ls in outputs["nodeLabels"]}
    assert labels["l4-shared"]["node.deckhouse.io/device-gpu.config"] == "TimeSlicing"
    assert labels["a100"]["node.deckhouse.io/device-gpu.config"] == "Exclusive"
    daemonsets = {d["metadata"]["name"]: d for d in kube.list("apps/v1", "DaemonSet", namespace)}
    assert len(daemonsets) == 6, sorted(daemonsets)  # per group: node setup, the labeller, the device plugin
    for name, ds in daemonsets.items():
        assert ds["metadata"]["labels"]["team"] == team, name
        assert ds["status"].get("numberReady", 0) >= 1, (name, ds["status"])  # the provider awaited the rollout


def _check_destroyed(cluster: ControlPlane, namespace: str) -> None:
    kube = cluster.admin()
    wait_for(lambda: kube.get_or_none("v1", "Namespace", namespace) is None, timeout=60, what="the namespace gone")
    assert kube.list("apps/v1", "DaemonSet", namespace) == []


# --- TypeScript -------------------------------------------------------------------------------------------


def _node_modules(bin_dir: Path) -> Path:
    """The TypeScript program's ``node_modules``, installed once per ``package.json`` into the cache (npm's own
    cache beside it), then reused offline."""
    manifest = (PROGRAMS / "typescript" / "package.json").read_bytes()
    # Keyed by the manifest and the Node.js build (its tools component): a change of either installs afresh.
    key = hashlib.sha256(manifest + (bin_dir / "node").resolve().parent.name.encode()).hexdigest()[:16]
    root = _cache_root() / "npm"
    target = root / f"typescript-{key}"
    if (target / ".complete").is_file():
        return target / "node_modules"
    tmp = root / f".tmp-typescript-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "package.json").write_bytes(manifest)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "npm_config_cache": str(root / "cache"),
           "npm_config_update_notifier": "false", "npm_config_fund": "false", "npm_config_audit": "false"}
    _run(["npm", "install", "--no-package-lock", "--prefer-offline"], tmp, env, timeout=900)
    (tmp / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target / "node_modules"


@pytest.fixture(scope="module")
def ts_program(sdks: Sdks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The TypeScript program with the generated SDK in ``./sdk``, its dependencies from the cache."""
    bin_dir = required_bin("node", "npm")
    directory = tmp_path_factory.mktemp("typescript")
    for name in ("index.ts", "bad.ts", "tsconfig.json", "package.json"):
        shutil.copy(PROGRAMS / "typescript" / name, directory / name)
    shutil.copytree(sdks.nodejs, directory / "sdk")
    (directory / "node_modules").symlink_to(_node_modules(bin_dir))
    _write_project(directory, "gpu-ts")
    yield directory, _program_env(sdks.project, bin_dir)


def _tsc(directory: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return _run(["node", str(directory / "node_modules" / "typescript" / "bin" / "tsc"), *args], directory, env,
                timeout=300, check=False)


@pytest.mark.timeout(900)  # the first in the module: the control plane, gen-sdk and a cold npm install
def test_tsc_refuses_a_type_error_in_the_settings(ts_program: tuple[Path, dict[str, str]]) -> None:
    """The schema's types reach TypeScript: an unknown sharing mode and a misspelled key do not compile."""
    directory, env = ts_program
    done = _tsc(directory, env, "--noEmit", "--strict", "--skipLibCheck", "bad.ts")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "bad.ts(6," in out and '"Shared"' in out, out  # gpu.sharing: not a Sharing
    assert "bad.ts(10," in out and "nodeSetupp" in out, out  # no such key on Cluster


@pytest.mark.timeout(1500)
def test_a_typescript_program_deploys_and_destroys(cluster: ControlPlane, ts_program: tuple[Path, dict[str, str]],
                                                   sdks: Sdks) -> None:
    directory, env = ts_program
    kube = cluster.admin()
    for group in ("l4", "a100"):
        create_kwok_node(kube, f"ts-{group}", {POOL: f"ts-{group}", SETUP: ""})
    start = time.monotonic()
    compiled = _tsc(directory, env, "-p", ".")
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    # The SDK reads its version from its package.json at run time (utilities.getVersion).
    shutil.copy(directory / "sdk" / "package.json", directory / "bin" / "sdk" / "package.json")
    compile_s = time.monotonic() - start

    start = time.monotonic()
    outputs = _outputs(_run(["node", "bin/index.js", "up"], directory, env))
    up_s = time.monotonic() - start
    _check_deployed(cluster, outputs, "ts-gpu", "ts")
    start = time.monotonic()
    _run(["node", "bin/index.js", "destroy"], directory, env)
    destroy_s = time.monotonic() - start
    _check_destroyed(cluster, "ts-gpu")
    print(f"\nTypeScript: gen-sdk {sdks.generate_s:.0f} s (both), tsc {compile_s:.0f} s, up {up_s:.0f} s, "
          f"destroy {destroy_s:.0f} s")


# --- Go ---------------------------------------------------------------------------------------------------


def _go_env(env: dict[str, str]) -> dict[str, str]:
    """Go's module and build caches are the account's (outside the clone: warm after the first run), not the
    project's temporary HOME."""
    if shutil.which("go") is None:
        missing("the Go program needs Go on PATH (make deps)")
    out = dict(env)
    for var in ("GOCACHE", "GOMODCACHE", "GOPATH"):
        out[var] = subprocess.run(["go", "env", var], capture_output=True, text=True, check=True).stdout.strip()
    out["GOFLAGS"] = "-mod=mod"
    out["CGO_ENABLED"] = "0"
    return out


@pytest.mark.timeout(1800)
def test_a_go_program_deploys_and_destroys(cluster: ControlPlane, sdks: Sdks,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    directory = tmp_path_factory.mktemp("go")
    for name in ("main.go", "go.mod", "go.sum"):
        shutil.copy(PROGRAMS / "go" / name, directory / name)
    # The SDK is a package named after the schema (nvidiagpu) importing its own internal package by the import
    # path codegen/go derives when the schema names none: a module of that path, as `pulumi package add` makes.
    generated = sdks.go / "nvidiagpu"
    assert f'"{GO_IMPORT_PATH}/internal"' in (generated / "gpuPlatform.go").read_text(), "the SDK's import path moved"
    shutil.copytree(generated, directory / "sdk")
    (directory / "sdk" / "go.mod").write_text(f"module {GO_IMPORT_PATH}\n\ngo 1.26.6\n\nrequire (\n"
                                              "\tgithub.com/blang/semver v3.5.1+incompatible\n"
                                              "\tgithub.com/pulumi/pulumi/sdk/v3 v3.274.1\n)\n")
    _write_project(directory, "gpu-go")
    env = _go_env(_program_env(sdks.project, required_bin()))
    kube = cluster.admin()
    for group in ("l4", "a100"):
        create_kwok_node(kube, f"go-{group}", {POOL: f"go-{group}", SETUP: ""})
    start = time.monotonic()
    _run(["go", "build", "-trimpath", "-o", "gpu-go", "."], directory, env, timeout=1200)
    build_s = time.monotonic() - start

    start = time.monotonic()
    outputs = _outputs(_run([str(directory / "gpu-go"), "up"], directory, env))
    up_s = time.monotonic() - start
    _check_deployed(cluster, outputs, "go-gpu", "go")
    start = time.monotonic()
    _run([str(directory / "gpu-go"), "destroy"], directory, env)
    destroy_s = time.monotonic() - start
    _check_destroyed(cluster, "go-gpu")
    print(f"\nGo: go build {build_s:.0f} s, up {up_s:.0f} s, destroy {destroy_s:.0f} s")
