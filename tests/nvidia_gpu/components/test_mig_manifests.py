"""The MIG manager's manifests (``components/manifests/mig.py``): the mig-parted ConfigMap and the
layout checks :func:`mig_config` runs on it, the manager DaemonSet and its RBAC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node_agent.cli import build_parser
from nvgpu import labels
from nvgpu.catalogue import H100_80GB
from nvgpu.migparted import MigConfigSpec, load_config_text, validate_for_model
from nvgpu.nodelabels import desired_node_labels
from nvgpu.stackconfig import GroupPlan, Sharing, load_stack_file
from nvidia_gpu.components.manifests.mig import (
    CONFIG_KEY,
    MigProfileError,
    config_map,
    daemonset,
    mig_config,
    rbac,
)
from tests.nvidia_gpu.components.component_helpers import H100_CUSTOM, MIG_STACK_GROUPS, stack_config, with_first_slice


def test_config_holds_standard_sets_and_group_layouts() -> None:
    cfg = stack_config(MIG_STACK_GROUPS)
    mig = mig_config(cfg.node_groups)
    h100 = cfg.node_groups[0]
    name = GroupPlan.of(cfg.cluster, h100).mig_config_name
    assert name.startswith("custom-h100-")
    assert [layout for _, layout in validate_for_model(mig, name, H100_80GB)] == [
        {"3g.40gb": 1, "1g.10gb": 4}, {"7g.80gb": 1}]
    assert mig.mig_configs[name][0].devices == [0] and mig.mig_configs[name][0].device_filter
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.5gb", "all-7g.141gb"} <= set(mig.mig_configs)
    # The ConfigMap carries exactly this config, in mig-parted's own format.
    cm = config_map("nvidia-gpu", mig)
    assert load_config_text(cm["data"][CONFIG_KEY]) == mig


def _mig_group(**mig: Any) -> dict[str, Any]:
    return {"name": "g", "nodeGroup": "ng-g", "gpu": {"sharing": "MIG", "model": "H100-80GB", "mig": mig}}


def test_extra_configs_are_validated_against_the_declared_model() -> None:
    groups = stack_config([_mig_group(partedConfig="all-balanced")]).node_groups
    ok = {"ops-mixed": [MigConfigSpec(device_filter="0x233010DE", devices="all", mig_enabled=True,
                                      mig_devices={"4g.40gb": 1, "3g.40gb": 1})]}
    assert "ops-mixed" in mig_config(groups, ok).mig_configs
    # A group selecting an extra config that does not fit its model fails at preview time.
    bad = {"all-4g": [MigConfigSpec(devices=[2], mig_enabled=True, mig_devices={"4g.40gb": 2})]}
    g = groups[0].model_copy(update={"gpu": groups[0].gpu.model_copy(
        update={"mig": groups[0].gpu.effective_mig.model_copy(update={"parted_config": "all-4g"})})})
    with pytest.raises(MigProfileError) as e:
        mig_config([g], bad)
    message = str(e.value)
    assert "node group 'g'" in message and "GPU 2" in message and "4g.40gb" in message
    assert "exceeds the 1 instance(s) a H100-80GB can hold" in message


def test_a_layout_named_for_another_model_fails() -> None:
    groups = stack_config([_mig_group(partedConfig="all-balanced")]).node_groups
    g = groups[0].model_copy(update={"gpu": groups[0].gpu.model_copy(
        update={"mig": groups[0].gpu.effective_mig.model_copy(update={"parted_config": "all-1g.5gb"})})})
    with pytest.raises(MigProfileError, match="has no entry for the H100-80GB"):
        mig_config([g])


@pytest.mark.parametrize(
    ("profile", "count", "why"),
    [("1g.5gb", 1, "profile '1g.5gb' is unknown for H100-80GB"),
     ("2g.20gb", 4, "4 x 2g.20gb exceeds the 3 instance(s)"),
     ("3g.40gb", 3, "exceeds the 2 instance(s)")],
)
def test_unplaceable_custom_layouts_name_gpu_profile_and_why(profile: str, count: int, why: str) -> None:
    group = with_first_slice(stack_config([H100_CUSTOM]).node_groups[0], profile, count)
    with pytest.raises(MigProfileError) as e:
        mig_config([group])
    assert "node group 'h100'" in str(e.value) and "GPU 0" in str(e.value) and why in str(e.value)


def test_a_misspelt_custom_profile_passed_past_the_stack_config_names_the_group() -> None:
    group = with_first_slice(stack_config([H100_CUSTOM]).node_groups[0], "3g40gb", 1)
    with pytest.raises(MigProfileError) as e:
        mig_config([group])
    (problem,) = e.value.problems
    assert problem.startswith("node group 'h100': GPU 0: ") and "'3g40gb' is not a MIG profile name" in problem


def test_daemonset_targets_mig_capable_groups_with_a_mig_label() -> None:
    cfg = stack_config(MIG_STACK_GROUPS)
    groups = [g for g in cfg.node_groups if g.name != "l4"]
    ds = daemonset("nvidia-gpu", cfg.cluster, groups)
    spec = ds["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["ng-h100"], ["ng-a100"], ["ng-any"]]
    for t in terms:
        assert {"key": labels.GPU_SETUP_COMPLETE, "operator": "Exists"} in t["matchExpressions"]
        assert {"key": labels.MIG_CONFIG, "operator": "Exists"} in t["matchExpressions"]
    assert {"key": "mig-reconfigure", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (c,) = spec["containers"]
    assert c["args"][-2:] == ["--drain", "deckhouse"]
    assert c["lifecycle"]["preStop"]["exec"]["command"][-3:] == ["--pre-stop", "--timeout", "100"]
    assert spec["terminationGracePeriodSeconds"] > 100
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "mig-manager"
    other = daemonset("nvidia-gpu", stack_config(MIG_STACK_GROUPS, node_setup="daemonset").cluster, groups)
    assert other["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "cordon"


def test_rbac_is_least_privilege() -> None:
    """Evictions only where the manager drains itself: an Eviction names only the pod, so the admission
    policy that keeps the manager's other writes to its node cannot confine it."""
    deckhouse = stack_config(MIG_STACK_GROUPS).cluster
    assert deckhouse.node_setup.value == "deckhouse"
    _, role, _ = rbac("nvidia-gpu", deckhouse)
    assert not [r for r in role["rules"] if "pods/eviction" in r["resources"]]
    sa, role, binding = rbac("nvidia-gpu", stack_config(MIG_STACK_GROUPS, node_setup="daemonset").cluster)
    verbs = {(tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]}
    assert (("pods/eviction",), ("create",)) in verbs
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in role["rules"])
    assert not any("secrets" in r["resources"] for r in role["rules"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "nvidia-gpu"}]


@pytest.mark.parametrize("stack_file", ["Pulumi.dev.yaml", "Pulumi.prod.yaml"])
def test_every_group_label_names_a_config_the_manager_has(stack_file: str) -> None:
    """The labels flow and the ConfigMap agree: ``nvidia.com/mig.config`` always names a known config."""
    cfg = load_stack_file(Path(__file__).resolve().parents[3] / stack_file)
    mig = mig_config(cfg.node_groups)
    for g in cfg.node_groups:
        node_labels = desired_node_labels(g, GroupPlan.of(cfg.cluster, g))
        assert node_labels[labels.MIG_CONFIG] in mig.mig_configs, g.name
        assert node_labels[labels.DEVICE_GPU_CONFIG] == g.gpu.sharing.value
        if g.gpu.sharing is not Sharing.MIG:
            assert node_labels[labels.MIG_CONFIG] == "all-disabled"  # a group that leaves MIG rolls back


def test_daemonset_commands_parse_with_the_agent_cli() -> None:
    """The container args and the preStop command are accepted by ``python -m node_agent``'s parser."""
    cfg = stack_config(MIG_STACK_GROUPS)
    (c,) = daemonset("nvidia-gpu", cfg.cluster, cfg.node_groups)["spec"]["template"]["spec"]["containers"]
    main_args = build_parser("mig-manager").parse_args(c["args"])
    assert (main_args.host_root, main_args.drain, main_args.pre_stop) == ("/host", "deckhouse", False)
    assert str(main_args.config) == "/etc/nvidia-gpu/mig/config.yaml"
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:3] == ["python", "-m", "node_agent"]
    stop_args = build_parser("mig-manager").parse_args(pre_stop[3:])
    assert stop_args.pre_stop and stop_args.timeout == 100
