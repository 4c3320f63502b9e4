"""The preflight's view of other stacks: shared definitions, namespaces and NodeGroups, over an in-memory
cluster (the real API server's answers, conflicts included, are in tests/cluster/test_two_stacks.py)."""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass, field
from typing import Any

from nvgpu import labels
from nvidia_gpu.components.manifests import deckhouse
from nvidia_gpu.components.manifests.shared import shared_objects
from nvidia_gpu.preflight import stacks
from nvidia_gpu.preflight.model import Conflict, Severity
from tests.nvidia_gpu.components.component_helpers import group, stack_config

STACK = "nvidia-gpu/dev"
CONFIG = stack_config([group("a30")], namespace="gpu-a")


@dataclass
class Cluster:
    """Objects by (kind, name), and the conflicts a dry-run apply of a kind would meet."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    conflicting: dict[str, list[Conflict]] = field(default_factory=dict)
    probed: list[tuple[str, str]] = field(default_factory=list)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        return [o for (k, _), o in self.objects.items() if k == kind]

    def conflicts(self, obj: dict[str, Any], field_manager: str) -> builtins.list[Conflict]:
        self.probed.append((obj["kind"], field_manager))
        assert "ownerReferences" not in obj["metadata"], "the probe claims no owner reference"
        return self.conflicting.get(obj["kind"], [])

    def put(self, kind: str, name: str, **metadata: Any) -> None:
        self.objects[(kind, name)] = {"kind": kind, "metadata": {"name": name, **metadata}}


def _owned_by(*namespaces: str, uid_of: dict[str, str] | None = None) -> dict[str, Any]:
    refs = [{"apiVersion": "v1", "kind": "Namespace", "name": ns, "uid": (uid_of or {}).get(ns, f"uid-{ns}")}
            for ns in namespaces]
    return {"ownerReferences": refs, "labels": {"app.kubernetes.io/part-of": "nvidia-gpu"}}


def test_nothing_there_is_nothing_to_report() -> None:
    cluster = Cluster()
    assert stacks.findings(CONFIG, STACK, cluster, cluster) == []
    assert cluster.probed == []


def test_a_shared_definition_another_stack_applies_alike_is_co_owned() -> None:
    cluster = Cluster()
    cluster.put("CustomResourceDefinition", "gpus.gpu.nvidia-gpu.io", **_owned_by("gpu-b"))
    assert stacks.findings(CONFIG, STACK, cluster, cluster) == []
    assert cluster.probed == [("CustomResourceDefinition", stacks.PROBE_MANAGER)]


def test_another_stacks_definition_that_differs_is_refused_with_the_fields_and_the_stack() -> None:
    cluster = Cluster(conflicting={"CustomResourceDefinition": [
        Conflict(".spec.versions", "pulumi-kubernetes-b1"),
        Conflict(".spec.names.categories", "pulumi-kubernetes-b1")]})
    cluster.put("CustomResourceDefinition", "gpus.gpu.nvidia-gpu.io", **_owned_by("gpu-b"))
    [found] = stacks.findings(CONFIG, STACK, cluster, cluster)
    assert found.severity is Severity.ERROR
    assert found.line() == (
        "CustomResourceDefinition/gpus.gpu.nvidia-gpu.io: shared with the nvidia-gpu stack in namespace gpu-b, which "
        "defines .spec.names.categories, .spec.versions otherwise (held by pulumi-kubernetes-b1): every stack on a "
        "cluster must apply it alike; run them at the same nvidia-gpu version and settings (upgrade them together)")


def test_fields_only_this_stack_holds_are_not_a_collision() -> None:
    """Both stacks own the CRD; the differing field is held by this stack's own applier alone (it holds
    this stack's owner reference), so ``up`` updates it without a conflict."""
    ours_uid = "uid-a"
    cluster = Cluster(conflicting={"CustomResourceDefinition": [Conflict(".spec.versions", "pulumi-kubernetes-a1")]})
    cluster.put("Namespace", "gpu-a", uid=ours_uid, annotations={labels.STACK_ANNOTATION: STACK})
    crd = _owned_by("gpu-a", "gpu-b", uid_of={"gpu-a": ours_uid})
    key = "k:" + json.dumps({"uid": ours_uid}, separators=(",", ":"))
    crd["managedFields"] = [{"manager": "pulumi-kubernetes-a1",
                             "fieldsV1": {"f:metadata": {"f:ownerReferences": {key: {}}}}}]
    cluster.put("CustomResourceDefinition", "gpus.gpu.nvidia-gpu.io", **crd)
    assert stacks.findings(CONFIG, STACK, cluster, cluster) == []


def test_someone_elses_runtime_class_is_refused_with_the_opt_out() -> None:
    cluster = Cluster()
    cluster.put("RuntimeClass", "nvidia", managedFields=[{"manager": "helm"}])
    [found] = stacks.findings(CONFIG, STACK, cluster, cluster)
    assert found.line() == (
        "RuntimeClass/nvidia: exists and is not an nvidia-gpu stack's (managed by helm): applying the stack's would "
        "take it over, and the garbage collector would delete it with this stack's namespace; set "
        "nvidia-gpu:cluster.runtimeClass.create: false to use it as it is")
    off = stack_config([group("a30")], namespace="gpu-a", runtimeClass={"create": False})
    assert stacks.findings(off, STACK, cluster, cluster) == []


def test_an_older_version_s_definition_counts_its_instance_label_as_its_stack() -> None:
    cluster = Cluster(conflicting={"RuntimeClass": [Conflict(".scheduling", "pulumi-kubernetes-old")]})
    cluster.put("RuntimeClass", "nvidia",
                labels={"app.kubernetes.io/part-of": "nvidia-gpu", "app.kubernetes.io/instance": "gpu-old"})
    [found] = stacks.findings(CONFIG, STACK, cluster, cluster)
    assert "shared with the nvidia-gpu stack in namespace gpu-old" in found.message


def test_a_namespace_of_another_stack_is_refused_once() -> None:
    cluster = Cluster()
    cluster.put("Namespace", "gpu-a", annotations={labels.STACK_ANNOTATION: "nvidia-gpu/prod"})
    cluster.put("RuntimeClass", "nvidia", managedFields=[{"manager": "helm"}])
    [found] = stacks.findings(CONFIG, STACK, cluster, cluster)
    assert found.line() == (
        "Namespace/gpu-a: belongs to the Pulumi stack nvidia-gpu/prod (annotation gpu.nvidia-gpu.io/stack); this "
        "stack (nvidia-gpu/dev) needs its own nvidia-gpu:cluster.namespace, since its ClusterRoles, admission "
        "policies and field managers are named after it. A renamed stack takes it over with: kubectl annotate "
        "namespace gpu-a gpu.nvidia-gpu.io/stack=nvidia-gpu/dev --overwrite")
    cluster.put("Namespace", "gpu-a", annotations={labels.STACK_ANNOTATION: STACK})
    assert len(stacks.findings(CONFIG, STACK, cluster, cluster)) == 1  # only the RuntimeClass now


def test_a_node_group_another_stack_patches_is_refused() -> None:
    cluster = Cluster()
    cluster.put("NodeGroup", "ng-a30", managedFields=[
        {"manager": "deckhouse-controller"}, {"manager": deckhouse.field_manager("gpu-b")},
        {"manager": deckhouse.field_manager("gpu-a")}])
    [found] = stacks.findings(CONFIG, STACK, cluster, cluster)
    assert found.line() == (
        "NodeGroup/ng-a30: nodeGroups[a30]: already patched by the nvidia-gpu stack in namespace gpu-b (field manager "
        "nvidia-gpu.gpu-b): a Deckhouse NodeGroup's GPU labels, taints and setup steps belong to one stack; give this "
        "group its own NodeGroup, or remove the group from the other stack first")


def test_the_shared_definitions_are_what_the_components_register() -> None:
    """One source: the DRA classes only with a DRA group and createDeviceClasses, the RuntimeClass only with
    runtimeClass.create."""
    names = [(o.manifest["kind"], o.manifest["metadata"]["name"]) for o in shared_objects(CONFIG)]
    assert names == [("CustomResourceDefinition", "gpus.gpu.nvidia-gpu.io"), ("RuntimeClass", "nvidia")]
    dra = stack_config([{**group("h200"), "allocationMode": "dra"}], namespace="gpu-a")
    assert [o.manifest["kind"] for o in shared_objects(dra)].count("DeviceClass") == 3
    for obj in shared_objects(dra):
        assert "app.kubernetes.io/instance" not in obj.manifest["metadata"]["labels"]
