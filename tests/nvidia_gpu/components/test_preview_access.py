"""The preview identity's objects (``cluster.previewIdentity``): its config, the role derived from what the
stack registers, and the policy keeping it to dry-runs. ``tests/cluster/test_preview_identity.py`` runs them
against the real API server, CLI and provider."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nvgpu.stackconfig import PreviewIdentity, StackConfigError, load_stack_config
from nvidia_gpu.components.manifests import previewaccess
from nvidia_gpu.components.manifests.previewaccess import Applied
from nvidia_gpu.components.platform import GpuPlatformArgs

CLUSTER: dict[str, Any] = {
    "kubernetesVersion": "1.34",
    "nodeSetup": "deckhouse",
    "agentImage": {"repository": "registry.example.com/agent", "tag": "0.1.0"},
}
GROUP: dict[str, Any] = {"name": "l4", "nodeGroup": "gpu-l4", "gpu": {"sharing": "Exclusive"}}
SA = PreviewIdentity(kind="ServiceAccount", name="previewer", namespace="ci")


def _problems(identity: Any, version: str = "1.34") -> list[str]:
    cluster = {**copy.deepcopy(CLUSTER), "kubernetesVersion": version, "previewIdentity": identity}
    with pytest.raises(StackConfigError) as err:
        load_stack_config({"cluster": cluster, "nodeGroups": [copy.deepcopy(GROUP)]})
    return err.value.problems


def test_the_config_names_the_identity_and_refuses_what_cannot_be_bound() -> None:
    config = load_stack_config({"cluster": {**CLUSTER, "previewIdentity": {"kind": "Group", "name": "ci-previews"}},
                                "nodeGroups": [GROUP]})
    assert config.cluster.preview_identity == PreviewIdentity(kind="Group", name="ci-previews")
    assert _problems({"kind": "ServiceAccount", "name": "previewer"}) == [
        "nvidia-gpu:cluster.previewIdentity.namespace: required for a ServiceAccount: the namespace it lives in"]
    assert _problems({"kind": "User", "name": "ci", "namespace": "ci"}) == [
        "nvidia-gpu:cluster.previewIdentity.namespace: only a ServiceAccount has a namespace, not a User"]
    (quote,) = _problems({"kind": "User", "name": "o'brien"})
    assert quote.startswith("nvidia-gpu:cluster.previewIdentity.name: \"o'brien\" is not a user name"), quote
    (old,) = _problems({"kind": "User", "name": "ci"}, version="1.29")
    assert old.startswith("nvidia-gpu:cluster.previewIdentity: needs Kubernetes 1.30 or later"), old


@pytest.mark.parametrize(("api_version", "kind", "resource"), [
    ("v1", "Namespace", "namespaces"), ("v1", "ResourceQuota", "resourcequotas"),
    ("apps/v1", "DaemonSet", "daemonsets"), ("node.k8s.io/v1", "RuntimeClass", "runtimeclasses"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    ("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules"),
])
def test_resources_are_the_plurals_the_server_serves(api_version: str, kind: str, resource: str) -> None:
    assert previewaccess.resource_of(api_version, kind).resource == resource


def _obj(api_version: str, kind: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, **extra}


def test_the_role_grants_dry_runs_of_what_is_applied_reads_of_what_is_read_and_no_admission_writes() -> None:
    role = _obj("rbac.authorization.k8s.io/v1", "ClusterRole", "gpu-labeller")
    binding = _obj("rbac.authorization.k8s.io/v1", "RoleBinding", "gpu-labeller",
                   roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpu-labeller"})
    objects = [Applied(_obj("apps/v1", "DaemonSet", "a"), True),
               Applied(_obj("deckhouse.io/v1", "NodeGroup", "g"), False),
               Applied(_obj("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "p"), True),
               Applied(role, True), Applied(binding, True)]
    rules = previewaccess.rules(objects)
    write = ["create", "get", "list", "patch", "watch"]
    assert rules == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": write},
        {"apiGroups": ["deckhouse.io"], "resources": ["nodegroups"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles", "rolebindings"], "verbs": write},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"],
         "resourceNames": ["gpu-labeller"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["bind"],
         "resourceNames": ["gpu-labeller"]},
    ]
    assert previewaccess.not_dry_run(objects) == ["ValidatingAdmissionPolicy"]


def test_the_identity_is_bound_only_after_the_policy_that_holds_it_to_dry_runs() -> None:
    kinds = [m["kind"] for m in previewaccess.manifests("nvidia-gpu", SA, [])]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
                     "ClusterRoleBinding"]
    policy = previewaccess.admission_policy("nvidia-gpu", SA)
    assert policy["spec"]["matchConditions"][0]["expression"] == \
        "request.userInfo.username == 'system:serviceaccount:ci:previewer'"
    assert policy["spec"]["validations"][0]["expression"] == "request.dryRun"
    group = previewaccess.admission_policy("nvidia-gpu", PreviewIdentity(kind="Group", name="ci-previews"))
    assert group["spec"]["matchConditions"][0]["expression"] == "'ci-previews' in request.userInfo.groups"
    # Its own role and binding are the stack's objects too: the identity can dry-run them.
    role = previewaccess.cluster_role("nvidia-gpu", [])
    assert {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"],
            "resourceNames": ["nvidia-gpu-preview-identity"]} in role["rules"]
    assert previewaccess.cluster_role_binding("nvidia-gpu", SA)["subjects"] == [
        {"kind": "ServiceAccount", "name": "previewer", "namespace": "ci"}]


def test_a_component_given_the_stack_setting_refuses_it() -> None:
    """Only ``build_stack`` sees every object the role must cover; a component would silently grant nothing."""
    with pytest.raises(ValueError, match=r"^GpuPlatformArgs.cluster.previewIdentity: a whole stack's setting"):
        GpuPlatformArgs(cluster={**CLUSTER, "previewIdentity": {"kind": "User", "name": "ci"}})
