"""Every agent DaemonSet mounts the driver root read-only at /driver-root and passes ``--driver-root``.

The agent loads NVML (and finds ``nvidia-smi``) there, so no agent container depends on the NVIDIA runtime
being containerd's default, and the setup pod can check a node whose runtime is not configured yet.
"""

from __future__ import annotations

from typing import Any

import pytest

from nvgpu.stackconfig import load_stack_file
from nvidia_gpu.components.manifests import workloads
from nvidia_gpu.components.program import build_stack
from tests.nvidia_gpu.components.component_helpers import ROOT_STACKS, Engine, engine, group, of_kind, stack_config  # noqa: F401

#: The agents that write CDI specs (and so look for the toolkit's hook).
CDI_WRITERS = {"device-plugin", "dra-kubelet-plugin"}
AGENT_COMPONENTS = {"device-plugin", "gpu-labeller", "gpu-setup", "mig-manager", "dra-kubelet-plugin"}


def _agent_lines(pod: dict[str, Any]) -> list[tuple[dict[str, Any], list[str]]]:
    out = []
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if c["command"] == workloads.AGENT:
            out.append((c, list(c["args"])))
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if pre_stop:
            out.append((c, pre_stop[len(workloads.AGENT):]))
    return out


def _check(resources: Any, default_root: str, roots: dict[str, str] | None = None,
           hooks: dict[str, str] | None = None) -> set[str]:
    """Every agent DaemonSet mounts its driver root (``roots`` per node group; ``default_root`` for the
    rest) and passes it to the agent; the CDI writers name their group's toolkit hook (``hooks``; the
    node's own, /usr/bin/nvidia-cdi-hook, for the rest)."""
    seen = set()
    for r in of_kind(resources, "DaemonSet"):
        pod = r.inputs["spec"]["template"]["spec"]
        labels = r.inputs["metadata"]["labels"]
        component = labels.get("app.kubernetes.io/component", "")
        if component in ("nvidia-driver", "nvidia-container-toolkit"):  # NVIDIA's installers: no agent there
            continue
        hook_path = (hooks or {}).get(labels.get("gpu.nvidia-gpu.io/node-group", ""), "/usr/bin/nvidia-cdi-hook")
        driver_root = (roots or {}).get(labels.get("gpu.nvidia-gpu.io/node-group", ""), default_root)
        if component == "mig-manager" and r.inputs["metadata"]["name"].endswith("-driver-container"):
            driver_root = "/run/nvidia/driver"
        volumes = {v["name"]: v for v in pod["volumes"]}
        # A driver container's root is made by its first run, after node setup has started there.
        containerised = driver_root == "/run/nvidia/driver"
        kind = "DirectoryOrCreate" if containerised else "Directory"
        assert volumes["driver-root"]["hostPath"] == {"path": driver_root, "type": kind}, component
        for c, argv in _agent_lines(pod):
            mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
            mount = mounts["/driver-root"]
            assert (mount["name"], mount.get("readOnly")) == ("driver-root", True), c["name"]
            # Following the host's mounts: a driver container replaced by an upgrade remounts it.
            assert mount.get("mountPropagation") == ("HostToContainer" if containerised else None), c["name"]
            i = argv.index("--driver-root")
            assert argv[i + 1] == "/driver-root", c["name"]
            command = next(a for a in argv if not a.startswith("-") and a not in ("/host", "/driver-root"))
            assert i < argv.index(command), f"{c['name']}: --driver-root is a global option"
            if component in CDI_WRITERS:
                # The toolkit hook's directory, read-only, where the CDI writers look for the hook.
                hook = mounts[workloads.CDI_HOOK_DIR]
                assert (hook["name"], hook.get("readOnly")) == ("cdi-hook", True), c["name"]
                assert volumes["cdi-hook"]["hostPath"] == {"path": hook_path.rsplit("/", 1)[0],
                                                           "type": "DirectoryOrCreate"}
                flag = "--nvidia-ctk-path" if component == "device-plugin" else "--cdi-hook-path"
                assert argv[argv.index(flag) + 1] == hook_path, c["name"]
                assert argv[argv.index("--cdi-hook-dir") + 1] == workloads.CDI_HOOK_DIR, c["name"]
            else:
                assert "cdi-hook" not in volumes, component
            seen.add(component)
    return seen


@pytest.mark.parametrize("node_setup", ["daemonset", "deckhouse"])
@pytest.mark.parametrize("driver_root", ["/", "/run/nvidia/driver"])
def test_every_agent_daemonset_mounts_the_driver_root(engine: Engine, node_setup: str,  # noqa: F811
                                                      driver_root: str) -> None:
    groups = [group("a", "TimeSlicing"),
              group("m", "MIG", model="H100-80GB", mig={"partedConfig": "all-1g.10gb", "strategy": "mixed"}),
              {"name": "d", "nodeGroup": "ng-d", "allocationMode": "dra"}]
    cfg = stack_config(groups, node_setup=node_setup, driverRoot=driver_root)
    seen = _check(engine.run(lambda: build_stack(cfg)), driver_root)
    expected = AGENT_COMPONENTS - ({"gpu-setup"} if node_setup == "deckhouse" else set())
    assert seen >= expected, seen


@pytest.mark.parametrize("stack", ROOT_STACKS, ids=lambda p: p.name)
def test_shipped_stacks(engine: Engine, stack: Any) -> None:  # noqa: F811
    cfg = load_stack_file(stack)
    assert cfg.cluster.driver_root == "/"
    # Each group's agents at its own root: / where pre-installed, /run/nvidia/driver where a container
    # installs it (Pulumi.drivers.yaml has both).
    roots = {g.name: cfg.cluster.driver_root_for(g) for g in cfg.node_groups}
    # And each its own toolkit: the node's, or the one NVIDIA's toolkit container installed (l4-compiled).
    hooks = {g.name: cfg.cluster.cdi_hook_for(g) for g in cfg.node_groups}
    assert {"device-plugin", "gpu-labeller"} <= _check(engine.run(lambda: build_stack(cfg)), "/", roots, hooks)


@pytest.mark.parametrize("bad", ["run/nvidia", "/run/../etc", ""])
def test_driver_root_must_be_absolute(bad: str) -> None:
    with pytest.raises(Exception, match="absolute path"):
        stack_config([group()], driverRoot=bad)


@pytest.mark.parametrize("bad", ["usr/bin/nvidia-cdi-hook", "/usr/bin/../sbin/nvidia-cdi-hook", "/usr/bin/ldconfig"])
def test_cdi_hook_path_must_name_the_toolkits_hook(bad: str) -> None:
    with pytest.raises(Exception, match="cdiHookPath"):
        stack_config([group()], cdiHookPath=bad)
