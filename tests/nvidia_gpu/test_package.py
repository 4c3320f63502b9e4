"""The multi-language face (nvidia_gpu.package): the schema Pulumi infers, and bad inputs named in its terms."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

import nvidia_gpu
from nvidia_gpu import package
from tests.nvidia_gpu.components.component_helpers import Engine, by_name, config_map_data, engine

__all__ = ["engine"]  # the fixture, imported for pytest

CLUSTER = {"kubernetesVersion": "1.34", "nodeSetup": "daemonset",
           "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.1.0"}}
L4: dict[str, Any] = {"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}},
      "gpu": {"model": "L4", "sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4.0}}}


def test_the_schema_has_every_component_with_its_inputs_and_outputs() -> None:
    """The schema the engine gets from ``pulumi package get-schema`` (through the SDK adapter)."""
    resources = json.loads(package.schema())["resources"]
    defs = {token.rsplit(":", 1)[1]: r for token, r in resources.items()}
    assert sorted(defs) == ["DraStack", "DriverUpgrade", "GpuMonitoring", "GpuNodeGroup", "GpuPlatform", "MigProfile",
                            "SharingPolicy"]
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
    assert sorted(defs["SharingPolicy"]["inputProperties"]) == ["cluster", "extraLabels", "group", "namespace"]
    assert sorted(defs["SharingPolicy"]["properties"]) == ["configMapName", "defaultConfig"]


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


def test_a_served_sharing_policy_is_the_groups_device_plugin_configs(engine: Engine) -> None:
    """Served on its own (for a device plugin the stack does not run): the ConfigMap in the cluster's namespace,
    labelled, with a config per sharing mode; the group's mode is the default."""
    cluster = {**CLUSTER, "namespace": "team-gpu"}
    resources = engine.run(lambda: package.SharingPolicy("l4", {"cluster": cluster, "group": L4,
                                                                "extra_labels": {"team": "a"}}))
    policy, config_map = by_name(resources)["l4"], by_name(resources)["l4-config"]
    assert policy.type_token == "nvidia-gpu:index:SharingPolicy" and config_map.parent_urn == policy.urn
    assert config_map.inputs["metadata"]["namespace"] == "team-gpu"
    assert config_map.inputs["metadata"]["labels"]["team"] == "a"
    assert set(config_map_data(resources, "device-plugin-config-l4")) == {"Exclusive", "TimeSlicing", "MPS", "MIG"}


def test_a_bad_sharing_policy_group_names_the_field() -> None:
    bad = {**L4, "gpu": {**L4["gpu"], "sharing": "Shared"}}
    with pytest.raises(package.InputsError) as caught:
        package.SharingPolicy("l4", {"cluster": CLUSTER, "group": bad})
    assert [p for p, _ in caught.value.problems] == ["group.gpu.sharing"]


# --- the typed schema: cluster, group and groups as the stack config's models ------------------------------

def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(package.schema())
    return schema


def _type(schema: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    assert ref["$ref"].startswith("#/types/nvidia-gpu:index:"), ref
    found: dict[str, Any] = schema["types"][ref["$ref"].removeprefix("#/types/")]
    return found


def test_the_settings_inputs_are_object_types_with_enums() -> None:
    schema = _schema()
    group_input = schema["resources"]["nvidia-gpu:index:GpuNodeGroup"]["inputProperties"]["group"]
    assert group_input["plain"] is True and group_input["$ref"] == "#/types/nvidia-gpu:index:NodeGroup"
    group = _type(schema, group_input)
    assert group["type"] == "object" and group["required"] == ["name"]
    gpu = _type(schema, group["properties"]["gpu"])
    sharing = _type(schema, gpu["properties"]["sharing"])  # group.gpu.sharing: an enum reference
    assert sharing["type"] == "string"
    assert [(m["name"], m["value"]) for m in sharing["enum"]] == [
        ("Exclusive", "Exclusive"), ("TimeSlicing", "TimeSlicing"), ("MPS", "MPS"), ("MIG", "MIG")]
    assert "Default: `Exclusive`" in gpu["properties"]["sharing"]["description"]
    assert "default" not in gpu["properties"]["sharing"]  # an SDK would fill it in: the models tell set from unset
    mode = _type(schema, group["properties"]["allocationMode"])
    assert [m["value"] for m in mode["enum"]] == ["devicePlugin", "dra"]
    time_slicing = _type(schema, gpu["properties"]["timeSlicing"])
    assert time_slicing["properties"]["partitionCount"]["type"] == "integer"
    taint = _type(schema, group["properties"]["extraTaints"]["items"])
    assert [m["value"] for m in _type(schema, taint["properties"]["effect"])["enum"]] == [
        "NoSchedule", "PreferNoSchedule", "NoExecute"]
    groups = schema["resources"]["nvidia-gpu:index:MigProfile"]["inputProperties"]["groups"]
    assert groups["type"] == "array" and groups["items"]["$ref"] == group_input["$ref"]


def test_the_cluster_type_is_the_components_view_of_the_cluster_settings() -> None:
    schema = _schema()
    cluster = _type(schema, schema["resources"]["nvidia-gpu:index:GpuPlatform"]["inputProperties"]["cluster"])
    assert cluster["required"] == ["kubernetesVersion"]  # the image may come as the agentImage input
    assert "previewIdentity" not in cluster["properties"]  # a whole stack's setting, refused by a component
    image = cluster["properties"]["agentImage"]
    assert image["oneOf"] == [{"$ref": "#/types/nvidia-gpu:index:AgentImage"}, {"type": "string"}]
    assert "Required unless" in image["description"]
    assert _type(schema, cluster["properties"]["monitoring"])["properties"]["exporter"]["$ref"].endswith(
        ":MetricsExporter")
    pull = _type(schema, _type(schema, image["oneOf"][0])["properties"]["pullPolicy"])
    assert [m["value"] for m in pull["enum"]] == ["IfNotPresent", "Always", "Never"]
    # The models' DriverUpgrade is not the DriverUpgrade component: the SDKs would have two classes of one name.
    assert "nvidia-gpu:index:DriverUpgradeSettings" in schema["types"]


def test_every_type_property_and_enum_member_is_described_in_markdown() -> None:
    schema = _schema()
    for token, spec in schema["types"].items():
        assert spec.get("description"), token
        for key, prop in spec.get("properties", {}).items():
            assert prop.get("description") and prop.get("plain") is True, (token, key)
            assert "``" not in prop["description"], (token, key)
    for token, resource in schema["resources"].items():
        for key, prop in resource["inputProperties"].items():
            assert prop.get("description"), (token, key)
    exporter = schema["types"]["nvidia-gpu:index:MetricsExporter"]
    assert all(m.get("description") for m in exporter["enum"])


def test_every_type_is_reached_from_a_component() -> None:
    schema = _schema()
    text = json.dumps(schema["resources"])
    reached: set[str] = set()
    todo = [t for t in schema["types"] if f'"#/types/{t}"' in text]
    while todo:
        token = todo.pop()
        if token not in reached:
            reached.add(token)
            body = json.dumps(schema["types"][token])
            todo += [t for t in schema["types"] if f'"#/types/{t}"' in body]
    assert reached == set(schema["types"])


def test_the_components_still_take_the_settings_as_the_stack_config_spells_them() -> None:
    """The host hands a typed input over as it hands a map: camelCase keys, unknown keys kept for the models to
    refuse (the host's own mapping of a typed object would drop them unseen)."""
    cls = package.COMPONENTS[1]
    assert inspect.get_annotations(cls.__init__)["args"].__annotations__["group"] == dict[str, Any]
    bad = {**L4, "gpu": {**L4["gpu"], "timeSlicng": {"partitionCount": 4}}}
    with pytest.raises(package.InputsError) as caught:
        package._validated("GpuNodeGroup", "x", {"cluster": CLUSTER}, [bad])
    assert [p for p, _ in caught.value.problems] == ["group.gpu.timeSlicng"]
