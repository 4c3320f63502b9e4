"""Which GPUs NVIDIA's own hook gives a container, with the toolkit config our node setup writes.

``nvidia-container-runtime`` in its default (legacy) mode adds ``nvidia-container-runtime-hook prestart`` to
every container; the hook reads ``/etc/nvidia-container-runtime/config.toml`` and the container's OCI spec,
decides the device list and hands it to ``nvidia-container-cli configure --device=...``. Here the real hook
(built from the pinned NVIDIA Container Toolkit, ``make tools``) runs on OCI specs laid out as containerd
lays out a pod's container, with a recording ``nvidia-container-cli`` in place of the C library: what it is
called with is exactly what the container would get.

The chain is ours end to end up to the hook: the stack config renders the device plugin's config and the
labeller's DaemonSet, the device plugin's allocator answers from that config, and ``node_agent setup``'s
runtime step writes the toolkit config on a simulated host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from node_agent.cli import main
from node_agent.deviceplugin import config as plugin_config
from node_agent.deviceplugin.allocate import Allocator
from node_agent.deviceplugin.resources import build_resources
from nvgpu import devicelist
from nvgpu.nodescripts import facts
from nvgpu.stackconfig import Sharing
from nvidia_gpu.components.manifests.sharing import device_plugin_config
from nvidia_gpu.components.program import build_stack
from nvml_sim.host import TOOLKIT_PACKAGE_CONFIG
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.oci import privileged_caps
from tests.kit.tools import required_bin
from tests.node_agent.deviceplugin.builders import machine
from tests.nvidia_gpu.components.component_helpers import Engine, engine, group, of_kind, stack_config  # noqa: F401

pytestmark = pytest.mark.compare
HOOK = "nvidia-container-runtime-hook"
UNPRIVILEGED_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
                     "CAP_NET_BIND_SERVICE"]  # containerd's defaults: no CAP_SYS_ADMIN


class Node:
    """A simulated GPU node whose toolkit config node setup manages, and the real hook reading it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hook = required_bin(HOOK) / HOOK
        self.host = build_fake_host(tmp / "node", "l4x2")
        self.cli = tmp / "nvidia-container-cli"
        self.calls = tmp / "cli-calls.json"
        self.cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c \'import json, sys; '
                            f'json.dump(sys.argv[1:], open("{self.calls}", "w"))\' "$@"\n')
        self.cli.chmod(0o755)
        # What the package installed, with the two settings an operator of this node has: the CLI's path
        # (here the recorder) and the hook called by the nvidia runtime (no mode detection).
        self.config.write_text(TOOLKIT_PACKAGE_CONFIG
                               .replace('#path = "/usr/bin/nvidia-container-cli"', f'path = "{self.cli}"')
                               .replace("skip-mode-detection = false", "skip-mode-detection = true"))
        self.bundles = 0

    @property
    def config(self) -> Path:
        return self.host.path(facts.TOOLKIT_CONFIG)

    def agent(self, *args: str) -> None:
        code = main(["--host-root", str(self.host.root), "--host-exec", "direct", "--nvml", self.host.nvml_spec,
                     "--json", "runtime", *args, "--no-restart"])
        assert code == 0

    def devices(self, env: dict[str, str], mounts: list[tuple[str, str]], *, privileged: bool = False) -> str | None:
        """The ``--device`` list the hook hands the CLI for a container (None: the hook does not call it, so
        the container gets no GPU)."""
        self.bundles += 1
        bundle = self.tmp / f"bundle-{self.bundles}"
        (bundle / "rootfs").mkdir(parents=True)
        caps = privileged_caps() if privileged else UNPRIVILEGED_CAPS
        spec = {
            "ociVersion": "1.2.0",
            "process": {"env": ["PATH=/usr/bin:/bin", *(f"{k}={v}" for k, v in env.items())],
                        "capabilities": {"bounding": caps, "effective": caps, "permitted": caps}},
            "root": {"path": str(bundle / "rootfs")},
            "mounts": [{"destination": dst, "source": src, "type": "bind", "options": ["rbind", "ro"]}
                       for dst, src in mounts],
        }
        (bundle / "config.json").write_text(json.dumps(spec))
        self.calls.unlink(missing_ok=True)
        state = json.dumps({"ociVersion": "1.2.0", "id": bundle.name, "pid": os.getpid(), "bundle": str(bundle)})
        run = subprocess.run([str(self.hook), "-config", str(self.config), "prestart"], input=state, cwd=bundle,
                             capture_output=True, text=True, timeout=30, check=False)
        assert run.returncode == 0, run.stderr
        if not self.calls.exists():
            return None
        args: list[str] = json.loads(self.calls.read_text())
        return next((a.removeprefix("--device=") for a in args if a.startswith("--device=")), "")


def _allocation(node: Node, strategy: str | None = None) -> tuple[list[str], dict[str, str], list[tuple[str, str]]]:
    """What our device plugin answers for the first GPU under the config the stack renders for a default group
    (or one with ``strategy``): ``(uuids, envs, (container path, host path) mounts)``."""
    gpu: dict[str, Any] = {} if strategy is None else {"deviceListStrategy": strategy}
    cfg = stack_config([group("l4", **gpu)], node_setup="daemonset")
    doc = device_plugin_config(cfg.node_groups[0], Sharing.EXCLUSIVE)
    settings = plugin_config.load(yaml.safe_dump(doc))
    plugin_host = FakeHost(node.tmp / "plugin-host")
    gpus = machine("l4x2", plugin_host).gpu_list
    (resource,) = build_resources(gpus, settings, plugin_host)
    answer = Allocator(resource, settings, plugin_host).allocate([gpus[0].uuid])
    return [gpus[0].uuid], dict(answer.envs), [(m.container_path, m.host_path) for m in answer.mounts]


def test_the_package_default_lets_any_pod_take_every_gpu(tmp_path: Path) -> None:
    """Why node setup touches the file at all: before it, an unprivileged pod names its own GPUs."""
    node = Node(tmp_path)
    assert node.devices({"NVIDIA_VISIBLE_DEVICES": "all"}, []) == "all"


def test_after_setup_a_pod_gets_only_what_the_device_plugin_allocated(tmp_path: Path) -> None:
    node = Node(tmp_path)
    before = node.config.read_text()
    node.agent("apply")
    assert node.devices({"NVIDIA_VISIBLE_DEVICES": "all"}, []) is None  # no allocation: no GPU at all
    uuids, envs, mounts = _allocation(node)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": devicelist.VOLUME_MOUNT_ROOT}
    assert node.devices(envs, mounts) == ",".join(uuids)
    # A pod that also sets NVIDIA_VISIBLE_DEVICES=all: kubelet puts the plugin's value last, which wins, and
    # the hook takes the mounted list before any variable.
    assert node.devices({"NVIDIA_VISIBLE_DEVICES": "all", **envs}, mounts) == ",".join(uuids)
    assert node.devices({"NVIDIA_VISIBLE_DEVICES": uuids[0]}, []) is None  # naming a UUID does not help
    # Privileged pods are trusted with the host anyway, and the variable still works for them.
    assert node.devices({"NVIDIA_VISIBLE_DEVICES": "all"}, [], privileged=True) == "all"
    node.agent("rollback")
    assert node.config.read_text() == before
    assert node.devices({"NVIDIA_VISIBLE_DEVICES": "all"}, []) == "all"


def test_an_envvar_group_keeps_working_and_is_open_again(tmp_path: Path) -> None:
    """``deviceListStrategy: envvar``, chosen explicitly: setup must let the toolkit honour the variable (else the
    plugin's own answer would give no GPU), which opens the hole again: hence the policy pack's warning."""
    node = Node(tmp_path)
    uuids, envs, mounts = _allocation(node, "envvar")
    assert (envs, mounts) == ({"NVIDIA_VISIBLE_DEVICES": uuids[0]}, [])
    node.agent("apply")
    assert node.devices(envs, mounts) is None  # the safe toolkit config would break this group ...
    node.agent("apply", "--accept-envvar-when-unprivileged")  # ... so setup gets the flag for it
    assert node.devices(envs, mounts) == uuids[0]
    assert node.devices({"NVIDIA_VISIBLE_DEVICES": "all"}, []) == "all"


def test_the_labeller_pod_still_gets_every_gpu(tmp_path: Path, engine: Engine) -> None:  # noqa: F811
    """The unprivileged labeller asks for all GPUs the way the stack renders it, and gets them after setup."""
    node = Node(tmp_path)
    node.agent("apply")
    resources = engine.run(lambda: build_stack(stack_config([group("l4")])))
    (ds,) = [r.inputs for r in of_kind(resources, "DaemonSet")
             if r.inputs["metadata"]["labels"]["app.kubernetes.io/component"] == "gpu-labeller"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    mounts = [(m["mountPath"], volumes[m["name"]]["hostPath"]["path"]) for m in container["volumeMounts"]
              if "hostPath" in volumes[m["name"]]]
    assert container["securityContext"]["privileged"] is False
    assert node.devices(env, mounts) == "all"
