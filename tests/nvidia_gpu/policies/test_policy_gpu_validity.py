"""GPU-config validity policies: one passing and one failing resource or stack per rule, exact messages."""

from __future__ import annotations

import pytest

from nvgpu import labels
from nvidia_gpu.policies.gpu_validity import GPU_MODEL_KEY
from tests.nvidia_gpu.policies.policy_fixtures import (
    CM_TYPE,
    DEVICE_CLASS_TYPE,
    DS_TYPE,
    NODE_GROUP_PATCH_TYPE,
    NS_TYPE,
    check,
    check_stack,
    config_map,
    container,
    daemonset,
    device_class,
    gpu_terms,
    mig_doc,
    mig_entry,
    namespace,
    node_group_patch,
    pulumi_config,
)

H100 = {GPU_MODEL_KEY: "H100-80GB"}
NVIDIA = 'device.driver == "gpu.nvidia.com"'


def mig_messages(cm: dict[str, object]) -> list[str]:
    """The MIG policy on one ConfigMap: messages, each reported against that ConfigMap."""
    out = check_stack("mig-config-fits-gpu", [(CM_TYPE, cm)])
    assert {urn for _, urn in out} <= {"urn:0"}
    return [m for m, _ in out]


def dc_messages(dc: dict[str, object]) -> list[str]:
    """The DRA policy on one DeviceClass in a Kubernetes 1.34 stack."""
    ns = namespace(labels_={"pod-security.kubernetes.io/enforce-version": "v1.34"})
    out = check_stack("dra-objects-valid", [(NS_TYPE, ns), (DEVICE_CLASS_TYPE, dc)])
    assert {urn for _, urn in out} <= {"urn:1"}
    return [m for m, _ in out]


# ------------------------------------------------------------------ mig-config-fits-gpu: ConfigMaps


def test_mig_config_that_fits_passes() -> None:
    cm = config_map({"config.yaml": mig_doc({"all-1g.10gb": [mig_entry({"1g.10gb": 7})]})}, labels_=H100)
    assert mig_messages(cm) == []


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ({"1g.10gb": 8}, "8 x 1g.10gb exceeds the 7 instance(s) a H100-80GB can hold"),
        ({"1g.11gb": 1}, "profile '1g.11gb' is unknown for H100-80GB; allowed: 1g.10gb, 1g.10gb+me, 1g.20gb, "
                         "2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
        ({"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, "layout needs 8 compute slices but the H100-80GB has 7"),
    ],
    ids=["too-many", "unknown-profile", "no-placement"],
)
def test_mig_config_that_does_not_fit_the_declared_model(devices: dict[str, int], problem: str) -> None:
    cm = config_map({"config.yaml": mig_doc({"mine": [mig_entry(devices)]})}, labels_=H100)
    assert mig_messages(cm) == [f"data[config.yaml]: MIG config 'mine': every GPU: {problem}"]


def test_mig_config_checked_against_the_models_its_device_filter_names() -> None:
    a30 = "0x20B710DE"
    cm = config_map({"c": mig_doc({"all-1g.6gb": [mig_entry({"1g.6gb": 5}, **{"device-filter": a30})]})})
    assert mig_messages(cm) == [
        "data[c]: MIG config 'all-1g.6gb': every GPU: 5 x 1g.6gb exceeds the 4 instance(s) a A30-24GB can hold"
    ]


def test_mig_config_for_gpus_outside_the_catalogue_is_left_to_mig_parted() -> None:
    unlisted = "0x2FF010DE"  # the simulator's unlisted-x2 board: in neither the catalogue nor NVIDIA's tables
    cm = config_map({"c": mig_doc({"all-1g.23gb": [mig_entry({"1g.23gb": 7}, **{"device-filter": unlisted})]})})
    assert mig_messages(cm) == []


def test_mig_config_for_a_b200_is_checked_now_the_catalogue_knows_it() -> None:
    b200 = "0x290110DE"  # NVIDIA's mig-parted device filter for the B200
    cm = config_map({"c": mig_doc({"all-1g.23gb": [mig_entry({"1g.23gb": 8}, **{"device-filter": b200})]})})
    assert mig_messages(cm) == [
        "data[c]: MIG config 'all-1g.23gb': every GPU: 8 x 1g.23gb exceeds the 7 instance(s) a B200 can hold"
    ]


def test_mig_config_without_a_model_still_needs_known_profiles() -> None:
    cm = config_map({"c": mig_doc({"odd": [mig_entry({"1g.11gb": 1})], "ok": [mig_entry({"1g.10gb": 2})]})})
    assert mig_messages(cm) == [
        "data[c]: MIG config 'odd': profile '1g.11gb' is not a MIG profile of any catalogue GPU"
    ]


def test_mig_config_that_does_not_parse() -> None:
    cm = config_map({"c": {"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": False,
                                                                     "mig-devices": {"1g.10gb": 1}}]}}})
    (problem,) = mig_messages(cm)
    assert problem.startswith("data[c]: mig-configs.x.0: ")


def test_other_config_maps_are_ignored() -> None:
    assert mig_messages(config_map({"k": "plain text", "j": {"a": 1}})) == []


# ------------------------------------------------------------------ mig-config-fits-gpu: selections


def _group_config() -> str:
    return pulumi_config({"nodeGroups": [{"name": "h100-mig", "nodeGroup": "gpu-h100",
                                          "gpu": {"model": "H100-80GB", "sharing": "MIG"}}]})


def test_selection_of_a_standard_config_that_fits_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", _group_config())
    ng = node_group_patch("gpu-h100", {labels.MIG_CONFIG: "all-1g.10gb", labels.NODE_GROUP: "h100-mig"})
    assert check_stack("mig-config-fits-gpu", [(NODE_GROUP_PATCH_TYPE, ng)]) == []


def test_selection_of_a_config_the_gpu_does_not_have(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", _group_config())
    ng = node_group_patch("gpu-h100", {labels.MIG_CONFIG: "all-1g.5gb", labels.NODE_GROUP: "h100-mig"})
    assert check_stack("mig-config-fits-gpu", [(NODE_GROUP_PATCH_TYPE, ng)]) == [(
        "NodeGroup 'gpu-h100' spec.nodeTemplate.labels: nvidia.com/mig.config=all-1g.5gb: "
        "not a config mig-parted generates for the H100-80GB",
        "urn:0",
    )]


def test_selection_must_name_a_config_the_stack_defines() -> None:
    cm = config_map({"c": mig_doc({"custom-a": [mig_entry({"1g.10gb": 2})]})})
    ds = daemonset("labeller-h100", role="gpu-labeller",
                   containers=[container(args=["labels", "--node-label", f"{labels.MIG_CONFIG}=custom-b"])])
    assert check_stack("mig-config-fits-gpu", [(CM_TYPE, cm), (DS_TYPE, ds)]) == [(
        "DaemonSet 'nvidia-gpu/labeller-h100' container 'agent' --node-label: nvidia.com/mig.config=custom-b: "
        "no mig-parted config of that name; the stack defines: custom-a",
        "urn:1",
    )]


def test_selection_without_a_model_must_fit_some_catalogue_gpu() -> None:
    """A defined config for GPUs outside the catalogue is left to mig-parted, but nodes of unknown model told
    to apply it are not: the MigProfile component refuses the same choice (nvgpu.migparted.fit_problems)."""
    cm = config_map({"c": mig_doc({"blackwell": [mig_entry({"1g.23gb": 7}, **{"device-filter": "0x2FF010DE"})],
                                   "custom-a": [mig_entry({"1g.10gb": 2})]})})
    ok = node_group_patch("gpu-a", {labels.MIG_CONFIG: "custom-a"})
    assert check_stack("mig-config-fits-gpu", [(CM_TYPE, cm), (NODE_GROUP_PATCH_TYPE, ok)]) == []
    ng = node_group_patch("gpu-b", {labels.MIG_CONFIG: "blackwell"})
    assert check_stack("mig-config-fits-gpu", [(CM_TYPE, cm), (NODE_GROUP_PATCH_TYPE, ng)]) == [(
        "NodeGroup 'gpu-b' spec.nodeTemplate.labels: nvidia.com/mig.config=blackwell: "
        "MIG config 'blackwell' fits none of the catalogue's GPU models",
        "urn:1",
    )]


def test_selected_defined_config_must_fit_the_groups_gpu() -> None:
    cm = config_map({"c": mig_doc({"custom-a": [mig_entry({"7g.80gb": 2})]})})
    ng = node_group_patch("gpu-h100", {labels.MIG_CONFIG: "custom-a", GPU_MODEL_KEY: "H100-80GB"})
    assert check_stack("mig-config-fits-gpu", [(CM_TYPE, cm), (NODE_GROUP_PATCH_TYPE, ng)]) == [(
        "NodeGroup 'gpu-h100' spec.nodeTemplate.labels: nvidia.com/mig.config=custom-a: MIG config 'custom-a': "
        "every GPU: 2 x 7g.80gb exceeds the 1 instance(s) a H100-80GB can hold",
        "urn:1",
    )]


# ------------------------------------------------------------------ sharing-parameters-valid


def _dp_config(mode: str, replicas: object, mig_strategy: str = "none", **resource: object) -> dict[str, object]:
    return {"version": "v1", "flags": {"migStrategy": mig_strategy},
            "sharing": {mode: {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas, **resource}]}}}


def test_time_slicing_replicas_of_two_or_more_pass() -> None:
    assert check("sharing-parameters-valid", CM_TYPE, config_map({"TimeSlicing": _dp_config("timeSlicing", 2.0)})) == []


@pytest.mark.parametrize("replicas", [1, 0, "4", 2.5])
def test_time_slicing_replicas_out_of_range(replicas: object) -> None:
    cm = config_map({"TimeSlicing": _dp_config("timeSlicing", replicas)})
    assert check("sharing-parameters-valid", CM_TYPE, cm) == [
        f"data[TimeSlicing] sharing.timeSlicing.resources[0] (nvidia.com/gpu): replicas must be an integer >= 2 "
        f"(got {replicas!r})"
    ]


def test_mps_within_limits_passes() -> None:
    assert check("sharing-parameters-valid", CM_TYPE, config_map({"MPS": _dp_config("mps", 48)})) == []


def test_mps_replicas_beyond_what_mps_supports() -> None:
    cm = config_map({"MPS": _dp_config("mps", 49)})
    assert check("sharing-parameters-valid", CM_TYPE, cm) == [
        "data[MPS] sharing.mps.resources[0] (nvidia.com/gpu): replicas must be an integer from 2 to 48 (got 49)"
    ]


def test_mps_limit_from_policy_config() -> None:
    cm = config_map({"MPS": _dp_config("mps", 16)})
    assert check("sharing-parameters-valid", CM_TYPE, cm, {"mpsMaxReplicas": 8}) == [
        "data[MPS] sharing.mps.resources[0] (nvidia.com/gpu): replicas must be an integer from 2 to 8 (got 16)"
    ]


def test_mps_with_mig() -> None:
    cm = config_map({"MPS": _dp_config("mps", 4, mig_strategy="mixed", devices=["0:1"])})
    assert check("sharing-parameters-valid", CM_TYPE, cm) == [
        "data[MPS]: sharing.mps cannot be combined with flags.migStrategy 'mixed' "
        "(the device plugin refuses MPS on MIG devices)",
        "data[MPS] sharing.mps.resources[0] (nvidia.com/gpu): MPS cannot share MIG devices",
    ]


def test_mps_nodes_without_mig_pass() -> None:
    ng = node_group_patch("gpu-a30", {labels.DEVICE_GPU_CONFIG: "MPS", labels.MIG_CONFIG: "all-disabled"})
    assert check("sharing-parameters-valid", NODE_GROUP_PATCH_TYPE, ng) == []


def test_mps_nodes_asked_to_carve_mig_instances() -> None:
    ng = node_group_patch("gpu-a30", {labels.DEVICE_GPU_CONFIG: "MPS", labels.MIG_CONFIG: "all-1g.6gb"})
    assert check("sharing-parameters-valid", NODE_GROUP_PATCH_TYPE, ng) == [
        "NodeGroup 'gpu-a30' spec.nodeTemplate.labels: node.deckhouse.io/device-gpu.config=MPS with "
        "nvidia.com/mig.config=all-1g.6gb: MPS cannot share MIG devices"
    ]
    args = ["labels", "--node-label", f"{labels.DEVICE_GPU_CONFIG}=MPS", f"--node-label={labels.MIG_CONFIG}=custom-x"]
    ds = daemonset("labeller-a30", role="gpu-labeller", containers=[container("labeller", args=args)])
    assert check("sharing-parameters-valid", DS_TYPE, ds) == [
        "DaemonSet 'labeller-a30' container 'labeller' --node-label: node.deckhouse.io/device-gpu.config=MPS with "
        "nvidia.com/mig.config=custom-x: MPS cannot share MIG devices"
    ]


# ------------------------------------------------------------------ dra-objects-valid: API versions


def _ns(version: str) -> dict[str, object]:
    return namespace(labels_={"pod-security.kubernetes.io/enforce-version": f"v{version}"})


def test_dra_v1_on_kubernetes_1_34_passes() -> None:
    resources = [(NS_TYPE, _ns("1.34")), (DEVICE_CLASS_TYPE, device_class('device.driver == "gpu.nvidia.com"'))]
    assert check_stack("dra-objects-valid", resources) == []


def test_dra_v1_on_kubernetes_1_33_fails_with_the_version_source() -> None:
    resources = [(NS_TYPE, _ns("1.33")), (DEVICE_CLASS_TYPE, device_class('device.driver == "gpu.nvidia.com"'))]
    assert check_stack("dra-objects-valid", resources) == [(
        "DeviceClass 'gpu.nvidia.com' uses resource.k8s.io/v1, served from Kubernetes 1.34; the cluster is "
        "Kubernetes 1.33 (Namespace 'nvidia-gpu' pod-security.kubernetes.io/enforce-version)",
        "urn:1",
    )]


def test_dra_version_from_the_namespace_annotation() -> None:
    ns = namespace()
    ns["metadata"]["annotations"] = {labels.KUBERNETES_VERSION: "1.33"}
    resources = [(NS_TYPE, ns), (DEVICE_CLASS_TYPE, device_class(NVIDIA))]
    assert check_stack("dra-objects-valid", resources) == [(
        "DeviceClass 'gpu.nvidia.com' uses resource.k8s.io/v1, served from Kubernetes 1.34; the cluster is "
        "Kubernetes 1.33 (Namespace 'nvidia-gpu' gpu.nvidia-gpu.io/kubernetes-version)",
        "urn:1",
    )]


def test_dra_version_from_the_stack_config_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", pulumi_config({"cluster": {"kubernetesVersion": "1.32"}}))
    resources = [(NS_TYPE, _ns("1.34")), ("kubernetes:resource.k8s.io/v1beta2:DeviceClass",
                                          device_class(NVIDIA, api="resource.k8s.io/v1beta2"))]
    assert check_stack("dra-objects-valid", resources) == [(
        "DeviceClass 'gpu.nvidia.com' uses resource.k8s.io/v1beta2, served from Kubernetes 1.33; the cluster is "
        "Kubernetes 1.32 (nvidia-gpu:cluster.kubernetesVersion)",
        "urn:1",
    )]


def test_dra_beta_needs_the_feature_gate_setup() -> None:
    beta = ("kubernetes:resource.k8s.io/v1beta1:DeviceClass", device_class(NVIDIA, api="resource.k8s.io/v1beta1"))
    resources = [(NS_TYPE, _ns("1.32")), beta]
    assert check_stack("dra-objects-valid", resources) == [(
        "DeviceClass 'gpu.nvidia.com' uses resource.k8s.io/v1beta1 on Kubernetes 1.32 (Namespace 'nvidia-gpu' "
        "pod-security.kubernetes.io/enforce-version) without the DynamicResourceAllocation feature gate and "
        "--runtime-config=resource.k8s.io/v1beta1=true (declare them in this policy's featureGates and runtimeConfig)",
        "urn:1",
    )]
    gates = {"featureGates": ["DynamicResourceAllocation"], "runtimeConfig": ["resource.k8s.io/v1beta1"]}
    assert check_stack("dra-objects-valid", resources, gates) == []


# ------------------------------------------------------------------ dra-objects-valid: DeviceClass CEL


def test_device_class_pinning_the_driver_passes() -> None:
    dc = device_class('device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"')
    assert dc_messages(dc) == []


@pytest.mark.parametrize(
    ("expressions", "problem"),
    [
        ((), 'has no CEL selector, so it matches every device of every driver; add device.driver == "gpu.nvidia.com"'),
        (('device.attributes["gpu.nvidia.com"].type == "gpu"',),
         ': no CEL selector tests device.driver; add device.driver == "gpu.nvidia.com"'),
        (('device.driver == "gpu.amd.com"',), "selects driver gpu.amd.com, not gpu.nvidia.com"),
    ],
    ids=["no-selector", "attributes-only", "other-driver"],
)
def test_device_class_without_the_driver(expressions: tuple[str, ...], problem: str) -> None:
    sep = "" if problem.startswith(":") else " "
    assert dc_messages(device_class(*expressions)) == [
        f"DeviceClass 'gpu.nvidia.com'{sep}{problem}"
    ]


def test_device_class_driver_name_from_the_stack_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", pulumi_config({"cluster": {"dra": {"driverName": "gpu.example.com"}}}))
    dc = device_class('device.driver == "gpu.nvidia.com"')
    assert dc_messages(dc) == [
        "DeviceClass 'gpu.nvidia.com' selects driver gpu.nvidia.com, not gpu.example.com"
    ]


# ------------------------------------------------------------------ node-groups-disjoint


def test_groups_on_different_deckhouse_node_groups_pass() -> None:
    a = daemonset("dp-a", group="a", terms=gpu_terms("gpu-a"))
    b = daemonset("dp-b", group="b", terms=gpu_terms("gpu-b"))
    assert check_stack("node-groups-disjoint", [(DS_TYPE, a), (DS_TYPE, b)]) == []


def test_groups_whose_daemonsets_select_the_same_nodes() -> None:
    a = daemonset("dp-a", group="a", terms=gpu_terms("gpu-x"))
    b = daemonset("dp-b", group="b", terms=gpu_terms("gpu-x"))
    assert check_stack("node-groups-disjoint", [(DS_TYPE, a), (DS_TYPE, b)]) == [(
        "node groups 'a' and 'b' can claim the same nodes: DaemonSet 'nvidia-gpu/dp-a' selects "
        "{node.deckhouse.io/group=gpu-x, node.deckhouse.io/gpu-setup-complete Exists}, DaemonSet 'nvidia-gpu/dp-b' "
        "selects {node.deckhouse.io/group=gpu-x, node.deckhouse.io/gpu-setup-complete Exists}",
        "urn:1",
    )]


def test_groups_whose_config_selectors_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", pulumi_config({"nodeGroups": [
        {"name": "a", "nodeSelector": {"matchLabels": {"pool": "gpu"}}},
        {"name": "b", "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In",
                                                              "values": ["gpu", "cpu"]}]}},
        {"name": "c", "nodeSelector": {"matchLabels": {"zone": "z1"}, "matchExpressions": [
            {"key": "pool", "operator": "NotIn", "values": ["gpu", "cpu"]}]}},
    ]}))
    assert check_stack("node-groups-disjoint", []) == [(
        "node groups 'a' and 'b' can claim the same nodes: nvidia-gpu:nodeGroups[a] selects {pool=gpu}, "
        "nvidia-gpu:nodeGroups[b] selects {pool In (cpu, gpu)}",
        None,
    )]


# ------------------------------------------------------------------ gpu-daemonset-scheduling


def test_gpu_daemonset_tolerating_the_taint_passes() -> None:
    assert check("gpu-daemonset-scheduling", DS_TYPE, daemonset()) == []
    exact = daemonset(tolerations=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    assert check("gpu-daemonset-scheduling", DS_TYPE, exact) == []


def test_gpu_daemonset_without_the_toleration() -> None:
    ds = daemonset(tolerations=[{"key": "nvidia.com/gpu", "value": "other", "effect": "NoSchedule"}])
    assert check("gpu-daemonset-scheduling", DS_TYPE, ds) == [
        "DaemonSet 'device-plugin-h100' does not tolerate the GPU taint nvidia.com/gpu=present:NoSchedule"
    ]


def test_non_gpu_daemonsets_are_not_judged() -> None:
    ds = daemonset("log-shipper", role="logs", group=None, terms=[], tolerations=[])
    assert check("gpu-daemonset-scheduling", DS_TYPE, ds) == []
    assert check("gpu-daemonset-scheduling", DS_TYPE, ds) == []


def test_gpu_daemonset_gated_on_setup_complete_passes() -> None:
    assert check("gpu-daemonset-scheduling", DS_TYPE, daemonset()) == []


def test_gpu_daemonset_without_the_setup_gate() -> None:
    ds = daemonset(terms=gpu_terms("h100", gate=False))
    assert check("gpu-daemonset-scheduling", DS_TYPE, ds) == [
        "DaemonSet 'device-plugin-h100' does not wait for node setup: every node selector term must require "
        "node.deckhouse.io/gpu-setup-complete (it selects {node.deckhouse.io/group=h100})"
    ]


def test_setup_role_is_exempt_from_the_gate_and_configurable() -> None:
    setup = daemonset("gpu-setup-h100", role="gpu-setup", terms=gpu_terms("h100", gate=False))
    assert check("gpu-daemonset-scheduling", DS_TYPE, setup) == []
    assert len(check("gpu-daemonset-scheduling", DS_TYPE, setup, {"setupRoles": []})) == 1


# ------------------------------------------------------------------ driver-meets-gpu-minimum


def test_driver_at_the_minimum_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", pulumi_config({"nodeGroups": [
        {"name": "h100", "gpu": {"model": "H100-80GB", "driverVersion": "525.60.13", "sharing": "MIG"}}]}))
    assert check_stack("driver-meets-gpu-minimum", []) == []


def test_driver_below_the_model_minimum_in_the_stack_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", pulumi_config({"nodeGroups": [
        {"name": "h200", "gpu": {"model": "H200-141GB", "driverVersion": "535.104.05"}}]}))
    assert check_stack("driver-meets-gpu-minimum", []) == [(
        "nvidia-gpu:nodeGroups[h200].gpu.driverVersion: driver 535.104.05 is below the H200-141GB minimum 550.54.14",
        None,
    )]


def test_driver_declared_on_an_object() -> None:
    ds = daemonset()
    ds["metadata"]["annotations"] = {GPU_MODEL_KEY: "H100-80GB", "gpu.nvidia-gpu.io/driver-version": "470.82.01"}
    assert check_stack("driver-meets-gpu-minimum", [(DS_TYPE, ds)]) == [(
        "DaemonSet 'nvidia-gpu/device-plugin-h100' gpu.nvidia-gpu.io/driver-version: driver 470.82.01 is below "
        "the H100-80GB minimum 525.60.13",
        "urn:0",
    )]
