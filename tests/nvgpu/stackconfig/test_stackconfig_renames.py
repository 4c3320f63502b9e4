"""Renamed config keys: the one deprecation path (``nvgpu.stackconfig.renames``), first used by the old
``gpu.driverVersion`` spelling of ``gpu.driver.version``; and the plan derived once per group
(``nvgpu.stackconfig.resolved``)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

from nvgpu.stackconfig import (
    AllocationMode,
    ConfigDeprecationWarning,
    GroupPlan,
    NodeGroup,
    StackConfigError,
    load_stack_config,
    load_stack_text,
)
from nvgpu.stackconfig.renames import Rename, apply

BASE: dict[str, Any] = {
    "cluster": {"kubernetesVersion": "1.34",
                "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.4.0"}},
    "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
                    "gpu": {"model": "H100-80GB", "sharing": "MIG"}}],
}


def _values(**gpu: Any) -> dict[str, Any]:
    values = copy.deepcopy(BASE)
    values["nodeGroups"][0]["gpu"].update(gpu)
    return values


def test_the_old_spelling_loads_to_the_same_model_and_warns_once_naming_both_paths() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = load_stack_config(_values(driver={"version": "550.54.15"}))
    with pytest.warns(ConfigDeprecationWarning) as caught:
        old = load_stack_config(_values(driverVersion="550.54.15"))
    assert old == new
    assert old.node_groups[0].gpu.driver.model_fields_set == {"version"}
    (warning,) = caught
    text = str(warning.message)
    assert text.startswith("nvidia-gpu:nodeGroups[h100].gpu.driverVersion is deprecated: write "
                           "nvidia-gpu:nodeGroups[h100].gpu.driver.version instead"), text
    assert "'550.54.15'" in text


def test_the_old_spelling_merges_into_a_driver_block_and_snake_case_is_the_same_key() -> None:
    with pytest.warns(ConfigDeprecationWarning):
        group = NodeGroup.model_validate({"name": "l4", "node_group": "gpu-l4",
                                          "gpu": {"driver_version": "550.54.15", "driver": {"kernelModules": "open"}}})
    assert (group.gpu.driver.version, group.gpu.driver.kernel_modules.value) == ("550.54.15", "open")


def test_both_spellings_at_once_is_one_error_naming_both_fields() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(StackConfigError) as err:
            load_stack_config(_values(driverVersion="550.54.15", driver={"version": "550.90.07"}))
    (line,) = err.value.problems
    assert line == ("nvidia-gpu:nodeGroups[0].gpu.driverVersion: both gpu.driverVersion and gpu.driver.version are "
                    "set, and gpu.driverVersion is the old spelling of gpu.driver.version: set the value once, as "
                    "gpu.driver.version")


def test_a_problem_with_the_old_spelling_is_named_where_it_was_written_and_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(StackConfigError) as err:
            load_stack_config(_values(driverVersion="450.80.02"))
        (line,) = err.value.problems
        assert line.startswith("nvidia-gpu:nodeGroups[0].gpu.driverVersion: 450.80.02 is below "), line
        with pytest.raises(StackConfigError) as err:
            load_stack_config(_values(driver={"version": "450.80.02"}))
        (line,) = err.value.problems
        assert line.startswith("nvidia-gpu:nodeGroups[0].gpu.driver.version: 450.80.02 is below "), line


def test_a_stack_file_with_the_old_spelling_loads_with_the_warning() -> None:
    text = """config:
  nvidia-gpu:cluster:
    kubernetesVersion: "1.34"
    agentImage: registry.example.com/agent:0.1.0
  nvidia-gpu:nodeGroups:
    - name: l4
      nodeGroup: gpu-l4
      gpu: {model: L4, driverVersion: "550.54.15"}
"""
    with pytest.warns(ConfigDeprecationWarning, match=r"nodeGroups\[l4\]\.gpu\.driverVersion"):
        cfg = load_stack_text(text)
    assert cfg.node_groups[0].gpu.declared_driver_version is not None


def test_apply_copies_its_input_and_leaves_an_unmovable_key_to_the_model() -> None:
    rename = Rename(("gpu", "driverVersion"), ("gpu", "driver", "version"))
    data = {"gpu": {"driverVersion": "550", "driver": {}}}
    moved, applied = apply((rename,), data)
    assert moved == {"gpu": {"driver": {"version": "550"}}} and applied == [(rename, "550")]
    assert data == {"gpu": {"driverVersion": "550", "driver": {}}}
    assert apply((rename,), {"gpu": {"driverVersion": "550", "driver": "x"}})[1] == []


def test_the_plan_holds_the_derived_decisions_once() -> None:
    values = copy.deepcopy(BASE)
    values["cluster"]["driverRoot"] = "/host"
    values["nodeGroups"][0].update(allocationMode="dra", passthrough=True,
                                   toolkit={"source": "container", "installDir": "/opt/nvidia"})
    cfg = load_stack_config(values)
    group = cfg.node_groups[0]
    plan = GroupPlan.of(cfg.cluster, group)
    assert plan.allocation_mode is AllocationMode.DRA is cfg.allocation_mode(group)
    assert (plan.driver_root, plan.cdi_hook) == (cfg.cluster.driver_root_for(group), cfg.cluster.cdi_hook_for(group))
    assert (plan.driver_root, plan.cdi_hook) == ("/host", "/opt/nvidia/toolkit/nvidia-cdi-hook")
    assert plan.mig_config_name == group.mig_config_name == "all-1g.10gb"
    assert plan.passthrough and not plan.accept_envvar
    overridden = GroupPlan.of(cfg.cluster, group, AllocationMode.DEVICE_PLUGIN)
    assert overridden.allocation_mode is AllocationMode.DEVICE_PLUGIN and not overridden.passthrough
    with pytest.raises(AttributeError):
        plan.driver_root = "/"  # type: ignore[misc]
