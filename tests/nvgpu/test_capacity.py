"""The capacity plan the preview prints and writes to plan.json: per node group and GPU, from the catalogue."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from nvgpu import capacity, catalogue
from nvgpu.stackconfig import load_stack_config
from nvidia_gpu.preview.pipeline import run_preview
from nvidia_gpu.preview.summary import summary_lines

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = {"kubernetesVersion": "1.34", "agentImage": {"repository": "registry.example.com/agent", "tag": "1"}}


def _plan(gpu: dict[str, Any], **group: Any) -> capacity.GroupCapacity:
    cluster = copy.deepcopy(CLUSTER)
    cluster.update(group.pop("cluster", {}))
    values = {"cluster": cluster, "nodeGroups": [{"name": "g", "nodeSelector": {"matchLabels": {"pool": "g"}},
                                                  "gpu": gpu, **group}]}
    (g,) = capacity.plan(load_stack_config(values))
    return g


def _offers(g: capacity.GroupCapacity) -> list[tuple[str, int, int | None, str]]:
    return [(o.resource, o.count, o.memory_mib, o.memory) for o in g.offers]


def test_exclusive_is_one_whole_gpu() -> None:
    g = _plan({"model": "A100-80GB"})
    assert _offers(g) == [("nvidia.com/gpu", 1, 81920, "isolated")]
    assert g.offers[0].compute == "whole GPU"


def test_time_slicing_offers_replicas_that_share_all_the_memory() -> None:
    g = _plan({"model": "L4", "sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 8}})
    assert _offers(g) == [("nvidia.com/gpu", 8, catalogue.get_model("L4").memory_mib, "shared")]
    assert any("no limit is enforced" in n for n in g.notes)


def test_mps_offers_the_limits_its_clients_get() -> None:
    """The device plugin's MPS allocation sets memory / replicas and 100 / replicas percent of the SMs."""
    g = _plan({"model": "A30-24GB", "sharing": "MPS", "mps": {"partitionCount": 4}})
    assert _offers(g) == [("nvidia.com/gpu", 4, catalogue.get_model("A30-24GB").memory_mib // 4, "limit")]
    assert g.offers[0].compute == "25% of the SMs (MPS)"


@pytest.mark.parametrize(("model", "config", "expected"), [
    ("H100-80GB", "all-1g.10gb", [("nvidia.com/mig-1g.10gb", 7)]),
    ("H100-80GB", "all-3g.40gb", [("nvidia.com/mig-3g.40gb", 2)]),
    ("A100-40GB", "all-1g.5gb", [("nvidia.com/mig-1g.5gb", 7)]),
    ("A30-24GB", "all-1g.6gb", [("nvidia.com/mig-1g.6gb", 4)]),
    ("H100-80GB", "all-balanced", [("nvidia.com/mig-1g.10gb", 2), ("nvidia.com/mig-2g.20gb", 1),
                                   ("nvidia.com/mig-3g.40gb", 1)]),
    ("A30-24GB", "all-balanced", [("nvidia.com/mig-1g.6gb", 2), ("nvidia.com/mig-2g.12gb", 1)]),
])
def test_mig_standard_layouts_as_mig_parted_makes_them(model: str, config: str,
                                                       expected: list[tuple[str, int]]) -> None:
    g = _plan({"model": model, "sharing": "MIG", "mig": {"partedConfig": config}})
    assert [(o.resource, o.count) for o in g.offers] == expected
    spec = catalogue.get_model(model).mig
    assert spec is not None
    for o in g.offers:
        profile = spec.profile(o.resource.removeprefix("nvidia.com/mig-"))
        assert profile is not None and o.memory_mib == profile.memory_mib and o.memory == "isolated"
        assert o.compute == f"{profile.compute_slices}/{spec.compute_slices} of the SMs"


def test_mig_single_strategy_offers_nvidia_com_gpu() -> None:
    g = _plan({"model": "H100-80GB", "sharing": "MIG", "mig": {"partedConfig": "all-3g.40gb", "strategy": "single"}})
    assert [(o.resource, o.count) for o in g.offers] == [("nvidia.com/gpu", 2)]


def test_a_custom_layout_is_planned_per_gpu_index() -> None:
    mig = {"partedConfig": "custom", "customConfigs": [
        {"index": 0, "slices": [{"profile": "7g.80gb"}]},
        {"index": 1, "slices": [{"profile": "3g.40gb"}, {"profile": "1g.10gb", "count": 4}]}]}
    g = _plan({"model": "H100-80GB", "sharing": "MIG", "mig": mig})
    assert [(o.gpus, o.resource, o.count) for o in g.offers] == [
        ("GPU 0", "nvidia.com/mig-7g.80gb", 1), ("GPU 1", "nvidia.com/mig-1g.10gb", 4),
        ("GPU 1", "nvidia.com/mig-3g.40gb", 1)]
    assert any("keep the one they have" in n for n in g.notes)


def test_dra_offers_device_classes() -> None:
    g = _plan({"model": "H100-80GB", "sharing": "MIG", "mig": {"partedConfig": "all-3g.40gb"}},
              allocationMode="dra")
    assert [(o.resource, o.count) for o in g.offers] == [("mig.nvidia.com", 2)]
    g = _plan({"model": "H200-141GB"}, allocationMode="dra", passthrough=True)
    assert [(o.resource, o.count) for o in g.offers] == [("gpu.nvidia.com", 1), ("vfio.gpu.nvidia.com", 1)]


def test_an_undeclared_model_says_what_it_cannot_know() -> None:
    g = _plan({"sharing": "MIG"})
    assert g.offers == () and any("gpu.model is not declared" in n for n in g.notes)
    g = _plan({"sharing": "TimeSlicing"})
    assert _offers(g) == [("nvidia.com/gpu", 4, None, "shared")]
    assert "        4 x nvidia.com/gpu                      ? shared by all, time-shared by 4" in capacity.lines((g,))


def test_the_preview_prints_the_plan_and_writes_it_to_plan_json(tmp_path: Path) -> None:
    result = run_preview(ROOT, "dev", out_dir=tmp_path)
    assert result.ok, result.problems
    text = "\n".join(summary_lines(result))
    assert "Capacity plan (per GPU, from the GPU catalogue):" in text
    assert "  h100-mig: H100-80GB, devicePlugin, MIG all-1g.10gb (strategy mixed)" in text
    assert "        7 x nvidia.com/mig-1g.10gb       9.75 GiB each, 1/7 of the SMs" in text
    data = json.loads((tmp_path / "plan.json").read_text())
    assert result.config is not None
    assert [g["nodeGroup"] for g in data["capacity"]] == [g.name for g in result.config.node_groups]
    h100 = data["capacity"][0]
    assert h100["offers"] == [{"resource": "nvidia.com/mig-1g.10gb", "perGpu": 7, "memoryMiB": 9984,
                               "memory": "isolated", "compute": "1/7 of the SMs", "gpus": "every GPU"}]


@pytest.mark.parametrize("page", ["README.md", "docs/concepts/sharing.md"])
def test_the_docs_show_the_plan_as_the_preview_prints_it(page: str, tmp_path: Path) -> None:
    """The README's tour and the sharing-modes page show (part of) the dev stack's plan, as printed."""
    text = (ROOT / page).read_text()
    start = text.index("Capacity plan (per GPU, from the GPU catalogue):")
    shown = text[start:text.index("```", start)].rstrip("\n").splitlines()
    result = run_preview(ROOT, "dev", out_dir=tmp_path)
    printed = summary_lines(result)
    at = printed.index(shown[0])
    assert printed[at:at + len(shown)] == shown
