"""Cluster-wide settings that reach workloads: the MIG manager's reboot policy, and the monitoring block."""

from __future__ import annotations

from typing import Any

import pytest

from node_agent.cli import build_parser
from nvgpu.stackconfig import StackConfigError, load_stack_config
from nvidia_gpu.components.manifests.mig import daemonset, manager_args

IMAGE = {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.1.0"}
MIG_GROUP = {"name": "h100", "nodeGroup": "ng-h100", "gpu": {"sharing": "MIG", "model": "H100-80GB"}}


def _cluster(**extra: Any) -> dict[str, Any]:
    return {"cluster": {"kubernetesVersion": "1.34", "nodeSetup": "deckhouse", "agentImage": IMAGE, **extra},
            "nodeGroups": [MIG_GROUP]}


def _manager_args(**extra: Any) -> Any:
    cfg = load_stack_config(_cluster(**extra))
    argv = manager_args(cfg.cluster)
    assert argv[:2] == ["--host-root", "/host"]
    return build_parser("mig-manager").parse_args(argv)


def test_reboot_is_off_by_default() -> None:
    cfg = load_stack_config(_cluster())
    assert cfg.cluster.mig.allow_reboot is False
    assert _manager_args().allow_reboot is False


def test_allow_reboot_reaches_the_manager_daemonset() -> None:
    cfg = load_stack_config(_cluster(mig={"allowReboot": True}))
    ds = daemonset(cfg.cluster.namespace, cfg.cluster, cfg.node_groups)
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--allow-reboot" in args
    assert _manager_args(mig={"allowReboot": True}).allow_reboot is True


def test_host_gpu_clients_reach_the_manager_daemonset() -> None:
    """Unset, the manager stops NVIDIA's list around a GPU reset; set, exactly the units given."""
    assert _manager_args().host_gpu_client is None
    units = ["nvidia-dcgm.service", "dcgm-exporter.service"]
    cfg = load_stack_config(_cluster(mig={"hostGpuClients": units}))
    args = daemonset(cfg.cluster.namespace, cfg.cluster, cfg.node_groups)["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--host-gpu-client"] == units
    assert _manager_args(mig={"hostGpuClients": units}).host_gpu_client == units


@pytest.mark.parametrize(("mig", "path"), [
    ({"allowReboot": "sometimes"}, "nvidia-gpu:cluster.mig.allowReboot"),
    ({"hostGpuClients": ["dcgm; reboot"]}, "nvidia-gpu:cluster.mig.hostGpuClients"),
    ({"hostGpuClients": []}, "nvidia-gpu:cluster.mig.hostGpuClients"),
    ({"allowReboots": True}, "nvidia-gpu:cluster.mig.allowReboots"),
])
def test_bad_mig_settings_name_the_field(mig: dict[str, Any], path: str) -> None:
    with pytest.raises(StackConfigError) as err:
        load_stack_config(_cluster(mig=mig))
    assert any(p.startswith(path) for p in err.value.problems), err.value.problems


def test_pod_monitor_is_not_an_option() -> None:
    """The PodMonitor CRD cannot be validated offline, so the stack refuses the key instead of ignoring it."""
    with pytest.raises(StackConfigError) as err:
        load_stack_config(_cluster(monitoring={"enabled": True, "podMonitor": True}))
    assert any(p.startswith("nvidia-gpu:cluster.monitoring.podMonitor") for p in err.value.problems)
