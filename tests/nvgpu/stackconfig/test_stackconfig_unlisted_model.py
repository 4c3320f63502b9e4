"""A node group may declare a GPU model the catalogue lacks (a new board): the stack config accepts it, and
what only the catalogue could check (the MIG layout's profiles, the model's driver floor) is deferred to
the node, where ``check`` applies the global driver minimum and the MIG manager fits the layout to the
profiles and placements NVML itself reports. Preview says so in the capacity notes instead of refusing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from nvgpu import catalogue
from nvgpu.capacity import group_capacity
from nvgpu.stackconfig import AllocationMode, GroupPlan, StackConfigError, load_stack_config, mig_layout_problems
from nvidia_gpu.components.manifests.mig import may_use_mig, mig_config
from nvidia_gpu.policies import gpu_validity
from nvidia_gpu.policies.manifests import Kind
from nvidia_gpu.preview.pipeline import DEFAULT_STEPS, new_result, run_steps
from tests.nvgpu.stackconfig.test_stackconfig import VALID
from tests.nvidia_gpu.policies.policy_fixtures import config_map, mig_doc, mig_entry

ROOT = Path(__file__).resolve().parents[3]
UNLISTED = "B200-180GB"
assert UNLISTED not in catalogue.MODEL_KEYS


def _values(gpu: dict[str, Any]) -> dict[str, Any]:
    values = copy.deepcopy(VALID)
    values["nodeGroups"][0] = {"name": "new", "nodeGroup": "gpu-new", "gpu": gpu}
    return values


def _custom(profile: str) -> dict[str, Any]:
    return {"sharing": "MIG", "model": UNLISTED, "mig": {"partedConfig": "custom", "customConfigs": [
        {"index": 0, "slices": [{"profile": profile, "count": 2}]}]}}


def test_an_unlisted_model_with_a_layout_only_it_has_is_accepted_and_deferred() -> None:
    cfg = load_stack_config(_values(_custom("1g.23gb")))  # a B200 profile no catalogue GPU has
    group = cfg.node_groups[0]
    assert group.gpu.model_unlisted and group.gpu.declared_model is None
    assert mig_layout_problems(group) == []
    assert may_use_mig(group)
    assert group.mig_config_name in mig_config(cfg.node_groups).mig_configs
    notes = group_capacity(group, GroupPlan.of(cfg.cluster, group, AllocationMode.DEVICE_PLUGIN)).notes
    assert any(f"gpu.model {UNLISTED} is not in the catalogue" in n and "checked on the node" in n for n in notes)


def test_a_known_model_is_still_checked_at_preview() -> None:
    gpu = _custom("1g.23gb") | {"model": "H100-80GB"}
    with pytest.raises(StackConfigError) as err:
        load_stack_config(_values(gpu))
    assert "profile '1g.23gb' is unknown for H100-80GB" in err.value.problems[0]


@pytest.mark.parametrize("bad", ["B200 180GB", "-B200", "x" * 64, "B200/180"])
def test_a_model_name_that_cannot_be_a_label_value_is_refused_clearly(bad: str) -> None:
    with pytest.raises(StackConfigError) as err:
        load_stack_config(_values({"sharing": "Exclusive", "model": bad}))
    [problem] = err.value.problems
    assert problem.startswith("nvidia-gpu:nodeGroups[0].gpu.model: ")
    assert "nor a catalogue model (A100-40GB," in problem and "like B200-180GB" in problem


def test_the_driver_floor_of_an_unlisted_model_is_the_global_one() -> None:
    load_stack_config(_values({"sharing": "Exclusive", "model": UNLISTED, "driver": {"version": "570.86.15"}}))
    where = "nvidia-gpu:nodeGroups[new].gpu.driver.version"
    assert gpu_validity.driver_problem(UNLISTED, "570.86.15", False, where) is None
    problem = gpu_validity.driver_problem(UNLISTED, "418.67", False, where)
    assert problem is not None and f"below the global minimum {catalogue.GLOBAL_MIN_DRIVER}" in problem


def test_the_mig_config_policy_defers_a_declared_unlisted_model() -> None:
    # 3g.95gb: a profile NVIDIA's mig-parted file names for no GPU the catalogue holds (a 189 GB part).
    doc = mig_doc({"new-mixed": [mig_entry({"3g.95gb": 1})]})
    props = config_map({"config.yaml": doc}, labels_={gpu_validity.GPU_MODEL_KEY: UNLISTED})
    assert gpu_validity.mig_config_problems(Kind("v1", "ConfigMap"), props) == []
    # Undeclared, the same layout must fit some catalogue GPU: it does not.
    props = config_map({"config.yaml": doc})
    assert gpu_validity.mig_config_problems(Kind("v1", "ConfigMap"), props) != []


_STACK = """config:
  nvidia-gpu:cluster:
    kubernetesVersion: "1.34"
    namespace: nvidia-gpu
    allocationMode: devicePlugin
    nodeSetup: deckhouse
    agentImage:
      repository: registry.example.com/nvidia-gpu-agent
      tag: 0.1.0
  nvidia-gpu:nodeGroups:
    - name: b200-mig
      nodeGroup: gpu-b200
      gpu:
        model: B200-180GB
        driver:
          version: "570.86.15"
        sharing: MIG
        mig:
          partedConfig: custom
          strategy: mixed
          customConfigs:
            - index: 0
              slices:
                - profile: 1g.23gb
                  count: 2
                - profile: 3g.90gb
"""


@pytest.mark.slow
def test_the_whole_preview_passes_a_group_of_an_unlisted_model(tmp_path: Path) -> None:
    """The program, the manifests' schemas and the real policy pack: nothing refuses the B200 group."""

    for name in ("Pulumi.yaml", "__main__.py"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "Pulumi.b200.yaml").write_text(_STACK)
    steps = [s for s in DEFAULT_STEPS if s.name != "server-dry-run"]
    result = run_steps(new_result(tmp_path, "b200", tmp_path / "out"), steps)
    assert [str(p) for p in result.problems] == []
    assert any(r.name.startswith("b200-mig") for r in result.resources)
