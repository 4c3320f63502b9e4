"""The components and the plugin agree: every named config the stacks render parses, and the
DaemonSet's arguments are accepted by the ``device-plugin`` command."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.cli import build_parser
from node_agent.deviceplugin import config
from nvgpu.stackconfig import load_stack_file
from nvidia_gpu.components.manifests import workloads
from nvidia_gpu.components.manifests.sharing import render_named_configs

ROOT = Path(__file__).resolve().parents[3]
STACKS = sorted(ROOT.glob("Pulumi.*.yaml"))


@pytest.mark.parametrize("stack", STACKS, ids=lambda p: p.name)
def test_rendered_named_configs_parse(stack: Path) -> None:
    sc = load_stack_file(stack)
    for group in sc.node_groups:
        configs = render_named_configs(group)
        assert set(configs) == {"Exclusive", "TimeSlicing", "MPS", "MIG"}
        strategies = {name: config.load(text).sharing.strategy for name, text in configs.items()}
        sharing = config.SharingStrategy
        assert strategies == {"Exclusive": sharing.NONE, "TimeSlicing": sharing.TIME_SLICING, "MPS": sharing.MPS,
                              "MIG": sharing.NONE}
        assert config.load(configs["MIG"]).mig_strategy is not config.MigStrategy.NONE


def test_daemonset_arguments_are_accepted() -> None:
    args = ["device-plugin", "--config-dir", workloads.DEVICE_PLUGIN_CONFIG_DIR, "--config-label",
            "node.deckhouse.io/device-gpu.config", "--default-config", "Exclusive",
            "--metrics-port", str(workloads.DEVICE_PLUGIN_METRICS_PORT)]
    parsed = build_parser("device-plugin").parse_args(args)
    assert parsed.config_dir == Path(workloads.DEVICE_PLUGIN_CONFIG_DIR)
    assert str(parsed.socket_dir) == workloads.KUBELET_DEVICE_PLUGINS
    assert parsed.metrics_port == workloads.DEVICE_PLUGIN_METRICS_PORT
