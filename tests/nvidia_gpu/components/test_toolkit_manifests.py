"""``toolkit.source: container``: NVIDIA's toolkit DaemonSet on the group's nodes, node setup and the device
plugin pointed at what it installs, and the policy pack allowing it (the installer itself is run in
``tests/node_agent/setup/test_toolkit_container.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvgpu.stackconfig import AllocationMode, GroupPlan, load_stack_config
from nvidia_gpu.components.manifests import toolkit, workloads
from nvidia_gpu.components.manifests.workloads import GroupContext
from tests.nvidia_gpu.policies.policy_fixtures import DS_TYPE, check

REPO = Path(__file__).resolve().parents[3]


def _ctx(driver: dict[str, Any] | None = None) -> GroupContext:
    cfg = load_stack_config({"cluster": {"kubernetesVersion": "1.34", "agentImage": {
        "repository": "registry.example.com/agent", "tag": "1.0.0"}}, "nodeGroups": [
        {"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}},
         "gpu": {"model": "L4", **({"driver": driver} if driver else {})},
         "toolkit": {"source": "container", "installDir": "/opt/nvidia"}}]})
    (g,) = cfg.node_groups
    return GroupContext("gpu", cfg.cluster, g, GroupPlan.of(cfg.cluster, g))


def test_the_toolkit_daemonset_installs_on_the_groups_nodes_before_setup() -> None:
    ctx = _ctx({"source": "container", "version": "550.90.07", "osReleases": ["ubuntu22.04"]})
    ds = toolkit.toolkit_daemonset("gpu", ctx.group, GroupPlan.of(ctx.cluster, ctx.group, AllocationMode.DEVICE_PLUGIN))
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "nvcr.io/nvidia/k8s/container-toolkit:v1.20.2"
    assert c["command"] == ["/work/nvidia-ctk-installer"]
    assert "--toolkit-install-dir=/opt/nvidia" in c["args"] and "--no-runtime-config" in c["args"]
    assert "--driver-root=/run/nvidia/driver" in c["args"]  # the driver container's root
    assert {"name": "toolkit-install-dir", "hostPath": {"path": "/opt/nvidia", "type": "DirectoryOrCreate"}} in pod[
        "volumes"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert "gpu-setup-complete" not in json.dumps(term), "node setup waits for the toolkit, not the other way"
    assert c["livenessProbe"]["exec"] == c["readinessProbe"]["exec"]
    assert "/opt/nvidia/toolkit/nvidia-container-runtime" in c["readinessProbe"]["exec"]["command"][-1]


def test_node_setup_and_the_device_plugin_use_the_installed_toolkit() -> None:
    ctx = _ctx()
    setup = workloads.setup_daemonset(ctx)["spec"]["template"]["spec"]
    (init,) = setup["initContainers"]
    assert init["args"][-2:] == ["--toolkit-dir", "/opt/nvidia/toolkit"]
    hold, _ = setup["containers"]
    assert hold["lifecycle"]["preStop"]["exec"]["command"][-3:] == ["teardown", "--toolkit-dir", "/opt/nvidia/toolkit"]
    plugin = workloads.device_plugin_daemonset(ctx)["spec"]["template"]["spec"]
    args = plugin["containers"][0]["args"]
    assert args[args.index("--nvidia-ctk-path") + 1] == "/opt/nvidia/toolkit/nvidia-cdi-hook"
    hook = next(v for v in plugin["volumes"] if v["name"] == workloads.CDI_HOOK_VOLUME)
    assert hook["hostPath"]["path"] == "/opt/nvidia/toolkit"


def test_the_policy_pack_allows_the_toolkit_container_and_no_other_role_its_access() -> None:
    ctx = _ctx()
    ds = toolkit.toolkit_daemonset("gpu", ctx.group, GroupPlan.of(ctx.cluster, ctx.group, AllocationMode.DEVICE_PLUGIN))
    shipped = json.loads((REPO / "policies" / "config.json").read_text())
    configs: tuple[dict[str, Any], ...] = (shipped["host-access-allow-listed"], {})
    for config in configs:
        assert check("host-access-allow-listed", DS_TYPE, ds, config) == []
    assert check("pinned-images", DS_TYPE, ds) == []
    other = {**ds, "metadata": {**ds["metadata"], "labels": {**ds["metadata"]["labels"],
                                                             "app.kubernetes.io/component": "gpu-labeller"}}}
    assert any("privileged" in m for m in check("host-access-allow-listed", DS_TYPE, other))
