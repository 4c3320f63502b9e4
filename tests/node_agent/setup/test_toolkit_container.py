"""``toolkit.source: container``: NVIDIA's toolkit installer (``nvidia-ctk-installer``, built from NVIDIA's
module by ``make tools``) run with the arguments the stack renders for the toolkit DaemonSet, on a simulated
node without a toolkit, and node setup pointed at what it installed; teardown takes it all back.

The artifacts tree the installer copies from is the image's ``/artifacts/deb`` laid out with the toolkit's
Go programs of the same release (the installer's own build). libnvidia-container (``nvidia-container-cli``
and its two libraries) is C, which no Go module provides: those three are stand-ins the installer copies
like any other file; nothing here runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nvgpu import toolkit as toolkitspec
from nvgpu.stackconfig import GroupPlan, NodeGroup, load_stack_config
from nvidia_gpu.components.manifests import toolkit
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.tools import required_bin

REPO = Path(__file__).resolve().parents[3]
PROGRAMS = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime", "nvidia-container-runtime.cdi",
            "nvidia-container-runtime.legacy", "nvidia-container-runtime-hook")
LIBRARIES = ("libnvidia-container.so.1.17.8", "libnvidia-container-go.so.1.17.8")


def _installer_bin() -> Path:
    return required_bin("container-toolkit") / "container-toolkit"


def _artifacts(tmp: Path, programs: Path) -> Path:
    root = tmp / "artifacts" / "deb"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    for name in PROGRAMS:
        shutil.copy2(programs / name, root / "usr/bin" / name)
    cli = root / "usr/bin/nvidia-container-cli"
    cli.write_text("#!/bin/sh\necho 'stand-in: libnvidia-container is C' >&2\nexit 1\n")
    cli.chmod(0o755)
    libs = root / "usr/lib/x86_64-linux-gnu"
    for lib in LIBRARIES:  # an ELF file of the right name, and its soname link, as the package installs them
        shutil.copy2("/bin/true", libs / lib)
        (libs / lib.rsplit(".", 2)[0]).symlink_to(lib)
    return root


def _group(envvar: bool = False) -> tuple[NodeGroup, GroupPlan]:
    strategy = {"deviceListStrategy": "envvar"} if envvar else {}
    cfg = load_stack_config({"cluster": {"kubernetesVersion": "1.34", "agentImage": {
        "repository": "registry.example.com/agent", "tag": "1.0.0"}}, "nodeGroups": [
        {"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}}, "gpu": {"model": "L4", **strategy},
         "toolkit": {"source": "container"}}]})
    return cfg.node_groups[0], GroupPlan.of(cfg.cluster, cfg.node_groups[0])


def _install(host: FakeHost, tmp: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """The installer as the DaemonSet runs it, its host paths under the fake root, once (``--no-daemon``)."""
    programs = _installer_bin()
    mapped = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("--toolkit-install-dir", "--driver-root-ctr-path"):
            mapped.append(f"{key}={host.root}{value if value != toolkit.DRIVER_ROOT_IN_CONTAINER else ''}")
        elif key == "--pid-file":
            mapped.append(f"{key}={tmp / 'run/nvidia/toolkit/toolkit.pid'}")
        else:
            mapped.append(arg)
    return subprocess.run([str(programs / "nvidia-ctk-installer"), *mapped, "--no-daemon",
                           f"--toolkit-source-root={_artifacts(tmp, programs)}"],
                          capture_output=True, text=True, timeout=120, check=False)


def _agent(host: FakeHost, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(host.root), "--nvml",
                           "simulated:l4x2", *args], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120, check=False)


def test_node_setup_runs_the_toolkit_nvidias_installer_put_on_a_node_without_one(tmp_path: Path) -> None:
    group, plan = _group()
    ds = toolkit.toolkit_daemonset("gpu", group, plan)
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    host = build_fake_host(tmp_path / "host", "l4x2", deckhouse=False, nvidia_container_runtime=False,
                           toolkit_config=False)
    before = host.snapshot("/etc")
    toolkit_dir = toolkitspec.toolkit_dir(toolkitspec.DEFAULT_INSTALL_DIR)
    # Node setup runs first on a fresh node: it waits (fails, kubelet retries) until the toolkit is there.
    early = _agent(host, "setup", "--no-restart", "--no-patch-node", "--toolkit-dir", toolkit_dir)
    assert early.returncode != 0 and f"waiting for the toolkit container to install {toolkit_dir}" in early.stdout
    assert host.snapshot("/etc") == before, "nothing is written while it waits"

    done = _install(host, tmp_path, list(container["args"]))
    assert done.returncode == 0, done.stdout + done.stderr
    installed = host.root / toolkit_dir.lstrip("/")
    assert os.access(installed / toolkitspec.RUNTIME_WRAPPER, os.X_OK)
    assert (installed / toolkitspec.CDI_HOOK).is_file()
    config = tomllib.loads((installed / toolkitspec.CONFIG).read_text())
    # The settings node setup edits into a node's own toolkit config came from the installer's flags.
    assert config["nvidia-container-cli"]["root"] == "/"
    assert config["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
    assert config["accept-nvidia-visible-devices-as-volume-mounts"] is True
    # The readiness probe's command, run here: the wrapper is there.
    probe = container["readinessProbe"]["exec"]["command"]
    assert subprocess.run([*probe[:-1], probe[-1].replace(toolkit_dir, str(installed))], check=False).returncode == 0

    setup = _agent(host, "--json", "setup", "--no-restart", "--no-patch-node", "--toolkit-dir", toolkit_dir)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    dropin = next((host.root / "etc/containerd/conf.d").glob("*nvidia*")).read_text()
    assert f'BinaryName = "{toolkitspec.runtime_binary(toolkitspec.DEFAULT_INSTALL_DIR)}"' in dropin
    assert 'default_runtime_name = "nvidia"' in dropin
    # The check node setup's monitor runs, told where the toolkit is (as the rendered monitor is); without it
    # the node has no toolkit of its own.
    check = _agent(host, "--json", "check", "--no-record", "--toolkit-dir", toolkit_dir)
    assert check.returncode == 0 and '"verdict": "ok"' in check.stdout, check.stdout
    bare = _agent(host, "--json", "check", "--no-record")
    assert bare.returncode == 1 and '"toolkit-missing"' in bare.stdout, bare.stdout

    down = _agent(host, "teardown", "--no-restart", "--no-patch-node", "--toolkit-dir", toolkit_dir)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not installed.exists() and host.snapshot("/etc") == before


def test_teardown_leaves_a_directory_the_installer_did_not_write(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path / "host", "l4x2", deckhouse=False)
    mine = host.root / "usr/local/nvidia/toolkit"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("an operator's own files\n")
    down = _agent(host, "teardown", "--no-restart", "--no-patch-node", "--toolkit-dir", "/usr/local/nvidia/toolkit")
    assert down.returncode == 0, down.stdout + down.stderr
    assert (mine / "notes.txt").read_text() == "an operator's own files\n"
    assert "no installed toolkit to remove" in down.stdout


@pytest.mark.parametrize("envvar", [False, True], ids=["volume-mounts", "envvar-strategy"])
def test_the_installer_is_told_what_the_group_allows_unprivileged_containers(envvar: bool) -> None:
    _, plan = _group(envvar)
    args = toolkit.installer_args(plan)
    assert f"--accept-nvidia-visible-devices-envvar-when-unprivileged={'true' if envvar else 'false'}" in args
    assert "--no-runtime-config" in args and "--cdi-enabled=false" in args
