"""Helpers for the component tests: a fresh recording mock engine per test (a fixture), and small stack configs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from nvgpu.stackconfig import NodeGroup, StackConfig, load_stack_config
from nvidia_gpu.components.manifests.workloads import AGENT
from nvidia_gpu.preview.engine import RecordingMonitor, install_mocks, run_in_engine
from nvidia_gpu.preview.model import RecordedResource

IMAGE = {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.1.0"}


def stack_config(
    groups: list[dict[str, Any]], *, node_setup: str = "deckhouse", **cluster: Any
) -> StackConfig:
    values = {
        "cluster": {"kubernetesVersion": "1.34", "nodeSetup": node_setup, "agentImage": IMAGE, **cluster},
        "nodeGroups": groups,
    }
    return load_stack_config(values)


def group(name: str = "gpu", sharing: str = "Exclusive", **gpu: Any) -> dict[str, Any]:
    """A Deckhouse-style node group (``nodeGroup`` selection) with the given ``gpu`` block."""
    return {"name": name, "nodeGroup": f"ng-{name}", "gpu": {"sharing": sharing, **gpu}}


#: A MIG group with a custom layout on two GPUs, and a stack mixing it with the other kinds of group.
H100_CUSTOM: dict[str, Any] = {
    "name": "h100", "nodeGroup": "ng-h100",
    "gpu": {"sharing": "MIG", "model": "H100-80GB", "mig": {"partedConfig": "custom", "customConfigs": [
        {"index": 0, "slices": [{"profile": "3g.40gb"}, {"profile": "1g.10gb", "count": 4}]},
        {"index": 1, "slices": [{"profile": "7g.80gb"}]},
    ]}},
}
MIG_STACK_GROUPS: list[dict[str, Any]] = [
    H100_CUSTOM,
    group("a100", "MIG", model="A100-40GB", mig={"partedConfig": "all-1g.5gb"}),
    group("l4", "TimeSlicing", model="L4"),
    group("any", "Exclusive"),
]


def with_first_slice(g: NodeGroup, profile: str, count: int) -> NodeGroup:
    """``g`` with its first custom slice replaced, built past the stack config's validators on purpose:
    the component must not trust its caller."""
    mig = g.gpu.effective_mig
    bad = mig.model_copy(update={"custom_configs": [mig.custom_configs[0].model_copy(update={
        "slices": [mig.custom_configs[0].slices[0].model_copy(update={"profile": profile, "count": count})]})]})
    return g.model_copy(update={"gpu": g.gpu.model_copy(update={"mig": bad})})


class Engine:
    """Runs component code under the mock engine and answers questions about what was registered."""

    def __init__(self, monitor: RecordingMonitor) -> None:
        self.monitor = monitor

    def run(self, fn: Callable[[], object]) -> tuple[RecordedResource, ...]:
        run_in_engine(fn)
        return self.monitor.recorded_resources()


@pytest.fixture
def engine() -> Engine:
    return Engine(install_mocks("nvidia-gpu", "test"))


def by_name(resources: tuple[RecordedResource, ...]) -> dict[str, RecordedResource]:
    return {r.name: r for r in resources}


def of_kind(resources: tuple[RecordedResource, ...], kind: str) -> list[RecordedResource]:
    return [r for r in resources if r.is_kubernetes_object and r.inputs["kind"] == kind]


def config_map_data(resources: tuple[RecordedResource, ...], name: str) -> dict[str, str]:
    """The content of the ConfigMap ``name``: its data patch's (``register_config_map``); the ConfigMap
    resource itself carries none."""
    (whole,) = [r for r in of_kind(resources, "ConfigMap") if not r.is_patch and r.inputs["metadata"]["name"] == name]
    assert "data" not in whole.inputs, whole.name
    (patch,) = [r for r in of_kind(resources, "ConfigMap") if r.is_patch and r.inputs["metadata"]["name"] == name]
    data: dict[str, str] = patch.inputs["data"]
    return data


#: The shipped stack files (``Pulumi.<stack>.yaml``).
ROOT_STACKS = sorted(Path(__file__).resolve().parents[3].glob("Pulumi.*.yaml"))


def agent_container(ds: dict[str, Any]) -> dict[str, Any]:
    """The one container of a DaemonSet that runs an agent command (node setup's monitor beside its teardown
    holder, which only sleeps; every other DaemonSet's only container)."""
    (container,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["command"] == AGENT]
    return cast(dict[str, Any], container)
