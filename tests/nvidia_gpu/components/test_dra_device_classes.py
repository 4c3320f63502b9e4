"""``cluster.dra.createDeviceClasses``: the DeviceClasses have fixed names, so a cluster whose NVIDIA DRA
driver already installed them turns ours off (the provider would take theirs over, ``destroy`` delete them)."""

from __future__ import annotations

import pytest

from nvidia_gpu.components.program import build_stack
from tests.nvidia_gpu.components.component_helpers import Engine, engine, of_kind, stack_config  # noqa: F401

DRA_GROUP = {"name": "d", "nodeGroup": "ng-d", "allocationMode": "dra"}


@pytest.mark.parametrize("create", [True, False])
def test_device_classes_follow_the_switch(engine: Engine, create: bool) -> None:  # noqa: F811
    cfg = stack_config([DRA_GROUP], dra={"createDeviceClasses": create})
    resources = engine.run(lambda: build_stack(cfg))
    names = {r.inputs["metadata"]["name"] for r in of_kind(resources, "DeviceClass")}
    assert names == ({"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"} if create else set())
    assert of_kind(resources, "DaemonSet")  # the plugin runs either way
