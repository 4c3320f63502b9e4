"""The DRA parts of the stack config: quotas, health action, passthrough and the version floor."""

from __future__ import annotations

from typing import Any

import pytest

from nvgpu.stackconfig import StackConfigError, load_stack_config


def config(version: str = "1.34", dra: dict[str, Any] | None = None, **group: Any) -> dict[str, Any]:
    return {
        "cluster": {"kubernetesVersion": version, "allocationMode": "dra",
                    "agentImage": {"repository": "registry.example/nvidia-gpu-agent", "tag": "0.1.0"},
                    **({"dra": dra} if dra is not None else {})},
        "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"gpu": "h100"}}, **group}],
    }


def problems(values: dict[str, Any]) -> str:
    with pytest.raises(StackConfigError) as e:
        load_stack_config(values)
    return "\n".join(e.value.problems)


def test_defaults_and_full_dra_block() -> None:
    cfg = load_stack_config(config(dra={"driverName": "gpu.example.com", "healthAction": "withdraw",
                                        "claimQuotas": [{"namespace": "team-a", "claims": 10,
                                                         "devices": {"gpu.nvidia.com": 4}}]}, passthrough=True))
    assert cfg.cluster.dra.driver_name == "gpu.example.com"
    assert cfg.cluster.dra.claim_quotas[0].devices == {"gpu.nvidia.com": 4}
    assert cfg.node_groups[0].passthrough and cfg.uses_dra


def test_dra_below_1_34_is_a_clear_error() -> None:
    assert ("nvidia-gpu:cluster.allocationMode: 'dra' needs Kubernetes 1.34+ (resource.k8s.io/v1) and "
            "cluster.kubernetesVersion is 1.33 (node group 'h100' inherits it)") in problems(config(version="1.33"))


@pytest.mark.parametrize(("dra", "needle"), [
    ({"claimQuotas": [{"namespace": "team-a"}]}, "a quota without limits"),
    ({"claimQuotas": [{"namespace": "team-a", "devices": {"gpu.nvidia.co": 1}}]},
     "claimQuotas[0].devices.gpu.nvidia.co: unknown DeviceClass 'gpu.nvidia.co'"),
    ({"claimQuotas": [{"namespace": "a", "claims": 1}, {"namespace": "a", "claims": 2}]},
     "claimQuotas[1].namespace: one quota per namespace: 'a' has one already (claimQuotas[0])"),
    ({"claimQuotas": [{"namespace": "a", "claims": -1}]}, "claimQuotas[0].claims"),
    ({"healthAction": "taint"}, "needs DRADeviceTaints"),
    ({"healthAction": "drop"}, "cluster.dra.healthAction"),
    ({"driverName": "Gpu_Nvidia"}, "cluster.dra.driverName"),
    ({"driverName": "a" * 60 + ".com"}, "cluster.dra.driverName"),
    ({"quota": 1}, "cluster.dra.quota: unknown key"),
])
def test_bad_dra_settings_name_the_field(dra: dict[str, Any], needle: str) -> None:
    assert needle in problems(config(dra=dra))


def test_taint_allowed_from_1_36() -> None:
    assert load_stack_config(config(version="1.36", dra={"healthAction": "taint"})).cluster.dra.health_action == "taint"


def test_passthrough_needs_dra() -> None:
    values = config(passthrough=True)
    values["cluster"]["allocationMode"] = "devicePlugin"
    assert "nvidia-gpu:nodeGroups[0].passthrough: needs allocationMode 'dra'" in problems(values)
