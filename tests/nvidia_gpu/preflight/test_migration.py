"""The migration preflight against an in-memory cluster: another installation's GPU agents on the stack's
nodes (the GPU Operator's operands, NVIDIA's device-plugin and DRA charts, Deckhouse's GPU support) are
reported with the handover that moves each node group, and nothing is reported once it is done."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from nvgpu.stackconfig import StackConfig, load_stack_config
from nvidia_gpu.components.manifests.meta import app_labels
from nvidia_gpu.components.manifests.previewaccess import PREFLIGHT_READS
from nvidia_gpu.preflight import migration, stacks
from nvidia_gpu.preflight.model import Conflict, Finding, Severity
from tests.kit.fake_reader import FakeReader

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def config(*groups: dict[str, Any], **cluster: Any) -> StackConfig:
    return load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "agentImage": "registry.example.com/agent:1.0", **cluster},
        "nodeGroups": list(groups) or [{"name": "a30", "nodeGroup": "gpu-a30"}],
    })


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None
         ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or []}}


def a30_nodes(count: int, **extra: str) -> list[dict[str, Any]]:
    return [node(f"a30-{i}", {"node.deckhouse.io/group": "gpu-a30", **extra}) for i in range(count)]


def daemonset(name: str, namespace: str, spec: dict[str, Any], *, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    match = labels or {"app": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "labels": match, "annotations": annotations or {}},
            "spec": {"selector": {"matchLabels": match},
                     "template": {"metadata": {"labels": match}, "spec": spec}}}


def operand(operand: str, name: str, image: str = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0") -> dict[str, Any]:
    """A GPU Operator operand as assets/state-*/..._daemonset.yaml renders it."""
    return daemonset(name, "gpu-operator", {
        "nodeSelector": {f"nvidia.com/gpu.deploy.{operand}": "true"},
        "tolerations": [GPU_TOLERATION],
        "containers": [{"name": name, "image": image}],
    })


def pod(name: str, namespace: str, labels: dict[str, str], node_name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, **meta},
            "spec": {"nodeName": node_name}, "status": {"phase": "Running"}}


def cluster_policy(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": spec}


#: The chart's default affinity (deployments/helm/nvidia-device-plugin/values.yaml): NFD's NVIDIA PCI label,
#: or the label GFD / the operator put on GPU nodes.
CHART_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In",
                           "values": ["true"]}]},
    {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
]}}}


def chart_plugin(affinity: dict[str, Any] = CHART_AFFINITY) -> dict[str, Any]:
    return daemonset("nvdp-nvidia-device-plugin", "nvidia-device-plugin", {
        "affinity": affinity,
        "tolerations": [GPU_TOLERATION, {"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "containers": [{"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                        "command": ["nvidia-device-plugin"]}],
    }, labels={"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/instance": "nvdp"},
        annotations={"meta.helm.sh/release-name": "nvdp", "meta.helm.sh/release-namespace": "nvidia-device-plugin"})


def by_subject(found: list[Finding], subject: str) -> list[Finding]:
    return [f for f in found if f.subject == subject]


def test_the_operators_device_plugin_on_the_groups_nodes_is_an_error_with_the_handover() -> None:
    reader = FakeReader().add(cluster_policy(), *a30_nodes(5), node("cpu-0", {"node.deckhouse.io/group": "worker"}),
                              operand("device-plugin", "nvidia-device-plugin-daemonset"))
    [f] = by_subject(migration.findings(config(), reader), "DaemonSet/gpu-operator/nvidia-device-plugin-daemonset")
    assert f.severity is Severity.ERROR
    assert "GPU Operator's device-plugin" in f.message and "5 node(s) of node group 'a30'" in f.message
    assert "(a30-0, a30-1, a30-2 and 2 more)" in f.message  # the first few and a count, never cpu-0
    assert "two device plugins would register nvidia.com/gpu with one kubelet" in f.message
    assert ("kubectl label nodes -l 'node.deckhouse.io/group=gpu-a30' nvidia.com/gpu.deploy.device-plugin=false "
            "--overwrite") in f.message
    assert migration.node_template_command("gpu-a30", "nvidia.com/gpu.deploy.device-plugin") in f.message
    assert migration.policy_command(migration.Role.DEVICE_PLUGIN) in f.message
    assert "\n" not in f.line()


def test_nodes_labelled_off_are_handed_over_but_a_pod_still_running_there_is_not() -> None:
    nodes = a30_nodes(2, **{"nvidia.com/gpu.deploy.device-plugin": "false"})
    ds = operand("device-plugin", "nvidia-device-plugin-daemonset")
    reader = FakeReader().add(cluster_policy(), *nodes, ds)
    assert by_subject(migration.findings(config(), reader), migration.Foreign(
        migration.Owner.OPERATOR, migration.Role.DEVICE_PLUGIN, "gpu-operator",
        "nvidia-device-plugin-daemonset").subject) == []
    reader.add(pod("dp-1", "gpu-operator", {"app": "nvidia-device-plugin-daemonset"}, "a30-1"),
               pod("dp-0", "gpu-operator", {"app": "nvidia-device-plugin-daemonset"}, "a30-0",
                   deletionTimestamp="2026-12-06T11:00:00Z"))
    [f] = by_subject(migration.findings(config(), reader), "DaemonSet/gpu-operator/nvidia-device-plugin-daemonset")
    assert "1 node(s)" in f.message and "(a30-1)" in f.message  # a30-0's pod is already going away


def test_operands_that_must_not_double_are_errors_and_the_coexisting_ones_warnings() -> None:
    reader = FakeReader().add(
        cluster_policy(), *a30_nodes(1, **{"nvidia.com/mig.capable": "true"}),
        operand("gpu-feature-discovery", "gpu-feature-discovery"),
        operand("mig-manager", "nvidia-mig-manager", "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.10.0"),
        operand("dcgm-exporter", "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:4.1.1"),
        operand("container-toolkit", "nvidia-container-toolkit-daemonset", "nvcr.io/nvidia/k8s/container-toolkit:1"),
        operand("operator-validator", "nvidia-operator-validator", "nvcr.io/nvidia/gpu-operator:v25"))
    found = {f.subject.rsplit("/", 1)[1]: f.severity for f in migration.findings(config(), reader)}
    assert found == {"gpu-feature-discovery": Severity.ERROR, "nvidia-mig-manager": Severity.ERROR,
                     "nvidia-dcgm-exporter": Severity.WARNING, "nvidia-container-toolkit-daemonset": Severity.WARNING}
    [toolkit] = by_subject(migration.findings(config(), reader),
                           "DaemonSet/gpu-operator/nvidia-container-toolkit-daemonset")
    # The toolkit stays: the warning says how to set it up as node setup would, never to switch it off.
    assert f"{migration.TOOLKIT_ENVVAR_ENV}=false and {migration.TOOLKIT_VOLUME_MOUNTS_ENV}=true" in toolkit.message
    assert "gpu.deploy.container-toolkit=false" not in toolkit.message
    quiet = config({"name": "a30", "nodeGroup": "gpu-a30"}, monitoring={"enabled": False})
    assert "nvidia-dcgm-exporter" not in {f.subject.rsplit("/", 1)[1] for f in migration.findings(quiet, reader)}


def test_the_mig_manager_only_where_the_operator_would_start_it() -> None:
    reader = FakeReader().add(cluster_policy(), *a30_nodes(1, **{"nvidia.com/mig.capable": "false"}),
                              operand("mig-manager", "nvidia-mig-manager"))
    assert migration.findings(config(), reader) == []


def test_a_toolkit_container_group_cannot_share_nodes_with_the_operators_toolkit() -> None:
    group = {"name": "a30", "nodeGroup": "gpu-a30", "toolkit": {"source": "container"}}
    reader = FakeReader().add(cluster_policy(), *a30_nodes(1),
                              operand("container-toolkit", "nvidia-container-toolkit-daemonset"))
    [f] = migration.findings(config(group), reader)
    assert f.severity is Severity.ERROR and "toolkit.source is container" in f.message


@pytest.mark.parametrize(("source", "severity", "says"), [
    ("container", Severity.ERROR, "two driver containers"),
    ("preinstalled", Severity.WARNING, "declare gpuOperator"),
])
def test_the_operators_driver_beside_the_groups_driver_source(source: str, severity: Severity, says: str) -> None:
    group = {"name": "a30", "nodeGroup": "gpu-a30", "gpu": {"driver": {"source": source, "version": "550.54.15",
                                                                       "osReleases": ["ubuntu22.04"]}}}
    if source == "preinstalled":
        del group["gpu"]["driver"]["osReleases"]  # type: ignore[index]
    reader = FakeReader().add(cluster_policy(), *a30_nodes(1), operand("driver", "nvidia-driver-daemonset"))
    [f] = migration.findings(config(group), reader)
    assert f.severity is severity and says in f.message
    # Only a driver the stack replaces is handed over; the operator's stays otherwise.
    assert ("nvidia.com/gpu.deploy.driver=false" in f.message) is (severity is Severity.ERROR)


def test_a_gpu_operator_group_needs_the_driver_crd_and_its_own_driver_daemonsets_are_not_foreign() -> None:
    group = {"name": "a30", "nodeGroup": "gpu-a30", "gpu": {"driver": {"source": "gpuOperator",
                                                                       "version": "550.54.15"}}}
    ours = operand("driver", "nvidia-gpu-driver-ubuntu22.04-abc")
    ours["metadata"]["ownerReferences"] = [{"kind": "NVIDIADriver", "name": "nvidia-gpu-driver-a30"}]
    reader = FakeReader().add(cluster_policy(driver={"enabled": True}), *a30_nodes(1), ours)
    [f] = migration.findings(config(group), reader)
    assert (f.subject, f.severity) == ("ClusterPolicy/cluster-policy", Severity.ERROR)
    assert migration.use_driver_crd_command() in f.message
    reader.objects[0] = cluster_policy(driver={"useNvidiaDriverCRD": True})
    assert migration.findings(config(group), reader) == []
    nobody = FakeReader().add(*a30_nodes(1))
    [f] = migration.findings(config(group), nobody)
    assert f.severity is Severity.WARNING and "no GPU Operator" in f.message


def test_the_device_plugin_chart_is_found_by_its_image_and_handed_over_through_its_affinity() -> None:
    nodes = a30_nodes(2, **{"feature.node.kubernetes.io/pci-10de.present": "true"})
    reader = FakeReader().add(*nodes, chart_plugin())
    [f] = migration.findings(config(), reader)
    assert f.subject == "DaemonSet/nvidia-device-plugin/nvdp-nvidia-device-plugin"
    assert f.severity is Severity.ERROR and "NVIDIA device-plugin chart's device-plugin" in f.message
    assert migration.helm_command("nvdp", "nvidia-device-plugin", "-f affinity.yaml") in f.message
    assert "{key: nvidia.com/gpu.deploy.device-plugin, operator: NotIn, values: ['false']}" in f.message
    # The handover the message describes: the affinity term excludes nodes labelled off, and they are.
    handed = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [*t["matchExpressions"], {"key": "nvidia.com/gpu.deploy.device-plugin",
                                                       "operator": "NotIn", "values": ["false"]}]}
        for t in CHART_AFFINITY["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    ]}}}
    off = a30_nodes(2, **{"feature.node.kubernetes.io/pci-10de.present": "true",
                          "nvidia.com/gpu.deploy.device-plugin": "false"})
    assert migration.findings(config(), FakeReader().add(*off, chart_plugin(handed))) == []


def test_a_chart_that_does_not_tolerate_the_groups_taint_would_not_start_there() -> None:
    group = {"name": "a30", "nodeGroup": "gpu-a30",
             "extraTaints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}
    nodes = a30_nodes(1, **{"feature.node.kubernetes.io/pci-10de.present": "true"})
    assert migration.findings(config(group), FakeReader().add(*nodes, chart_plugin())) == []


def test_the_chart_gfd_and_the_standalone_gfd_image_are_label_writers() -> None:
    gfd = daemonset("nvdp-gpu-feature-discovery", "nvidia-device-plugin", {
        "nodeSelector": {"nvidia.com/gpu.present": "true"}, "tolerations": [GPU_TOLERATION],
        "containers": [{"name": "gfd", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                        "command": ["gpu-feature-discovery"]}]})
    reader = FakeReader().add(*a30_nodes(1, **{"nvidia.com/gpu.present": "true"}), gfd)
    [f] = migration.findings(config(), reader)
    assert f.severity is Severity.ERROR and "nvidia.com/gpu.* node labels" in f.message
    # One affinity value places all of the chart's DaemonSets: the device plugin's key excludes GFD too.
    assert "{key: nvidia.com/gpu.deploy.device-plugin, operator: NotIn" in f.message


def test_nvidias_dra_kubelet_plugin_collides_with_either_allocation_mode() -> None:
    plugin = daemonset("nvidia-dra-driver-gpu-kubelet-plugin", "nvidia-dra-driver-gpu", {
        "tolerations": [GPU_TOLERATION],
        "containers": [{"name": "gpus", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0",
                        "command": ["bash", "-c"], "args": ["gpu-kubelet-plugin -v $(LOG_VERBOSITY)"]}]})
    for mode, says in (("dra", "two DRA kubelet plugins"), ("devicePlugin", "its DRA driver would allocate")):
        group = {"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}}, "allocationMode": mode}
        [f] = migration.findings(config(group), FakeReader().add(node("l4-0", {"pool": "l4"}), plugin))
        assert f.severity is Severity.ERROR and says in f.message
        assert "resources.gpus.enabled=false" in f.message and "-l 'pool=l4'" in f.message


def test_the_stacks_own_daemonsets_are_not_foreign_but_the_operators_gfd_with_our_part_of_label_is() -> None:
    ours = daemonset("device-plugin-a30", "nvidia-gpu", {"containers": [
        {"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}]},
        labels=app_labels("device-plugin", "nvidia-gpu", node_group="a30"))
    assert migration.classify(ours) is None
    operators = operand("gpu-feature-discovery", "gpu-feature-discovery")
    operators["metadata"]["labels"]["app.kubernetes.io/part-of"] = "nvidia-gpu"
    found = migration.classify(operators)
    assert found is not None and (found.owner, found.role) == (migration.Owner.OPERATOR, migration.Role.GFD)


def test_deckhouse_gpu_settings_on_the_stacks_node_group() -> None:
    ng: dict[str, Any] = {"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": "gpu-a30"},
          "spec": {"nodeType": "Static", "gpu": {"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4}}}}
    module = {"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": "gpu"},
              "spec": {"enabled": True, "version": 1, "settings": {"dra": {"enabled": False}}}}
    reader = FakeReader().add(ng, module)
    [f] = migration.findings(config(nodeSetup="deckhouse"), reader)
    assert (f.subject, f.severity) == ("NodeGroup/gpu-a30", Severity.ERROR)
    assert "the gpu module (ModuleConfig gpu is enabled)" in f.message
    assert migration.remove_gpu_command("gpu-a30") in f.message
    del ng["spec"]["gpu"]
    [f] = migration.findings(config(nodeSetup="deckhouse"), reader)
    assert (f.subject, f.severity) == ("ModuleConfig/gpu", Severity.WARNING)
    assert migration.module_off_command() in f.message


def test_deckhouses_device_plugin_on_the_stacks_nodes() -> None:
    plugin = daemonset("nvidia-device-plugin-3f2a1b9", "d8-nvidia-gpu", {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["0"]},
                                  {"key": "node.deckhouse.io/group", "operator": "In", "values": ["gpu-a30"]}]}]}}},
        "tolerations": [GPU_TOLERATION], "containers": [{"name": "nvidia-device-plugin-ctr", "image": "x"}]})
    reader = FakeReader().add(*a30_nodes(1, **{"nvidia.com/gpu.count": "2"}), plugin)
    [f] = migration.findings(config(), reader)
    assert f.severity is Severity.ERROR and "Deckhouse GPU support's device-plugin" in f.message
    assert migration.remove_gpu_command("gpu-a30") in f.message


def test_a_group_without_nodes_is_warned_of_what_the_operator_would_start() -> None:
    reader = FakeReader().add(cluster_policy(migManager={"enabled": False}))
    [f] = migration.findings(config(), reader)
    assert f.severity is Severity.WARNING and f.subject == "ClusterPolicy/cluster-policy"
    assert "nvidia.com/gpu.deploy.device-plugin=false, nvidia.com/gpu.deploy.gpu-feature-discovery=false" in f.message
    assert "mig-manager" not in f.message and "NodeGroup gpu-a30's spec.nodeTemplate.labels" in f.message


def test_a_fleet_is_read_once_and_only_colliding_daemonsets_pods_are_listed() -> None:
    fleet = a30_nodes(1000, **{"nvidia.com/gpu.deploy.device-plugin": "false"})
    others = [daemonset(f"other-{i}", "kube-system", {"containers": [{"name": "c", "image": "busybox"}]})
              for i in range(50)]
    reader = FakeReader().add(cluster_policy(), *fleet, *others, operand("device-plugin", "dp"),
                              operand("gpu-feature-discovery", "gfd"))
    found = migration.findings(config(), reader)
    assert [f.subject for f in found] == ["DaemonSet/gpu-operator/gfd"] and "1000 node(s)" in found[0].message
    lists = [r for r in reader.reads if r[0] == "list"]
    assert [r[1] for r in lists].count("Node") == 1 and [r[1] for r in lists].count("DaemonSet") == 1
    assert [r for r in lists if r[1] == "Pod"] == [("list", "Pod", "app=dp"), ("list", "Pod", "app=gfd")]


def test_selector_text_is_what_kubectl_takes() -> None:
    group = config({"name": "g", "nodeSelector": {"matchLabels": {"pool": "gpu"}, "matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a", "b"]},
        {"key": "spot", "operator": "DoesNotExist"}]}}).node_groups[0]
    assert migration.selector_text(group) == "pool=gpu,zone in (a,b),!spot"


def test_nvidias_device_classes_where_the_stack_would_create_its_own() -> None:
    nvidias: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {
        "name": "gpu.nvidia.com", "labels": {"helm.sh/chart": "nvidia-dra-driver-gpu-25.8.0"},
        "annotations": {"meta.helm.sh/release-name": "dra", "meta.helm.sh/release-namespace": "nvidia-dra"}}}
    group = {"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}}, "allocationMode": "dra"}
    [f] = migration.findings(config(group), FakeReader().add(nvidias))
    assert (f.subject, f.severity) == ("DeviceClass/gpu.nvidia.com", Severity.ERROR)
    assert migration.helm_command("dra", "nvidia-dra", "--set resources.gpus.enabled=false") in f.message
    assert "cluster.dra.createDeviceClasses: false" in f.message
    assert migration.findings(config(group, dra={"createDeviceClasses": False}), FakeReader().add(nvidias)) == []
    nvidias["metadata"]["labels"] = app_labels("dra-device-class", "nvidia-gpu")  # a stack's: not ours to say
    assert migration.findings(config(group), FakeReader().add(nvidias)) == []


@pytest.mark.parametrize(("spec", "admitted"), [
    ({}, True),
    ({"nodeSelector": {"pool": "a"}}, True),
    ({"nodeSelector": {"pool": "b"}}, False),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": []}]}}}}, False),  # an empty term matches no node
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["1"]}]}]}}}}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["2"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"},
                              {"key": "pool", "operator": "NotIn", "values": ["a"]}]}]}}}}, False),
])
def test_placement_is_evaluated_as_the_scheduler_does(spec: dict[str, Any], admitted: bool) -> None:
    assert migration.selects(spec, {"pool": "a", "gpus": "2"}, "n1") is admitted


def test_tolerations_as_the_daemonset_controller_applies_them() -> None:
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    dedicated = {"key": "dedicated", "value": "ml", "effect": "NoExecute"}
    lifecycle = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    soft = {"key": "soft", "effect": "PreferNoSchedule"}
    assert migration.admits({"tolerations": [GPU_TOLERATION]}, [gpu, lifecycle, soft])
    assert not migration.admits({"tolerations": [GPU_TOLERATION]}, [gpu, dedicated])
    assert migration.admits({"tolerations": [GPU_TOLERATION, {"key": "dedicated", "operator": "Equal",
                                                               "value": "ml"}]}, [gpu, dedicated])
    assert migration.admits({"tolerations": [{"operator": "Exists"}]}, [gpu, dedicated])


def test_every_kind_the_preflight_reads_is_one_the_preview_identity_may_read() -> None:
    """The preview identity's role grants reads of the stack's own kinds and of ``PREFLIGHT_READS``: every read
    the preflight makes (other stacks, then other installations) must be among them, or the preview identity's
    preview would skip the check."""
    class Probe(FakeReader):
        def conflicts(self, obj: dict[str, Any], field_manager: str) -> builtins.list[Conflict]:
            return []

    dra_group = {"name": "h200", "nodeGroup": "gpu-h200", "allocationMode": "dra"}
    reader = Probe()
    reader.add(cluster_policy(), *a30_nodes(2), operand("device-plugin", "nvidia-device-plugin-daemonset"))
    stack = config({"name": "a30", "nodeGroup": "gpu-a30"}, dra_group, nodeSetup="deckhouse")
    stacks.findings(stack, "nvidia-gpu/dev", reader, reader)
    migration.findings(stack, reader)
    read = {kind for _, kind, _ in reader.reads}
    assert {"Pod", "Node", "DaemonSet", "ClusterPolicy", "NodeGroup"} <= read, read
    assert read <= {kind for _, kind in PREFLIGHT_READS}, read - {kind for _, kind in PREFLIGHT_READS}
