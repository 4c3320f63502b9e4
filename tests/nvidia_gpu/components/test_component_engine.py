"""The components under the Pulumi mock engine: what they register, with which parents, inputs and options."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from nvgpu import labels
from nvgpu.nodescripts import WEIGHTS, NodeScript
from nvgpu.stackconfig import AllocationMode, StackConfig
from nvidia_gpu.components.node_group import GpuNodeGroup, GpuNodeGroupArgs
from nvidia_gpu.components.platform import GpuPlatform, GpuPlatformArgs
from nvidia_gpu.components.program import build_stack, decode_config_value, node_scripts, runtime_config_values
from nvidia_gpu.components.sharing_policy import SharingPolicy, SharingPolicyArgs
from nvidia_gpu.sdk import runtime as sdkruntime
from tests.nvidia_gpu.components.component_helpers import (
    Engine,
    by_name,
    config_map_data,
    engine,
    group,
    of_kind,
    stack_config,
)

__all__ = ["engine"]  # the fixture, imported for pytest

SCRIPTS = (NodeScript("gpu-sysctl.sh", 32, "s\n"), NodeScript("gpu-check.sh", 30, "c\n"),
           NodeScript("gpu-runtime.sh", 31, "r\n"))


def _group_component(cfg: StackConfig, scripts: tuple[NodeScript, ...] = ()) -> None:
    platform = GpuPlatform(cfg.cluster.namespace, GpuPlatformArgs(cluster=cfg.cluster))
    g = cfg.node_groups[0]
    GpuNodeGroup(g.name, GpuNodeGroupArgs(cluster=cfg.cluster, group=g, allocation_mode=cfg.allocation_mode(g),
                                         platform=platform.refs, node_scripts=scripts))


def test_platform_registers_namespace_accounts_and_rbac_as_its_children(engine: Engine) -> None:
    cfg = stack_config([group()])
    resources = engine.run(lambda: GpuPlatform("nvidia-gpu", GpuPlatformArgs(cluster=cfg.cluster)))
    comp = by_name(resources)["nvidia-gpu"]
    assert comp.type_token == "nvidia-gpu:index:GpuPlatform" and comp.is_component
    children = [r for r in resources if r.parent_urn == comp.urn]
    assert sorted(r.type_token.rsplit(":", 1)[-1] for r in children) == [
        "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "CustomResourceDefinition",
        "Namespace", "Role", "RoleBinding",
        "RuntimeClass", "ServiceAccount", "ServiceAccount", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert all(r.name.startswith("nvidia-gpu-") for r in children)
    # The policy keeping the node agents to their own node is bound (and refuses when it cannot judge).
    policy, binding = by_name(resources)["nvidia-gpu-own-node-policy"], by_name(resources)[
        "nvidia-gpu-own-node-policy-binding"]
    assert policy.inputs["spec"]["failurePolicy"] == "Fail" and policy.urn in binding.dependencies
    (ns,) = of_kind(resources, "Namespace")
    assert ns.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    binding = by_name(resources)["nvidia-gpu-device-plugin-binding"]
    assert set(binding.dependencies) >= {by_name(resources)["nvidia-gpu-device-plugin-sa"].urn}


def test_platform_registers_the_runtime_class_unless_switched_off(engine: Engine) -> None:
    cfg = stack_config([group()])
    resources = engine.run(lambda: GpuPlatform("nvidia-gpu", GpuPlatformArgs(cluster=cfg.cluster)))
    rc = by_name(resources)["nvidia-gpu-runtime-class"]
    assert rc.type_token == "kubernetes:node.k8s.io/v1:RuntimeClass"
    assert rc.parent_urn == by_name(resources)["nvidia-gpu"].urn
    assert rc.inputs["metadata"]["name"] == "nvidia" and rc.inputs["handler"] == "nvidia"
    assert rc.inputs["scheduling"]["nodeSelector"] == {labels.GPU_SETUP_COMPLETE: ""}


def test_runtime_class_name_is_configurable(engine: Engine) -> None:
    cfg = stack_config([group()], runtimeClass={"name": "nvidia-gpu-stack"})
    resources = engine.run(lambda: GpuPlatform("p", GpuPlatformArgs(cluster=cfg.cluster)))
    (rc,) = of_kind(resources, "RuntimeClass")
    assert rc.name == "p-runtime-class"
    assert rc.inputs["metadata"]["name"] == "nvidia-gpu-stack" and rc.inputs["handler"] == "nvidia"


def test_runtime_class_switched_off_is_not_registered(engine: Engine) -> None:
    """``cluster.runtimeClass.create: false``: the cluster already has one (GPU Operator, another stack)."""
    cfg = stack_config([group()], runtimeClass={"create": False})
    resources = engine.run(lambda: build_stack(cfg))
    assert of_kind(resources, "RuntimeClass") == []
    assert of_kind(resources, "Namespace") and of_kind(resources, "DaemonSet")


def test_daemonset_backend_adds_the_setup_role(engine: Engine) -> None:
    cfg = stack_config([{"name": "g", "nodeSelector": {"matchLabels": {"a": "b"}}}], node_setup="daemonset")
    resources = engine.run(lambda: GpuPlatform("p", GpuPlatformArgs(cluster=cfg.cluster)))
    assert {r.inputs["metadata"]["name"] for r in of_kind(resources, "ServiceAccount")} == {
        "device-plugin", "gpu-labeller", "gpu-setup"}


@pytest.mark.parametrize(
    ("gpu", "replicas_key"),
    [
        ({"sharing": "Exclusive"}, None),
        ({"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 10}}, "timeSlicing"),
        ({"sharing": "MPS", "mps": {"partitionCount": 3}}, "mps"),
        ({"sharing": "MIG", "model": "A100-40GB", "mig": {"partedConfig": "all-1g.5gb"}}, None),
    ],
)
def test_node_group_per_sharing_mode(engine: Engine, gpu: dict[str, Any], replicas_key: str | None) -> None:
    cfg = stack_config([{"name": "grp", "nodeGroup": "ng-grp", "gpu": gpu}])
    resources = engine.run(lambda: _group_component(cfg, SCRIPTS))
    names = by_name(resources)
    comp = names["grp"]
    assert comp.type_token == "nvidia-gpu:index:GpuNodeGroup"
    # Ownership: every child hangs under the group, the ConfigMap under the SharingPolicy.
    policy = names["grp-sharing"]
    assert policy.type_token == "nvidia-gpu:index:SharingPolicy" and policy.parent_urn == comp.urn
    assert names["grp-sharing-config"].parent_urn == policy.urn
    for child in ("grp-device-plugin", "grp-labeller", "grp-node-template", "grp-gpu-check.sh"):
        assert names[child].parent_urn == comp.urn, child

    # The ConfigMap: all named configs, the group's mode with the group's parameters.
    data = config_map_data(resources, "device-plugin-config-grp")
    assert set(data) == {"Exclusive", "TimeSlicing", "MPS", "MIG"}
    own = yaml.safe_load(data[gpu["sharing"]])
    if replicas_key:
        assert own["sharing"][replicas_key]["resources"][0]["replicas"] == gpu[replicas_key]["partitionCount"]
    else:
        assert "sharing" not in own

    # The node template patch: labels for this mode, SSA patch under our field manager, removed on destroy,
    # after the live NodeGroup was read (a missing one fails the preview).
    patch = names["grp-node-template"]
    assert patch.type_token == "kubernetes:deckhouse.io/v1:NodeGroupPatch"
    assert not patch.retain_on_delete
    assert patch.inputs["metadata"]["annotations"] == {"pulumi.com/patchFieldManager": "nvidia-gpu.nvidia-gpu"}
    assert patch.inputs["spec"]["nodeTemplate"]["labels"][labels.DEVICE_GPU_CONFIG] == gpu["sharing"]

    # The device plugin waits for the config and for the platform, and runs only on prepared group nodes.
    plugin = names["grp-device-plugin"]
    assert names["grp-sharing-config-data"].urn in plugin.dependencies  # the ConfigMap with its content
    terms = plugin.inputs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"] == [
        {"key": "node.deckhouse.io/group", "operator": "In", "values": ["ng-grp"]},
        {"key": labels.GPU_SETUP_COMPLETE, "operator": "Exists"},
    ]


def test_node_group_configurations_carry_the_scripts_in_weight_order(engine: Engine) -> None:
    cfg = stack_config([group("h100")])
    resources = engine.run(lambda: _group_component(cfg, SCRIPTS))
    ngcs = of_kind(resources, "NodeGroupConfiguration")
    assert {r.type_token for r in ngcs} == {"kubernetes:deckhouse.io/v1alpha1:NodeGroupConfiguration"}
    specs = sorted((r.inputs["spec"] for r in ngcs), key=lambda s: s["weight"])
    assert [(s["weight"], s["content"]) for s in specs] == [(30, "c\n"), (31, "r\n"), (32, "s\n")]
    assert all(s["nodeGroups"] == ["ng-h100"] and s["bundles"] == ["*"] for s in specs)
    assert "gpu-setup-h100" not in {r.inputs["metadata"]["name"] for r in of_kind(resources, "DaemonSet")}


def test_daemonset_backend_uses_a_setup_daemonset_and_no_deckhouse_objects(engine: Engine) -> None:
    cfg = stack_config([{"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}}}], node_setup="daemonset")
    resources = engine.run(lambda: _group_component(cfg))
    assert {r.inputs["metadata"]["name"] for r in of_kind(resources, "DaemonSet")} == {
        "gpu-setup-l4", "gpu-labeller-l4", "device-plugin-l4"}
    assert by_name(resources)["l4-setup"].parent_urn == by_name(resources)["l4"].urn
    assert not [r for r in resources if r.type_token.startswith("kubernetes:deckhouse.io")]


def test_dra_groups_get_no_device_plugin(engine: Engine) -> None:
    cfg = stack_config([{**group(), "allocationMode": "dra"}])
    assert cfg.allocation_mode(cfg.node_groups[0]) is AllocationMode.DRA
    resources = engine.run(lambda: _group_component(cfg))
    names = by_name(resources)
    assert "gpu-device-plugin" not in names and "gpu-sharing" not in names
    assert "gpu-labeller" in names


def test_sharing_policy_alone(engine: Engine) -> None:
    g = stack_config([group(sharing="TimeSlicing")]).node_groups[0]
    resources = engine.run(lambda: SharingPolicy("sp", SharingPolicyArgs(namespace="ns", group=g)))
    cm, data = by_name(resources)["sp-config"], by_name(resources)["sp-config-data"]
    assert cm.inputs["metadata"] == {
        "name": "device-plugin-config-gpu", "namespace": "ns", "labels": cm.inputs["metadata"]["labels"]}
    assert cm.parent_urn == data.parent_urn == by_name(resources)["sp"].urn
    assert set(config_map_data(resources, "device-plugin-config-gpu")) == {"Exclusive", "TimeSlicing", "MPS", "MIG"}


def test_build_stack_uses_one_explicit_provider_for_everything(engine: Engine) -> None:
    cfg = stack_config([group("a"), group("b", sharing="TimeSlicing")], kubeContext="dev")
    resources = engine.run(lambda: build_stack(cfg))
    (provider,) = [r for r in resources if r.is_provider]
    assert provider.inputs["context"] == "dev"
    k8s_objects = [r for r in resources if r.is_kubernetes_object]
    assert k8s_objects and all(r.provider and r.provider.startswith(provider.urn) for r in k8s_objects)
    assert {r.name for r in resources if r.type_token == "nvidia-gpu:index:GpuNodeGroup"} == {"a", "b"}


def test_invalid_config_in_main_fails_before_registering(engine: Engine) -> None:
    sdkruntime.set_config(
        {"nvidia-gpu:cluster": '{"kubernetesVersion": "1.34"}', "nvidia-gpu:nodeGroups": "[]"}
    )
    main = Path(__file__).resolve().parents[3] / "__main__.py"
    with pytest.raises(pulumi.RunError, match=r"nvidia-gpu:cluster\.agentImage"):
        engine.run(lambda: runpy.run_path(str(main), run_name="__main__"))
    assert engine.monitor.recorded_resources() == ()


@pytest.mark.parametrize(("raw", "value"), [('{"a": 1}', {"a": 1}), ("[1, 2]", [1, 2]), ("plain", "plain"), (3, 3)])
def test_engine_config_values_are_decoded(raw: Any, value: Any) -> None:
    assert decode_config_value(raw) == value
    assert runtime_config_values({"nvidia-gpu:x": raw, "kubernetes:context": "c"}) == {"x": value}


def test_build_stack_renders_the_node_scripts_for_deckhouse_groups(engine: Engine) -> None:
    cfg = stack_config([group("a"), {**group("d"), "allocationMode": "dra", "passthrough": True}])
    resources = engine.run(lambda: build_stack(cfg))
    ngcs = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in of_kind(resources, "NodeGroupConfiguration")}
    expected = {f"nvidia-gpu-a-{n}" for n in ("gpu-devices.sh", "gpu-check.sh", "gpu-runtime.sh", "gpu-sysctl.sh")}
    assert expected <= set(ngcs)
    # A fresh-boot node gets nvidia-uvm and its /dev/nvidia* nodes before bashible's check runs.
    assert ngcs["nvidia-gpu-a-gpu-devices.sh"]["weight"] < ngcs["nvidia-gpu-a-gpu-check.sh"]["weight"]
    assert "modprobe nvidia-uvm" in ngcs["nvidia-gpu-a-gpu-devices.sh"]["content"]
    assert "nvidia-gpu-d-gpu-vfio.sh" in ngcs and "nvidia-gpu-a-gpu-vfio.sh" not in ngcs
    assert ngcs["nvidia-gpu-d-gpu-iommu.sh"]["weight"] == 34 and "nvidia-gpu-a-gpu-iommu.sh" not in ngcs
    for name, spec in ngcs.items():
        script = name.split("-", 3)[-1]
        assert spec["weight"] == WEIGHTS.get(script, 34)
        assert spec["content"].startswith("#!/usr/bin/env bash")


def test_daemonset_backend_renders_no_node_scripts() -> None:
    cfg = stack_config([{"name": "g", "nodeSelector": {"matchLabels": {"a": "b"}}}], node_setup="daemonset")
    assert node_scripts(cfg, cfg.node_groups[0]) == ()
