"""Stack configs that every schema accepts and that break a cluster or silently do nothing once applied.

Each is refused when the config is read, with the path of the field to change (never the empty
``nvidia-gpu:`` path of a check over the whole config), the value, and what would happen.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from nvgpu.stackconfig import StackConfigError, load_stack_config, load_stack_file

BASE: dict[str, Any] = {
    "cluster": {"kubernetesVersion": "1.34",
                "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.4.0"}},
    "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
                    "gpu": {"model": "H100-80GB"}}],
}


def _config(**changes: Any) -> dict[str, Any]:
    """BASE with ``cluster``/``group``/``gpu`` keys merged into the cluster, the first group, its gpu."""
    values = copy.deepcopy(BASE)
    values["cluster"].update(changes.pop("cluster", {}))
    group = values["nodeGroups"][0]
    group["gpu"].update(changes.pop("gpu", {}))
    group.update(changes.pop("group", {}))
    assert not changes, changes
    return values


def _problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(StackConfigError) as caught:
        load_stack_config(values)
    problems = caught.value.problems
    for p in problems:  # every problem names a field: "nvidia-gpu:<path>: <why>"
        path, _, why = p.partition(": ")
        assert path.startswith("nvidia-gpu:") and path != "nvidia-gpu:" and why, p
    return problems


def _one(values: dict[str, Any]) -> str:
    problems = _problems(values)
    assert len(problems) == 1, problems
    return problems[0]


# --- YAML's own readings -------------------------------------------------------------------------------------


def test_an_unquoted_kubernetes_version_read_as_a_number_gets_the_quoting_hint(tmp_path: Any) -> None:
    text = yaml.safe_dump({"config": {"nvidia-gpu:cluster": {**BASE["cluster"], "kubernetesVersion": "X"},
                                      "nvidia-gpu:nodeGroups": BASE["nodeGroups"]}}).replace(": X\n", ": 1.30\n")
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text(text)
    assert "kubernetesVersion: 1.30" in text
    with pytest.raises(StackConfigError) as caught:
        load_stack_file(stack)
    assert caught.value.problems == [
        'nvidia-gpu:cluster.kubernetesVersion: must be a quoted string: YAML reads an unquoted version as a number '
        '(1.30 becomes 1.3); write kubernetesVersion: "1.30" (got 1.3)']


def test_a_number_that_is_also_a_version_is_still_asked_to_be_quoted() -> None:
    assert _one(_config(cluster={"kubernetesVersion": 1.34})).startswith(
        'nvidia-gpu:cluster.kubernetesVersion: must be a quoted string: YAML reads an unquoted version as a number; '
        'write kubernetesVersion: "1.34"')


@pytest.mark.parametrize(("changes", "path"), [
    ({"group": {"gpuTaint": "false"}}, "nodeGroups[0].gpuTaint"),
    ({"group": {"passthrough": "no"}}, "nodeGroups[0].passthrough"),
    ({"cluster": {"monitoring": {"enabled": "true"}}}, "cluster.monitoring.enabled"),
    ({"cluster": {"runtimeClass": {"create": "off"}}}, "cluster.runtimeClass.create"),
    ({"cluster": {"mig": {"allowReboot": "yes"}}}, "cluster.mig.allowReboot"),
    ({"cluster": {"dra": {"createDeviceClasses": "false"}}}, "cluster.dra.createDeviceClasses"),
])
def test_booleans_given_as_strings_are_refused(changes: dict[str, Any], path: str) -> None:
    """A quoted ``"false"`` is a string, and pydantic's lax mode would read it (and ``"no"``, ``"off"``) as a
    boolean: the stack would do what the user meant while a policy or another reader sees a truthy string."""
    problem = _one(_config(**changes))
    assert problem.startswith(f"nvidia-gpu:{path}: must be a boolean, not a string: write true or false "
                              "without quotes (got "), problem


def test_numbers_are_not_booleans_either() -> None:
    assert _one(_config(group={"gpuTaint": 0})) == (
        "nvidia-gpu:nodeGroups[0].gpuTaint: must be a boolean: true or false (got 0)")


def test_real_booleans_pass() -> None:
    cfg = load_stack_config(_config(group={"gpuTaint": False}, cluster={"monitoring": {"enabled": False}}))
    assert cfg.node_groups[0].gpu_taint is False and cfg.cluster.monitoring.enabled is False


def test_an_empty_kube_context_is_refused() -> None:
    assert _one(_config(cluster={"kubeContext": " "})) == (
        "nvidia-gpu:cluster.kubeContext: must not be empty: leave kubeContext out to use the kubeconfig's current "
        "context (got ' ')")


# --- taints ------------------------------------------------------------------------------------------------


def _taints(*taints: dict[str, str], gpu_taint: bool = True) -> dict[str, Any]:
    return _config(group={"extraTaints": list(taints), "gpuTaint": gpu_taint})


def test_the_gpu_taint_key_in_extra_taints_conflicts_with_gpu_taint() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "h100", "effect": "NoSchedule"}
    assert _one(_taints(taint)) == (
        "nvidia-gpu:nodeGroups[0].extraTaints[0].key: nvidia.com/gpu is the GPU taint's key and gpuTaint is on, so "
        "this taint would be replaced by the GPU taint; drop it, or set gpuTaint: false")
    assert load_stack_config(_taints(taint, gpu_taint=False)).node_groups[0].extra_taints[0].value == "h100"


def test_two_taints_with_one_key_and_effect_are_refused_as_the_api_server_would() -> None:
    a = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    b = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    assert _one(_taints(a, b)) == (
        "nvidia-gpu:nodeGroups[0].extraTaints[1].key: dedicated:NoSchedule is also extraTaints[0]; the API server "
        "refuses two taints with one key and effect")
    load_stack_config(_taints(a, {**b, "effect": "NoExecute"}))  # another effect is another taint


@pytest.mark.parametrize(("key", "why"), [
    ("node.kubernetes.io/unreachable", "a taint Kubernetes' node controllers set and remove by themselves"),
    ("node.kubernetes.io/out-of-service", "a taint Kubernetes' node controllers set and remove by themselves"),
    ("node.cloudprovider.kubernetes.io/uninitialized", "a taint Kubernetes' node controllers set"),
    ("mig-reconfigure", "the MIG manager's own taint"),
    ("gpu.nvidia-gpu.io/driver-upgrade", "the driver upgrade's own taint"),
])
def test_taints_owned_by_someone_else_are_refused(key: str, why: str) -> None:
    problem = _one(_taints({"key": key, "effect": "NoSchedule"}))
    assert problem.startswith(f"nvidia-gpu:nodeGroups[0].extraTaints[0].key: {key} ") and why in problem, problem


# --- node selectors that never match -------------------------------------------------------------------------


def _selector(**selector: Any) -> dict[str, Any]:
    return _config(group={"nodeSelector": selector})


@pytest.mark.parametrize(("selector", "path"), [
    ({"matchLabels": {"nvidia.com/gpu.present": "true"}}, "matchLabels.nvidia.com/gpu.present"),
    ({"matchLabels": {"gpu.nvidia-gpu.io/node-group": "h100"}}, "matchLabels.gpu.nvidia-gpu.io/node-group"),
    ({"matchLabels": {"node.deckhouse.io/gpu-setup-complete": ""}}, "matchLabels.node.deckhouse.io/gpu-setup-complete"),
    ({"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "Exists"}]}, "matchExpressions[0].key"),
])
def test_selecting_on_a_label_the_agents_write_is_refused(selector: dict[str, Any], path: str) -> None:
    problem = _one(_selector(**selector))
    assert problem.startswith(f"nvidia-gpu:nodeGroups[0].nodeSelector.{path}: "), problem
    assert "would never match a new node" in problem


def test_excluding_nodes_by_an_agent_label_is_fine() -> None:
    load_stack_config(_selector(matchLabels={"pool": "h100"}, matchExpressions=[
        {"key": "nvidia.com/mig.config.state", "operator": "NotIn", "values": ["failed"]}]))


@pytest.mark.parametrize(("selector", "why"), [
    ({"matchLabels": {"pool": "h100"}, "matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100"]}]},
     "pool In ['a100'] contradicts matchLabels pool='h100': no node matches both"),
    ({"matchLabels": {"pool": "h100"}, "matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["h100"]}]},
     "pool NotIn ['h100'] contradicts matchLabels pool='h100'"),
    ({"matchLabels": {"pool": "h100"}, "matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]},
     "pool DoesNotExist contradicts matchLabels pool='h100'"),
    ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                           {"key": "zone", "operator": "In", "values": ["b"]}]},
     "zone In contradicts matchExpressions[0] (zone In): no node matches both"),
    ({"matchExpressions": [{"key": "zone", "operator": "Exists"}, {"key": "zone", "operator": "DoesNotExist"}]},
     "zone DoesNotExist contradicts matchExpressions[0] (zone Exists)"),
])
def test_contradicting_requirements_are_refused(selector: dict[str, Any], why: str) -> None:
    problem = _one(_selector(**selector))
    assert problem.startswith("nvidia-gpu:nodeGroups[0].nodeSelector.matchExpressions["), problem
    assert why in problem, problem


# --- MIG ----------------------------------------------------------------------------------------------------


def test_the_single_strategy_with_a_mixed_layout_is_refused_at_the_strategy() -> None:
    problem = _one(_config(gpu={"sharing": "MIG", "mig": {"partedConfig": "all-balanced", "strategy": "single"}}))
    assert problem == (
        "nvidia-gpu:nodeGroups[0].gpu.mig.strategy: 'single' exposes every MIG device as nvidia.com/gpu, so the "
        "GPUs must all carry one profile; partedConfig 'all-balanced' mixes 1g.10gb, 2g.20gb, 3g.40gb: use "
        "strategy 'mixed' (nvidia.com/mig-<profile> resources) or an all-<profile> config")


def test_the_single_strategy_with_a_mixed_custom_layout_is_refused() -> None:
    mig = {"partedConfig": "custom", "strategy": "single", "customConfigs": [
        {"index": 0, "slices": [{"profile": "7g.80gb"}]}, {"index": 1, "slices": [{"profile": "1g.10gb", "count": 7}]}]}
    problem = _one(_config(gpu={"sharing": "MIG", "mig": mig}))
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.mig.strategy: ") and "mixes 1g.10gb, 7g.80gb" in problem


def test_the_single_strategy_with_one_profile_passes() -> None:
    mig = {"partedConfig": "all-3g.40gb", "strategy": "single"}
    cfg = load_stack_config(_config(gpu={"sharing": "MIG", "mig": mig}))
    assert cfg.node_groups[0].mig_config_name == "all-3g.40gb"


def test_a_layout_problem_points_at_parted_config() -> None:
    problem = _one(_config(gpu={"sharing": "MIG", "mig": {"partedConfig": "all-1g.6gb"}}))
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.mig.partedConfig: MIG config 'all-1g.6gb' "), problem


def test_a_driver_below_the_mig_minimum_names_driver_version() -> None:
    problem = _one(_config(gpu={"sharing": "MIG", "driverVersion": "450.80.02", "model": "H100-80GB"}))
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.driverVersion: 450.80.02 is below "), problem


# --- DRA ----------------------------------------------------------------------------------------------------


def test_a_renamed_driver_with_the_clusters_own_device_classes_is_refused() -> None:
    """The classes NVIDIA's driver installed select ``device.driver == 'gpu.nvidia.com'``: a renamed driver's
    devices would be published and never allocated."""
    values = _config(cluster={"allocationMode": "dra",
                              "dra": {"driverName": "gpu.example.com", "createDeviceClasses": False}})
    problem = _one(values)
    assert problem.startswith("nvidia-gpu:cluster.dra.driverName: 'gpu.example.com' with createDeviceClasses false: "
                              "the cluster's existing DeviceClasses (gpu.nvidia.com, mig.nvidia.com, "
                              "vfio.gpu.nvidia.com) select devices of driver 'gpu.nvidia.com'"), problem
    values["cluster"]["dra"]["createDeviceClasses"] = True  # the stack's classes select the renamed driver
    load_stack_config(values)


def test_quotas_without_a_dra_group_name_the_quotas() -> None:
    values = _config(cluster={"dra": {"claimQuotas": [{"namespace": "team-a", "claims": 2}]}})
    assert _one(values).startswith("nvidia-gpu:cluster.dra.claimQuotas: set, but no node group uses allocationMode "
                                   "'dra'")


# --- names and patterns said in words ---------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "expected"), [
    ({"cluster": {"namespace": "GPU_Operator"}},
     "nvidia-gpu:cluster.namespace: 'GPU_Operator' is not a lowercase DNS label: at most 63 characters: lowercase "
     "letters, digits or '-', starting and ending with a letter or digit (no dots) (got 'GPU_Operator')"),
    ({"group": {"name": "h100.train"}}, "nvidia-gpu:nodeGroups[0].name: 'h100.train' is not a lowercase DNS label"),
    ({"group": {"name": "a" * 33}}, "nvidia-gpu:nodeGroups[0].name: '" + "a" * 33 + "' is 33 characters; at most 32"),
    ({"cluster": {"agentImage": {"repository": "Registry/Agent", "tag": "1"}}},
     "nvidia-gpu:cluster.agentImage.repository: must be an image repository without tag or digest"),
    ({"cluster": {"agentImage": {"repository": "r.example/agent", "tag": "-1"}}},
     "nvidia-gpu:cluster.agentImage.tag: must be an image tag"),
    ({"cluster": {"agentImage": {"repository": "r.example/agent", "digest": "sha256:abc"}}},
     "nvidia-gpu:cluster.agentImage.digest: must be an image digest: 'sha256:' and 64 lowercase hexadecimal digits"),
    ({"cluster": {"agentImage": {"repository": "r.example/agent"}}},
     "nvidia-gpu:cluster.agentImage.tag: set tag or digest: an unpinned image is not allowed"),
    ({"cluster": {"dra": {"driverName": "nvidia"}}}, "nvidia-gpu:cluster.dra.driverName: must be a DNS subdomain with "
                                                     "at least one dot"),
])
def test_pattern_errors_say_what_is_meant(changes: dict[str, Any], expected: str) -> None:
    problem = _one(_config(**changes))
    assert problem.startswith(expected), problem
    assert "should match pattern" not in problem and "^" not in problem, problem


def test_every_cross_field_problem_names_its_field() -> None:
    """Several checks over the whole config at once: each problem carries its own path."""
    values = _config(cluster={"kubernetesVersion": "1.33", "allocationMode": "dra", "nodeSetup": "deckhouse",
                              "dra": {"healthAction": "taint"}})
    values["nodeGroups"].append(copy.deepcopy(values["nodeGroups"][0]))
    problems = _problems(values)
    paths = sorted(p.partition(": ")[0] for p in problems)
    assert paths == ["nvidia-gpu:cluster.allocationMode", "nvidia-gpu:cluster.allocationMode",
                     "nvidia-gpu:cluster.dra.healthAction", "nvidia-gpu:nodeGroups[0].nodeGroup",
                     "nvidia-gpu:nodeGroups[1].name", "nvidia-gpu:nodeGroups[1].nodeGroup"], problems
