"""The MigProfile component under the mock engine: its children, their order, and nothing registered for a bad layout.

The manifests it registers are tested in ``test_mig_manifests.py``; here only what the component adds.
"""

from __future__ import annotations

import pytest
import yaml

from nvgpu.stackconfig import GroupPlan
from nvidia_gpu.components.manifests.mig import CONFIG_KEY
from nvidia_gpu.components.mig_profile import MigProfile, MigProfileArgs
from nvidia_gpu.preview.engine import install_mocks, run_in_engine
from tests.nvidia_gpu.components.component_helpers import H100_CUSTOM, MIG_STACK_GROUPS, stack_config, with_first_slice


def test_component_under_the_mock_engine() -> None:
    monitor = install_mocks("nvidia-gpu", "test")
    cfg = stack_config(MIG_STACK_GROUPS)
    run_in_engine(lambda: MigProfile("mig", MigProfileArgs(cluster=cfg.cluster, groups=cfg.node_groups)))
    resources = {r.name: r for r in monitor.recorded_resources()}
    comp = resources["mig"]
    assert comp.type_token == "nvidia-gpu:index:MigProfile" and comp.is_component
    children = {n for n, r in resources.items() if r.parent_urn == comp.urn}
    assert children == {"mig-sa", "mig-role", "mig-binding", "mig-config", "mig-config-data", "mig-manager"}
    manager = resources["mig-manager"]
    assert resources["mig-config-data"].urn in manager.dependencies  # the ConfigMap with its content
    data = yaml.safe_load(resources["mig-config-data"].inputs["data"][CONFIG_KEY])
    h100 = GroupPlan.of(cfg.cluster, cfg.node_groups[0])
    assert data["version"] == "v1" and h100.mig_config_name in data["mig-configs"]


def test_no_mig_capable_group_no_manager() -> None:
    monitor = install_mocks("nvidia-gpu", "test")
    cfg = stack_config([MIG_STACK_GROUPS[2]])
    run_in_engine(lambda: MigProfile("mig", MigProfileArgs(cluster=cfg.cluster, groups=cfg.node_groups)))
    assert [r.name for r in monitor.recorded_resources()] == ["mig"]


def test_invalid_layout_registers_nothing() -> None:
    monitor = install_mocks("nvidia-gpu", "test")
    cfg = stack_config([H100_CUSTOM])
    bad = with_first_slice(cfg.node_groups[0], "7g.80gb", 2)
    with pytest.raises(Exception, match="exceeds the 1 instance"):
        run_in_engine(lambda: MigProfile("mig", MigProfileArgs(cluster=cfg.cluster, groups=[bad])))
    assert [r for r in monitor.recorded_resources() if r.custom] == []
