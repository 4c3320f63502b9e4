"""``pulumi.Input`` in the public args: Outputs flow into the manifests, plain values fail before registration."""

from __future__ import annotations

import json

import pulumi
import pytest

from nvidia_gpu import GpuNodeGroup, GpuNodeGroupArgs, GpuPlatform, GpuPlatformArgs
from nvidia_gpu.preview.engine import install_mocks
from nvidia_gpu.preview.model import RecordedResource
from tests.nvidia_gpu.components.component_helpers import Engine, by_name, engine, of_kind

__all__ = ["engine"]  # the fixture, imported for pytest

CLUSTER = {"kubernetesVersion": "1.34", "nodeSetup": "daemonset"}
GROUP = {"name": "a100", "nodeSelector": {"matchLabels": {"gpu": "a100"}}, "gpu": {"model": "A100-80GB"}}
IMAGE = "registry.example.com/team/nvidia-gpu-agent:1.2.3"


def _library_program(namespace: pulumi.Input[str], image: pulumi.Input[str] = IMAGE,
                     extra_labels: pulumi.Input[dict[str, pulumi.Input[str]]] | None = None) -> None:
    """What a user's program writes: plain stack-config values plus Inputs, no internal refs."""
    platform = GpuPlatform("gpu", GpuPlatformArgs(cluster=CLUSTER, namespace=namespace, agent_image=image,
                                                  extra_labels=extra_labels))
    GpuNodeGroup("a100", GpuNodeGroupArgs(platform=platform, group=GROUP))


def _later(value: str) -> pulumi.Output[str]:
    """An Output as another resource's property would be (resolved asynchronously)."""
    return pulumi.Output.from_input(value).apply(lambda v: v)


def _objects(resources: tuple[RecordedResource, ...]) -> list[RecordedResource]:
    return [r for r in resources if r.is_kubernetes_object]


def test_an_output_namespace_flows_into_every_manifest(engine: Engine) -> None:
    resources = engine.run(lambda: _library_program(_later("team-gpu")))
    objects = _objects(resources)
    assert "nvgpu-input" not in json.dumps([r.inputs for r in objects]), "a stand-in was left in a manifest"
    (ns,) = of_kind(resources, "Namespace")
    assert ns.inputs["metadata"]["name"] == "team-gpu"
    daemonsets = of_kind(resources, "DaemonSet")
    assert {d.name for d in daemonsets} == {"a100-setup", "a100-labeller", "a100-device-plugin"}
    namespaced = [r for r in objects if r.inputs["kind"] in {"DaemonSet", "ConfigMap", "ServiceAccount", "Role",
                                                            "RoleBinding"}]
    assert namespaced and {r.inputs["metadata"]["namespace"] for r in namespaced} == {"team-gpu"}
    # The builders' derived values too: cluster-scoped names and the RBAC subjects.
    bindings = of_kind(resources, "ClusterRoleBinding")
    assert bindings and all(b.inputs["metadata"]["name"].startswith("team-gpu-") for b in bindings)
    assert {s["namespace"] for b in bindings for s in b.inputs["subjects"]} == {"team-gpu"}


def test_the_same_program_with_plain_values_registers_the_same_objects(engine: Engine) -> None:
    """The stand-in changes nothing the engine sees: same names, same inputs as the plain value."""
    later = {r.name: r.inputs for r in engine.run(lambda: _library_program(_later("team-gpu")))}
    fresh = Engine(install_mocks("nvidia-gpu", "test"))
    plain = {r.name: r.inputs for r in fresh.run(lambda: _library_program("team-gpu"))}
    assert later == plain


def test_an_output_image_flows_into_the_containers_without_a_version_label(engine: Engine) -> None:
    resources = engine.run(lambda: _library_program("team-gpu", image=_later(IMAGE)))
    plugin = by_name(resources)["a100-device-plugin"].inputs
    images = {c["image"] for c in plugin["spec"]["template"]["spec"]["containers"]}
    assert images == {IMAGE}
    assert "app.kubernetes.io/version" not in plugin["metadata"]["labels"]


def test_extra_labels_plain_or_output_land_on_every_object(engine: Engine) -> None:
    resources = engine.run(lambda: _library_program("team-gpu", extra_labels={"team": _later("ml"),
                                                                              "cost-center": "42"}))
    # The cluster's shared definitions get none: other stacks apply them alike (manifests.shared).
    shared_kinds = ("CustomResourceDefinition", "RuntimeClass", "DeviceClass")
    shared = [r for r in _objects(resources) if r.inputs["kind"] in shared_kinds]
    assert shared and all(r.retain_on_delete for r in shared)
    assert not [r for r in shared if "team" in r.inputs["metadata"]["labels"]]
    objects = [r for r in _objects(resources) if not r.type_token.endswith("Patch") and r not in shared]
    assert objects and all(r.inputs["metadata"]["labels"]["team"] == "ml" for r in objects)
    assert all(r.inputs["metadata"]["labels"]["cost-center"] == "42" for r in objects)
    # Ours are kept.
    assert all(r.inputs["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "pulumi"
               for r in objects if r.inputs["kind"] != "Namespace")


@pytest.mark.parametrize(("args", "field"), [
    ({"namespace": "Team_GPU"}, "GpuPlatformArgs.namespace"),
    ({"agent_image": "registry.example.com/agent:latest"}, "GpuPlatformArgs.agent_image"),
    ({"extra_labels": {"team": "not a label value"}}, "GpuPlatformArgs.extra_labels"),
    ({"cluster": {"kubernetesVersion": "1.34", "nodeSetup": "neither"}}, "GpuPlatformArgs.cluster.nodeSetup"),
])
def test_a_bad_plain_value_fails_before_anything_registers(engine: Engine, args: dict[str, object],
                                                           field: str) -> None:
    values: dict[str, object] = {"cluster": CLUSTER, "namespace": "team-gpu", "agent_image": IMAGE, **args}
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        engine.run(lambda: GpuPlatform("gpu", GpuPlatformArgs(**values)))  # type: ignore[arg-type]
    assert engine.monitor.recorded_resources() == ()


def test_a_bad_group_fails_naming_its_field(engine: Engine) -> None:
    def program() -> None:
        platform = GpuPlatform("gpu", GpuPlatformArgs(cluster=CLUSTER, agent_image=IMAGE))
        GpuNodeGroup("bad", GpuNodeGroupArgs(platform=platform, group={**GROUP, "gpu": {"sharing": "Half"}}))

    with pytest.raises(ValueError, match=r"GpuNodeGroupArgs\.group\.gpu\.sharing"):
        engine.run(program)
    assert not [r for r in engine.monitor.recorded_resources() if r.name.startswith("bad")]


def test_a_bad_output_fails_when_it_resolves_naming_the_field(engine: Engine) -> None:
    with pytest.raises(Exception, match=r"GpuPlatformArgs\.namespace: 'Team_GPU' is not a namespace name"):
        engine.run(lambda: _library_program(_later("Team_GPU")))
