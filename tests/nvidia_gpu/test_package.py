"""The multi-language face (nvidia_gpu.package): the schema Pulumi infers, and bad inputs named in its terms."""

from __future__ import annotations

import json
from typing import Any

import pytest

import nvidia_gpu
from nvidia_gpu import package

CLUSTER = {"kubernetesVersion": "1.34", "nodeSetup": "daemonset",
           "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.1.0"}}
L4: dict[str, Any] = {"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}},
      "gpu": {"model": "L4", "sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4.0}}}


def test_the_schema_has_every_component_with_its_inputs_and_outputs() -> None:
    """The schema the engine gets from ``pulumi package get-schema`` (through the SDK adapter)."""
    resources = json.loads(package.schema())["resources"]
    defs = {token.rsplit(":", 1)[1]: r for token, r in resources.items()}
    assert sorted(defs) == ["DraStack", "DriverUpgrade", "GpuMonitoring", "GpuNodeGroup", "GpuPlatform", "MigProfile"]
    group = defs["GpuNodeGroup"]
    assert sorted(group["requiredInputs"]) == ["cluster", "group"]
    assert sorted(group["inputProperties"]) == ["agentImage", "cluster", "extraLabels", "group", "namespace"]
    assert sorted(group["properties"]) == ["nodeLabels", "nodeTaints"]
    # The stack-config objects are plain (known at preview: the components validate them before anything
    # registers); the values that may come from other resources are Inputs.
    assert group["inputProperties"]["group"].get("plain") and not group["inputProperties"]["namespace"].get("plain")
    assert sorted(defs["GpuPlatform"]["properties"]) == ["namespace", "serviceAccounts"]
    assert sorted(defs["GpuPlatform"]["inputProperties"]) == ["agentImage", "cluster", "extraLabels", "namespace",
                                                             "nodeTaintKeys"]
    assert sorted(defs["MigProfile"]["properties"]) == ["configMapName", "configNames"]
    assert sorted(defs["GpuMonitoring"]["properties"]) == ["alertRules", "dashboardCount", "metricsExporter"]
    assert sorted(defs["GpuMonitoring"]["inputProperties"]) == ["agentImage", "cluster", "extraLabels", "groups",
                                                               "namespace"]
    assert sorted(defs["DriverUpgrade"]["properties"]) == ["drainMode"]


def test_whole_numbers_from_other_languages_validate_as_integers() -> None:
    _, config = package._validated("GpuNodeGroup", "l4", {"cluster": CLUSTER}, [L4])
    assert config is not None
    ts = config.node_groups[0].gpu.time_slicing
    assert ts is not None and ts.partition_count == 4 and isinstance(ts.partition_count, int)


@pytest.mark.parametrize(("component", "args", "groups", "problem"), [
    ("GpuNodeGroup", {"cluster": CLUSTER},
     [{**L4, "gpu": {**L4["gpu"], "timeSlicing": {"partitionCount": 1}}}],
     ("group.gpu.timeSlicing.partitionCount", "greater than or equal to 2")),
    ("DraStack", {"cluster": {**CLUSTER, "kubernetesVersion": "1.33"}},
     [{**L4, "allocationMode": "dra", "gpu": {"model": "L4"}}], ("groups", "needs Kubernetes 1.34+")),
    ("GpuPlatform", {"cluster": CLUSTER, "namespace": "Not_A_Label"}, [], ("namespace", "not a namespace name")),
    ("GpuMonitoring", {"cluster": {**CLUSTER, "monitoring": {"scrape": "pods"}}}, [L4],
     ("cluster.monitoring.scrape", "'serviceMonitor', 'podMonitor' or 'annotations'")),
    ("GpuPlatform", {"cluster": CLUSTER, "agent_image": "UPPER CASE"}, [],
     ("agentImage", "must be an image repository without tag or digest")),
])
def test_a_bad_input_names_the_component_and_the_property(component: str, args: Any, groups: list[dict[str, Any]],
                                                         problem: tuple[str, str]) -> None:
    with pytest.raises(package.InputsError) as caught:
        package._validated(component, "x", args, groups)
    assert str(caught.value).startswith(f"{component} 'x': ")
    path, reason = problem
    assert any(p.startswith(path) and reason in r for p, r in caught.value.problems), caught.value.problems


def test_driver_upgrade_without_a_container_driver_is_refused_naming_the_groups() -> None:
    """The controller has nothing to roll unless a group's driver comes from a container."""
    with pytest.raises(package.InputsError) as caught:
        package.DriverUpgrade("up", {"cluster": CLUSTER, "groups": [L4]})
    assert caught.value.problems == [
        ("groups", "none has gpu.driver.source 'container': there is no driver for the controller to roll")]


def test_the_library_exports_every_component_of_the_package() -> None:
    for component in package.COMPONENTS:
        assert component.__name__ in nvidia_gpu.__all__
        assert issubclass(component, getattr(nvidia_gpu, component.__name__))
        assert f"{component.__name__}Args" in nvidia_gpu.__all__
