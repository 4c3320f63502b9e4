"""Off Deckhouse the labeller carries the node group's labels and taints: the same ones the node template would.

Under the mock engine (what the GpuNodeGroup registers) and through the agent's own parser and flag
validation, so a stack can never render a ``--node-label`` the labeller would refuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node_agent.cli import build_parser
from node_agent.labeller.nodeconfig import Requested
from nvgpu import labels
from nvgpu.nodelabels import desired_node_labels, desired_node_taints
from nvgpu.stackconfig import GroupPlan, NodeSetupBackend, StackConfig, load_stack_file
from nvidia_gpu.components.manifests import deckhouse, workloads
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvidia_gpu.components.node_group import GpuNodeGroup, GpuNodeGroupArgs
from nvidia_gpu.components.platform import GpuPlatform, GpuPlatformArgs
from tests.nvidia_gpu.components.component_helpers import Engine, by_name, engine, of_kind, stack_config

__all__ = ["engine"]  # the fixture, imported for pytest

MIG_GROUP = {"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
             "gpu": {"sharing": "MIG", "model": "H100-80GB", "mig": {"partedConfig": "all-3g.40gb"}},
             "extraTaints": [{"key": "dedicated", "value": "ml", "effect": "NoExecute"}]}


def _requested(argv: list[str]) -> Requested:
    args = build_parser("labels").parse_args(argv)
    return Requested.from_flags(args.node_label, args.node_taint)


def _register(cfg: StackConfig) -> None:
    platform = GpuPlatform(cfg.cluster.namespace, GpuPlatformArgs(cluster=cfg.cluster, node_taint_keys=["dedicated"]))
    g = cfg.node_groups[0]
    GpuNodeGroup(g.name, GpuNodeGroupArgs(cluster=cfg.cluster, group=g, allocation_mode=cfg.allocation_mode(g),
                                         platform=platform.refs))


def _labeller_args(resources: Any, group: str) -> list[str]:
    ds = by_name(resources)[f"{group}-labeller"].inputs
    return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])


@pytest.mark.parametrize("gpu_taint", [True, False])
def test_daemonset_backend_labeller_applies_the_groups_labels_and_taints(engine: Engine, gpu_taint: bool) -> None:
    cfg = stack_config([{**MIG_GROUP, "gpuTaint": gpu_taint}], node_setup="daemonset")
    group = cfg.node_groups[0]
    want = _requested(_labeller_args(engine.run(lambda: _register(cfg)), "h100"))
    assert dict(want.labels) == desired_node_labels(group, GroupPlan.of(cfg.cluster, group)) == {
        labels.GPU_NODE: "", labels.DEVICE_GPU_CONFIG: "MIG", labels.MIG_CONFIG: "all-3g.40gb",
        labels.NODE_GROUP: "h100"}
    assert want.taints == desired_node_taints(group)
    assert [t.flag() for t in want.taints] == [
        *(["nvidia.com/gpu=present:NoSchedule"] if gpu_taint else []), "dedicated=ml:NoExecute"]


def test_deckhouse_backend_leaves_node_labels_to_the_node_template(engine: Engine) -> None:
    cfg = stack_config([{**MIG_GROUP, "nodeGroup": "ng-h100", "nodeSelector": None}])
    group = cfg.node_groups[0]
    resources = engine.run(lambda: _register(cfg))
    args = _labeller_args(resources, "h100")
    assert "--node-label" not in args and "--node-taint" not in args
    plan = GroupPlan.of(cfg.cluster, group)
    template = deckhouse.node_group_patch(group, plan, "nvidia-gpu")["spec"]["nodeTemplate"]
    assert template["labels"] == desired_node_labels(group, plan)


def test_labeller_role_only_gets_and_patches_nodes_and_keeps_the_gpu_inventory(engine: Engine) -> None:
    cfg = stack_config([MIG_GROUP], node_setup="daemonset")
    resources = engine.run(lambda: _register(cfg))
    role = next(r for r in of_kind(resources, "ClusterRole") if r.inputs["metadata"]["name"].endswith("gpu-labeller"))
    assert role.inputs["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "patch"]},
        {"apiGroups": ["gpu.nvidia-gpu.io"], "resources": ["gpus"], "verbs": ["get", "list", "create", "delete"]},
        {"apiGroups": ["gpu.nvidia-gpu.io"], "resources": ["gpus/status"], "verbs": ["patch"]},
    ]


def test_shipped_stacks_render_labeller_flags_the_agent_accepts() -> None:
    for path in sorted(Path(__file__).resolve().parents[3].glob("Pulumi.*.yaml")):
        cfg = load_stack_file(path)
        for group in cfg.node_groups:
            plan = GroupPlan.of(cfg.cluster, group)
            want = _requested(workloads.labeller_args(GroupContext(cfg.cluster.namespace, cfg.cluster, group, plan)))
            daemonset = cfg.cluster.node_setup is NodeSetupBackend.DAEMONSET
            assert dict(want.labels) == (desired_node_labels(group, plan) if daemonset else {}), path.name
            assert want.taints == (desired_node_taints(group) if daemonset else ()), path.name


def test_a_group_taint_the_platforms_policy_does_not_allow_is_refused_before_anything_registers(
        engine: Engine) -> None:
    """The platform's admission policy lets the labeller set only the taint keys it was given; a group
    whose labeller would set another is refused at construction, naming the field and the fix."""
    cfg = stack_config([MIG_GROUP], node_setup="daemonset")

    def register() -> None:
        platform = GpuPlatform(cfg.cluster.namespace, GpuPlatformArgs(cluster=cfg.cluster))
        g = cfg.node_groups[0]
        GpuNodeGroup(g.name, GpuNodeGroupArgs(cluster=cfg.cluster, group=g, platform=platform.refs))

    with pytest.raises(ValueError, match=r"^GpuNodeGroupArgs.group.extraTaints: group 'h100': the labeller would set "
                                         r"taint key\(s\) dedicated, .* add them to GpuPlatformArgs.node_taint_keys$"):
        engine.run(register)
