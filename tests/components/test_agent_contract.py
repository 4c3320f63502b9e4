"""Every agent command line the components render is accepted by the agent's own parser.

The DaemonSets run ``python -m node_agent ...``; a flag the agent does not know would crash-loop the
pods on every node, so each container's args (and the setup pod's preStop command) are parsed here
with ``node_agent.cli.build_parser`` for every node group of both shipped stacks and both backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.manifests import workloads
from components.manifests.workloads import GroupContext
from node_agent.cli import build_parser
from nvgpu.stackconfig import NodeSetupBackend, load_stack_file

ROOT = Path(__file__).resolve().parents[2]
STACKS = sorted(ROOT.glob("Pulumi.*.yaml"))
_GLOBALS_WITH_VALUE = {"--host-root", "--host-exec", "--nvml", "--nvml-state", "--node-name", "--kubeconfig",
                       "--log-level"}


def _command_lines(ds: dict[str, Any]) -> list[list[str]]:
    pod = ds["spec"]["template"]["spec"]
    lines = []
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if c["command"] == workloads.AGENT:
            lines.append(list(c["args"]))
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if pre_stop:
            assert pre_stop[: len(workloads.AGENT)] == workloads.AGENT
            lines.append(pre_stop[len(workloads.AGENT):])
    return lines


def _parse(argv: list[str]) -> Any:
    i = 0
    while argv[i].startswith("--"):
        i += 2 if argv[i] in _GLOBALS_WITH_VALUE else 1
    return build_parser(argv[i]).parse_args(argv)


@pytest.mark.parametrize("stack", STACKS, ids=lambda p: p.name)
def test_rendered_agent_command_lines_parse(stack: Path) -> None:
    cfg = load_stack_file(stack)
    builders = [workloads.device_plugin_daemonset, workloads.labeller_daemonset]
    if cfg.cluster.node_setup is NodeSetupBackend.DAEMONSET:
        builders.append(workloads.setup_daemonset)
    parsed = 0
    for group in cfg.node_groups:
        ctx = GroupContext(cfg.cluster.namespace, cfg.cluster, group)
        for build in builders:
            for argv in _command_lines(build(ctx)):
                args = _parse(argv)
                assert args.command == next(a for a in argv if not a.startswith("-") and a != workloads.HOST_ROOT)
                parsed += 1
    assert parsed >= 2 * len(cfg.node_groups)


def test_labeller_arguments_reach_the_labels_command() -> None:
    cfg = load_stack_file(ROOT / "Pulumi.dev.yaml")
    group = next(g for g in cfg.node_groups if g.gpu.sharing.value == "TimeSlicing")
    args = _parse(workloads.labeller_args(GroupContext(cfg.cluster.namespace, cfg.cluster, group)))
    assert (args.loop, args.patch_node, args.replicas, args.sharing_strategy) == (True, True, 8, "time-slicing")
