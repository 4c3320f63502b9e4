"""Stack config validation: bad inputs fail before anything is registered, with messages naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from nvgpu.stackconfig import (
    AllocationMode,
    NodeSetupBackend,
    Sharing,
    StackConfig,
    StackConfigError,
    load_stack_config,
    load_stack_file,
)
from nvgpu.version import VERSION

ROOT = Path(__file__).resolve().parents[3]
VALID: dict[str, Any] = {
    "cluster": {
        "kubernetesVersion": "1.34",
        "nodeSetup": "deckhouse",
        "agentImage": {"repository": "registry.example.com/agent", "tag": "0.1.0"},
    },
    "nodeGroups": [
        {"name": "l4", "nodeGroup": "gpu-l4", "gpu": {"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4}}}
    ],
}


def _problems(mutate: Any) -> list[str]:
    values = copy.deepcopy(VALID)
    mutate(values)
    with pytest.raises(StackConfigError) as err:
        load_stack_config(values)
    return err.value.problems


def test_valid_config_and_defaults() -> None:
    cfg = load_stack_config(VALID)
    assert cfg.cluster.namespace == "nvidia-gpu"
    assert cfg.cluster.allocation_mode is AllocationMode.DEVICE_PLUGIN
    assert cfg.cluster.node_setup is NodeSetupBackend.DECKHOUSE
    assert cfg.node_groups[0].gpu_taint is True
    assert cfg.node_groups[0].gpu.replicas == 4


def test_typoed_key_names_the_path_and_the_allowed_keys() -> None:
    problems = _problems(lambda v: v["nodeGroups"][0]["gpu"].update(sharng="MIG"))
    assert len(problems) == 1
    assert problems[0].startswith("nvidia-gpu:nodeGroups[0].gpu.sharng: unknown key")
    assert "sharing" in problems[0] and "timeSlicing" in problems[0]


def test_typoed_top_level_key() -> None:
    problems = _problems(lambda v: v.update(nodeGroup=[]))
    assert problems == ["nvidia-gpu:nodeGroup: unknown key (did you mean 'nodeGroups'?); allowed keys: cluster, "
                        "nodeGroups"]


def test_unknown_sharing_mode_lists_the_allowed_modes() -> None:
    problems = _problems(lambda v: v["nodeGroups"][0]["gpu"].update(sharing="Fractional", timeSlicing=None))
    (problem,) = problems
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.sharing:")
    assert "'Fractional'" in problem
    for mode in Sharing:
        assert mode.value in problem


@pytest.mark.parametrize("count", [0, 1, 101])
def test_partition_count_out_of_range_names_the_field(count: int) -> None:
    problems = _problems(lambda v: v["nodeGroups"][0]["gpu"]["timeSlicing"].update(partitionCount=count))
    (problem,) = problems
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.timeSlicing.partitionCount:")
    assert f"(got {count})" in problem


def test_several_problems_are_all_reported() -> None:
    def mutate(v: dict[str, Any]) -> None:
        v["cluster"]["kubernetesVersion"] = "1.20"
        v["nodeGroups"][0]["gpu"]["sharing"] = "MIGGY"

    problems = _problems(mutate)
    assert any(p.startswith("nvidia-gpu:cluster.kubernetesVersion:") for p in problems)
    assert any(p.startswith("nvidia-gpu:nodeGroups[0].gpu.sharing:") for p in problems)


def test_deckhouse_backend_requires_deckhouse_node_groups() -> None:
    def mutate(v: dict[str, Any]) -> None:
        del v["nodeGroups"][0]["nodeGroup"]
        v["nodeGroups"][0]["nodeSelector"] = {"matchLabels": {"a": "b"}}

    (problem,) = _problems(mutate)
    assert problem.startswith("nvidia-gpu:nodeGroups[0].nodeGroup: required with cluster.nodeSetup 'deckhouse'")


def test_kube_context_is_optional() -> None:
    values = copy.deepcopy(VALID)
    values["cluster"]["kubeContext"] = "dev"
    assert load_stack_config(values).cluster.kube_context == "dev"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_shipped_stacks_are_valid(stack: str) -> None:
    cfg = load_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    assert len(cfg.node_groups) >= 3


def test_dev_stack_is_a_deckhouse_cluster_with_mig_timeslicing_and_exclusive_groups() -> None:
    cfg = load_stack_file(ROOT / "Pulumi.dev.yaml")
    assert cfg.cluster.node_setup is NodeSetupBackend.DECKHOUSE
    assert cfg.cluster.kubernetes_version == "1.34"
    assert {Sharing.MIG, Sharing.TIME_SLICING, Sharing.EXCLUSIVE} <= {g.gpu.sharing for g in cfg.node_groups}


def test_prod_stack_is_generic_with_the_release_image() -> None:
    """The release's tag; its digest is written by the release once the image is published (tools/release.py
    pin, tested in tests/repo/test_release.py), never made up before."""
    cfg = load_stack_file(ROOT / "Pulumi.prod.yaml")
    assert cfg.cluster.node_setup is NodeSetupBackend.DAEMONSET
    assert cfg.cluster.agent_image.tag == VERSION
    assert all(g.node_selector is not None for g in cfg.node_groups)


def _key_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{info.alias or name}"
        paths.append(path)
        annotation = info.annotation
        is_list = get_origin(annotation) is list
        for sub in _models_in(annotation):
            paths += _key_paths(sub, f"{path}{'[]' if is_list else ''}.")
    return paths


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def test_the_config_reference_covers_every_key() -> None:
    """docs/reference/stack-config.md (generated from these models) names every key."""
    readme = (ROOT / "docs" / "reference" / "stack-config.md").read_text()
    paths = _key_paths(StackConfig)
    # Objects are documented through their keys; lists of objects get a row of their own too.
    leaves = [p for p in paths if not any(q.startswith((f"{p}.", f"{p}[].")) for q in paths)]
    lists = [p for p in paths if any(q.startswith(f"{p}[].") for q in paths) and p != "nodeGroups"]
    missing = [p for p in leaves + lists if f"`{p}`" not in readme]
    assert missing == [], f"docs/reference/stack-config.md lacks: {missing}"


def test_runtime_class_defaults_and_switch() -> None:
    rc = load_stack_config(VALID).cluster.runtime_class
    assert rc.create is True and rc.name == "nvidia"
    values = copy.deepcopy(VALID)
    values["cluster"]["runtimeClass"] = {"create": False, "name": "gpu.example.com"}
    rc = load_stack_config(values).cluster.runtime_class
    assert rc.create is False and rc.name == "gpu.example.com"


@pytest.mark.parametrize(
    ("runtime_class", "path", "message"),
    [
        ({"name": "Nvidia"}, "cluster.runtimeClass.name", "'Nvidia' is not a valid object name: at most 253"),
        ({"name": "nvidia_gpu"}, "cluster.runtimeClass.name", "is not a valid object name"),
        ({"name": ""}, "cluster.runtimeClass.name", "'' is not a valid object name"),
        ({"name": "a" * 254}, "cluster.runtimeClass.name", "is not a valid object name"),
        ({"create": "maybe"}, "cluster.runtimeClass.create", "must be a boolean, not a string"),
        ({"handler": "runc"}, "cluster.runtimeClass.handler", "unknown key; allowed keys: create, name"),
    ],
)
def test_bad_runtime_class_settings_name_the_key(runtime_class: dict[str, Any], path: str, message: str) -> None:
    problems = _problems(lambda v: v["cluster"].update(runtimeClass=runtime_class))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"nvidia-gpu:{path}: "), problems
    assert message in problems[0], problems


# Found by the server dry-run: these passed the schemas and the config, and the real API server refused
# every DaemonSet of the group (tolerations / node affinity break Kubernetes' name rules).
BAD_KUBERNETES_NAMES: list[tuple[str, Any, str]] = [
    ("nodeGroups[0].extraTaints[0].key", {"extraTaints": [{"key": "dedicated for ml", "effect": "NoSchedule"}]},
     "'dedicated for ml' is not a valid key"),
    ("nodeGroups[0].extraTaints[0].value", {"extraTaints": [{"key": "a", "value": "t" * 64, "effect": "NoSchedule"}]},
     "is not a valid label value"),
    ("nodeGroups[0].extraTaints[0].key", {"extraTaints": [{"key": "Bad_Prefix/x", "effect": "NoSchedule"}]},
     "the prefix 'Bad_Prefix' must be a DNS subdomain"),
    ("nodeGroups[0].nodeSelector.matchLabels", {"nodeGroup": None, "nodeSelector": {"matchLabels": {"bad key!": "x"}}},
     "'bad key!' is not a valid key"),
    ("nodeGroups[0].nodeSelector.matchLabels", {"nodeGroup": None, "nodeSelector": {"matchLabels": {"a": "p5 48x"}}},
     "'p5 48x' is not a valid label value"),
    ("nodeGroups[0].nodeSelector.matchExpressions[0].values[0]",
     {"nodeGroup": None,
      "nodeSelector": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["eu west"]}]}},
     "'eu west' is not a valid label value"),
]


@pytest.mark.parametrize(("path", "group", "message"), BAD_KUBERNETES_NAMES, ids=[c[0] for c in BAD_KUBERNETES_NAMES])
def test_keys_and_values_the_api_server_refuses_are_config_errors(path: str, group: Any, message: str) -> None:
    def mutate(v: dict[str, Any]) -> None:
        v["cluster"]["nodeSetup"] = "daemonset"
        v["nodeGroups"][0].update(group)
        if v["nodeGroups"][0].get("nodeGroup") is None:
            v["nodeGroups"][0].pop("nodeGroup", None)

    problems = _problems(mutate)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"nvidia-gpu:{path}"), problems
    assert message in problems[0]


@pytest.mark.parametrize("key", ["dedicated", "node.kubernetes.io/instance-type", "example.com/a_b.c-d", "A1", "x"])
def test_valid_kubernetes_keys_are_accepted(key: str) -> None:
    values = copy.deepcopy(VALID)
    values["nodeGroups"][0]["extraTaints"] = [{"key": key, "value": "v1.2_3-x", "effect": "NoSchedule"}]
    load_stack_config(values)


# --- MIG layouts: checked here (nvgpu.stackconfig.mig_layout_problems on nvgpu.migparted.fit_problems) ---


def _mig_problem(gpu: dict[str, Any]) -> str:
    def mutate(v: dict[str, Any]) -> None:
        v["nodeGroups"][0] = {"name": "h100", "nodeGroup": "gpu-h100", "gpu": gpu}

    (problem,) = _problems(mutate)
    return problem


def _custom(slices: list[dict[str, Any]], model: str | None = "H100-80GB") -> dict[str, Any]:
    gpu: dict[str, Any] = {"sharing": "MIG", "mig": {"partedConfig": "custom", "customConfigs": [
        {"index": 0, "slices": [{"profile": "7g.80gb"}]}, {"index": 1, "slices": slices}]}}
    return {**gpu, "model": model} if model else gpu


def test_mig_needs_a_mig_capable_model() -> None:
    assert _mig_problem({"sharing": "MIG", "model": "L4"}) == (
        "nvidia-gpu:nodeGroups[0].gpu.sharing: MIG needs a MIG-capable GPU and L4 is not one (A100-40GB, "
        "A100-80GB, H100-80GB, H200-141GB, A30-24GB, H100-94GB, H100-96GB, GH200-96GB, H20, GH200-144GB, B200, "
        "GB200, B300, GB300, RTX-PRO-6000 are)")


def test_a_profile_set_of_another_model_names_the_allowed_profiles() -> None:
    problem = _mig_problem({"sharing": "MIG", "model": "H100-80GB", "mig": {"partedConfig": "all-1g.5gb"}})
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.mig.partedConfig: MIG config 'all-1g.5gb' has no entry "
                              "for the H100-80GB (profile '1g.5gb' is unknown for H100-80GB; allowed: 1g.10gb, ")


@pytest.mark.parametrize(
    ("slices", "why"),
    [
        ([{"profile": "1g.5gb"}], "profile '1g.5gb' is unknown for H100-80GB; allowed: 1g.10gb, "),
        ([{"profile": "2g.20gb", "count": 4}], "4 x 2g.20gb exceeds the 3 instance(s) a H100-80GB can hold"),
        ([{"profile": "4g.40gb"}, {"profile": "3g.40gb"}, {"profile": "1g.10gb"}],
         "layout needs 8 compute slices but the H100-80GB has 7"),
        ([{"profile": "1g.20gb", "count": 4}, {"profile": "1g.10gb"}],
         "layout needs 9 memory slices but the H100-80GB has 8"),
        ([{"profile": "1g.10gb+me"}, {"profile": "1g.10gb.me"}],
         "2 x 1g.10gb+me exceeds the 1 instance(s)"),
    ],
)
def test_unplaceable_custom_layouts_name_group_config_gpu_profile_and_why(slices: list[dict[str, Any]],
                                                                          why: str) -> None:
    problem = _mig_problem(_custom(slices))
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.mig.customConfigs: MIG config 'custom-h100-")
    assert f": GPU 1: {why}" in problem


def test_a_misspelt_custom_profile_names_the_gpu() -> None:
    problem = _mig_problem(_custom([{"profile": "1g10gb"}]))
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.mig.customConfigs: GPU 1: ")
    assert "'1g10gb' is not a MIG profile name" in problem


def test_without_a_model_the_layout_must_fit_some_catalogue_gpu() -> None:
    assert _mig_problem(_custom([{"profile": "1g.11gb"}], model=None)).endswith(
        "profile '1g.11gb' is not a MIG profile of any catalogue GPU")
    assert _mig_problem(_custom([{"profile": "3g.40gb", "count": 3}], model=None)).endswith(
        "fits none of the catalogue's GPU models")
    values = copy.deepcopy(VALID)
    values["nodeGroups"][0] = {"name": "any", "nodeGroup": "gpu-any", "gpu": _custom([{"profile": "3g.40gb"}], None)}
    assert load_stack_config(values).node_groups[0].gpu.sharing is Sharing.MIG


@pytest.mark.parametrize("parted", ["all-balanced", "all-1g.10gb", "all-1g.10gb.me", "all-7g.80gb", "all-disabled"])
def test_layouts_that_fit_parse(parted: str) -> None:
    values = copy.deepcopy(VALID)
    values["nodeGroups"][0] = {"name": "h100", "nodeGroup": "gpu-h100",
                               "gpu": {"sharing": "MIG", "model": "H100-80GB", "mig": {"partedConfig": parted}}}
    assert load_stack_config(values).node_groups[0].mig_config_name == parted
