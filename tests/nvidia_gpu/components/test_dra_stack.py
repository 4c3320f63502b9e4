"""The DraStack component: DeviceClasses, RBAC, the admission policy, quotas and the kubelet-plugin
DaemonSet; mock-engine wiring (parents, delete ordering); and schema validity on 1.34 and 1.35."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from node_agent.dra.devices import allocatable_devices
from node_agent.dra.slices import NodeRef, build_slices
from nvgpu.stackconfig import GroupPlan
from nvidia_gpu.components.manifests import dra
from nvidia_gpu.components.program import build_stack
from tests.kit.dra_builders import DRIVER, NODE, machine
from tests.nvidia_gpu.components.component_helpers import Engine, engine, group, of_kind, stack_config  # noqa: F401

DATA = Path(__file__).parent / "data"


def dra_config(**dra_settings: Any) -> Any:
    groups = [group("h100", "MIG", model="H100-80GB", mig={"partedConfig": "all-1g.10gb"}),
              {**group("h200"), "allocationMode": "dra"}, {**group("a100"), "allocationMode": "dra"}]
    return stack_config(groups, dra=dra_settings) if dra_settings else stack_config(groups)


def test_device_classes_select_driver_and_type() -> None:
    classes = {c.name: dra.device_class("gpu.example.com", c) for c in dra.DEVICE_CLASSES}
    assert set(classes) == {"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"}
    expr = classes["mig.nvidia.com"]["spec"]["selectors"][0]["cel"]["expression"]
    assert expr == "device.driver == 'gpu.example.com' && device.attributes['gpu.example.com'].type == 'mig'"
    assert "extendedResourceName" not in classes["gpu.nvidia.com"]["spec"]


def test_rbac_is_exactly_what_the_plugin_calls() -> None:
    rules = dra.cluster_role("ns")["rules"]
    assert rules == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    assert all("*" not in v for r in rules for v in (*r["verbs"], *r["resources"], *r["apiGroups"]))
    [marker] = dra.marker_role("ns")["rules"]
    assert marker == {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [dra.UNINSTALL_MARKER],
                      "verbs": ["get", "watch", "patch"]}


def test_admission_policy_confines_the_plugin_to_its_node() -> None:
    policy = dra.admission_policy("nvidia-gpu", DRIVER)["spec"]
    assert policy["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:nvidia-gpu:dra-kubelet-plugin'")
    rules = policy["matchConstraints"]["resourceRules"][0]
    assert rules["resources"] == ["resourceslices"] and set(rules["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    checks = [v["expression"] for v in policy["validations"]]
    assert "variables.userNodeName == variables.objectNodeName" in checks
    assert f"variables.slice.spec.driver == '{DRIVER}'" in checks
    binding = dra.admission_policy_binding("nvidia-gpu")["spec"]
    assert binding == {"policyName": "nvidia-gpu-dra-slices-own-node", "validationActions": ["Deny"]}


def test_claim_quota_keys() -> None:
    cfg = dra_config(claimQuotas=[{"namespace": "team-a", "claims": 10, "devices": {"gpu.nvidia.com": 4}}])
    quota = dra.claim_quota("nvidia-gpu", cfg.cluster.dra.claim_quotas[0])
    assert quota["metadata"]["namespace"] == "team-a"
    assert quota["spec"]["hard"] == {"count/resourceclaims.resource.k8s.io": "10",
                                     "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4"}


def test_plugin_daemonset_mounts_and_placement() -> None:
    cfg = dra_config(driverName="gpu.example.com")
    h200 = cfg.node_groups[1]
    ds = dra.plugin_daemonset("nvidia-gpu", cfg.cluster, h200, GroupPlan.of(cfg.cluster, h200))
    pod = ds["spec"]["template"]["spec"]
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"} <= paths
    [container] = pod["containers"]
    assert container["args"][:5] == ["--driver-root", "/driver-root", "dra-driver", "--driver-name", "gpu.example.com"]
    assert {"name": "plugins", "mountPath": "/var/lib/kubelet/plugins", "mountPropagation": "Bidirectional"} in \
        container["volumeMounts"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "node.deckhouse.io/group", "operator": "In", "values": ["ng-h200"]} in terms[0]["matchExpressions"]
    assert {"key": "node.deckhouse.io/gpu-setup-complete", "operator": "Exists"} in terms[0]["matchExpressions"]
    assert pod["serviceAccountName"] == "dra-kubelet-plugin"


def test_stack_registers_dra_stack_only_for_dra_groups(engine: Engine) -> None:  # noqa: F811
    cfg = dra_config(claimQuotas=[{"namespace": "team-a", "claims": 10}])
    resources = engine.run(lambda: build_stack(cfg))
    [component] = [r for r in resources if r.type_token == "nvidia-gpu:index:DraStack"]
    children = [r for r in resources if r.parent_urn == component.urn]
    kinds = sorted(r.inputs["kind"] for r in children)
    assert kinds == sorted(["DeviceClass"] * 3 + ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                   "RoleBinding", "ValidatingAdmissionPolicy",
                                                   "ValidatingAdmissionPolicyBinding", "ResourceQuota",
                                                   "DaemonSet", "DaemonSet", "ConfigMap"])
    plugins = [r for r in of_kind(resources, "DaemonSet") if r.inputs["metadata"]["name"].startswith("dra-")]
    assert sorted(p.inputs["metadata"]["name"] for p in plugins) == ["dra-kubelet-plugin-a100",
                                                                      "dra-kubelet-plugin-h200"]
    # Every other child is a dependency of the marker, so Pulumi deletes the marker first on uninstall.
    [marker] = [r for r in children if r.inputs["kind"] == "ConfigMap"]
    others = {r.urn for r in children if r is not marker and r.inputs["kind"] not in ("ResourceQuota",)}
    assert others <= set(marker.dependencies)


def test_device_plugin_only_stack_has_no_dra_stack(engine: Engine) -> None:  # noqa: F811
    cfg = stack_config([group("l4")])
    resources = engine.run(lambda: build_stack(cfg))
    assert not [r for r in resources if r.type_token == "nvidia-gpu:index:DraStack"]


def _docs() -> list[dict[str, Any]]:
    cfg = dra_config(claimQuotas=[{"namespace": "team-a", "claims": 10, "devices": {"mig.nvidia.com": 7}}])
    h200 = cfg.node_groups[1]
    out = [dra.device_class(DRIVER, c) for c in dra.DEVICE_CLASSES]
    out += [dra.service_account("nvidia-gpu"), dra.cluster_role("nvidia-gpu"), dra.cluster_role_binding("nvidia-gpu"),
            dra.marker_role("nvidia-gpu"), dra.marker_role_binding("nvidia-gpu"),
            dra.admission_policy("nvidia-gpu", DRIVER), dra.admission_policy_binding("nvidia-gpu"),
            dra.claim_quota("nvidia-gpu", cfg.cluster.dra.claim_quotas[0]), dra.uninstall_marker("nvidia-gpu", DRIVER),
            dra.plugin_daemonset("nvidia-gpu", cfg.cluster, h200, GroupPlan.of(cfg.cluster, h200))]
    for f in sorted(DATA.glob("nvidia-dra-demo-*.yaml")):
        out += [d for d in yaml.safe_load_all(f.read_text()) if d]
    out += build_slices(allocatable_devices(machine(gpus=2, mig_on=(1,), vfio=1)), DRIVER, NodeRef(NODE, "u"), 1)
    return out


@pytest.mark.parametrize("version", ["1.34.0", "1.35.0"])
def test_rendered_objects_and_demo_claims_validate_strictly(version: str) -> None:
    docs = _docs()
    kinds = {d["kind"] for d in docs}
    assert {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice", "DaemonSet"} <= kinds
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_daemonset_backend_prepares_vfio_only_for_passthrough_groups(engine: Engine) -> None:  # noqa: F811
    groups: list[dict[str, Any]] = [
        {"name": "vm", "nodeSelector": {"matchLabels": {"gpu": "vm"}}, "allocationMode": "dra", "passthrough": True},
        {"name": "ai", "nodeSelector": {"matchLabels": {"gpu": "ai"}}, "allocationMode": "dra"},
    ]
    cfg = stack_config(groups, node_setup="daemonset")
    resources = engine.run(lambda: build_stack(cfg))
    setup = {r.inputs["metadata"]["name"]: r.inputs["spec"]["template"]["spec"]["initContainers"][0]["args"]
             for r in of_kind(resources, "DaemonSet") if r.inputs["metadata"]["name"].startswith("gpu-setup")}
    assert setup == {"gpu-setup-vm": ["--host-root", "/host", "--driver-root", "/driver-root", "setup", "--dra"],
                     "gpu-setup-ai": ["--host-root", "/host", "--driver-root", "/driver-root", "setup"]}
