"""Kubernetes security policies: one passing and one failing resource per rule, exact messages."""

from __future__ import annotations

import pytest
import yaml
from pulumi_policy import EnforcementLevel

from nvidia_gpu.policies.k8s_security import image_problem
from tests.nvidia_gpu.policies.policy_fixtures import (
    CM_TYPE,
    DS_TYPE,
    NS_TYPE,
    ROLE_TYPE,
    check,
    cluster_role,
    container,
    daemonset,
    namespace,
    policy,
)

BINDING_TYPE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"

# ------------------------------------------------------------------ host-access-allow-listed: privileged


def test_privileged_allowed_for_allow_listed_roles() -> None:
    ds = daemonset(containers=[container(securityContext={"privileged": True})])
    assert check("host-access-allow-listed", DS_TYPE, ds) == []


def test_privileged_container_outside_the_allow_list() -> None:
    ds = daemonset("exporter", role="exporter",
                   containers=[container("exporter", securityContext={"privileged": True,
                                                                       "capabilities": {"add": ["SYS_ADMIN"]}})])
    assert check("host-access-allow-listed", DS_TYPE, ds) == [
        "DaemonSet 'exporter' (role 'exporter'): container 'exporter' is privileged",
        "DaemonSet 'exporter' (role 'exporter'): container 'exporter' adds capability SYS_ADMIN",
    ]


def test_privileged_allow_list_from_policy_config() -> None:
    ds = daemonset(containers=[container(securityContext={"privileged": True})])
    assert check("host-access-allow-listed", DS_TYPE, ds, {"privilegedRoles": ["gpu-setup"]}) == [
        "DaemonSet 'device-plugin-h100' (role 'device-plugin'): container 'agent' is privileged"
    ]


# ------------------------------------------------------------------ host-access-allow-listed: hostPath


def test_host_path_for_allow_listed_role_passes() -> None:
    ds = daemonset(volumes=[{"name": "dp", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}])
    assert check("host-access-allow-listed", DS_TYPE, ds) == []


def test_host_path_outside_the_allow_list() -> None:
    ds = daemonset("exporter", role="exporter", volumes=[{"name": "root", "hostPath": {"path": "/"}},
                                                         {"name": "tmp", "emptyDir": {}}])
    assert check("host-access-allow-listed", DS_TYPE, ds) == [
        "DaemonSet 'exporter' (role 'exporter'): volume 'root' mounts host path /"
    ]


# ------------------------------------------------------------------ host-access-allow-listed: host namespaces


def test_host_namespaces_off_pass() -> None:
    assert check("host-access-allow-listed", DS_TYPE, daemonset(hostPID=False)) == []


def test_host_namespaces_need_the_allow_list() -> None:
    ds = daemonset("mig-manager", role="mig-manager", hostPID=True, hostNetwork=True)
    assert check("host-access-allow-listed", DS_TYPE, ds) == [
        "DaemonSet 'mig-manager' (role 'mig-manager') sets hostPID: true",
        "DaemonSet 'mig-manager' (role 'mig-manager') sets hostNetwork: true",
    ]
    assert check("host-access-allow-listed", DS_TYPE, ds, {"hostPID": ["mig-manager"]}) == [
        "DaemonSet 'mig-manager' (role 'mig-manager') sets hostNetwork: true",
    ]


# ------------------------------------------------------------------ pinned-images


@pytest.mark.parametrize("image", ["repo/agent:0.1.0", "registry:5000/agent:1.2", "agent@sha256:" + "a" * 64])
def test_pinned_images_pass(image: str) -> None:
    assert image_problem(image) is None
    assert check("pinned-images", DS_TYPE, daemonset(containers=[container(image=image)])) == []


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        ("repo/agent:latest", "uses the tag latest"),
        ("registry:5000/agent", "has no tag (Kubernetes pulls latest)"),
    ],
)
def test_unpinned_images(image: str, problem: str) -> None:
    assert check("pinned-images", DS_TYPE, daemonset(containers=[container(image=image)])) == [
        f"DaemonSet 'device-plugin-h100': container 'agent' image {image} {problem}"
    ]


def test_digest_required_by_config() -> None:
    ds = daemonset(initContainers=[container("init")])
    assert check("pinned-images", DS_TYPE, ds, {"requireDigest": True}) == [
        "DaemonSet 'device-plugin-h100': initContainer 'init' image registry.example.com/nvidia-gpu-agent:0.1.0 "
        "is not pinned by digest (@sha256:...)",
        "DaemonSet 'device-plugin-h100': container 'device-plugin' image registry.example.com/nvidia-gpu-agent:0.1.0 "
        "is not pinned by digest (@sha256:...)",
    ]


# ------------------------------------------------------------------ container-resources


def test_containers_with_requests_and_limits_pass() -> None:
    assert check("container-resources", DS_TYPE, daemonset(initContainers=[container("init")])) == []


def test_container_without_limits() -> None:
    bare = container("init")
    bare["resources"] = {"requests": {"cpu": "10m"}}
    assert check("container-resources", DS_TYPE, daemonset(initContainers=[bare])) == [
        "DaemonSet 'device-plugin-h100': initContainer 'init' has no requests.memory, limits.cpu, limits.memory"
    ]
    assert check("container-resources", DS_TYPE, daemonset(initContainers=[bare]),
                 {"requests": ["cpu"], "limits": []}) == []


# ------------------------------------------------------------------ rbac-least-privilege


READ_NODES = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}


def test_spelled_out_rbac_passes() -> None:
    role = cluster_role([READ_NODES])
    assert check("rbac-least-privilege", ROLE_TYPE, role) == []
    assert check("rbac-least-privilege", ROLE_TYPE, role) == []


def test_rbac_wildcards() -> None:
    role = cluster_role([READ_NODES, {"apiGroups": ["apps"], "resources": ["*"], "verbs": ["get", "*"]}])
    assert check("rbac-least-privilege", ROLE_TYPE, role) == [
        "ClusterRole 'reader' rules[1].resources has a wildcard: *",
        "ClusterRole 'reader' rules[1].verbs has a wildcard: get, *",
    ]


def test_rbac_secrets_access() -> None:
    role = cluster_role([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"]},
                         {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]},
                         {"apiGroups": [""], "resources": ["secrets/proxy"], "verbs": ["get"]}])
    assert check("rbac-least-privilege", ROLE_TYPE, role) == [
        "ClusterRole 'reader' rules[0] grants access to secrets",
        "ClusterRole 'reader' rules[2] grants access to secrets",
    ]


def test_rbac_wildcard_group_reaches_secrets_too() -> None:
    role = cluster_role([{"apiGroups": ["*"], "resources": ["pods"], "verbs": ["list"]}])
    assert check("rbac-least-privilege", ROLE_TYPE, role) == [
        "ClusterRole 'reader' rules[0].apiGroups has a wildcard: *",
    ]
    role = cluster_role([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["list"]}])
    assert check("rbac-least-privilege", ROLE_TYPE, role) == [
        "ClusterRole 'reader' rules[0].apiGroups has a wildcard: *",
        "ClusterRole 'reader' rules[0].resources has a wildcard: *",
        "ClusterRole 'reader' rules[0] grants access to secrets",
    ]


def _binding(role: str) -> dict[str, object]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "b"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": "nvidia-gpu"}]}


def test_binding_to_the_stacks_own_role_passes() -> None:
    assert check("rbac-least-privilege", BINDING_TYPE, _binding("nvidia-gpu-device-plugin")) == []


@pytest.mark.parametrize("role", ["cluster-admin", "edit", "system:controller:node-controller"])
def test_binding_to_broad_builtin_roles(role: str) -> None:
    assert check("rbac-least-privilege", BINDING_TYPE, _binding(role)) == [
        f"ClusterRoleBinding 'b' binds the built-in ClusterRole {role!r} (wildcards or Secrets)"
    ]


# ------------------------------------------------------------------ namespace-pod-security


def test_namespace_with_pod_security_labels_passes() -> None:
    ns = namespace(labels_={"pod-security.kubernetes.io/enforce": "privileged"})
    assert check("namespace-pod-security", NS_TYPE, ns) == []


def test_namespace_without_pod_security_labels() -> None:
    assert check("namespace-pod-security", NS_TYPE, namespace()) == [
        "Namespace 'nvidia-gpu' has no pod-security.kubernetes.io/enforce label"
    ]
    ns = namespace(labels_={"pod-security.kubernetes.io/enforce": "privileged"})
    config = {"modes": ["enforce", "warn"], "allowedLevels": ["baseline", "restricted"]}
    assert check("namespace-pod-security", NS_TYPE, ns, config) == [
        "Namespace 'nvidia-gpu' pod-security.kubernetes.io/enforce=privileged is not one of baseline, restricted",
        "Namespace 'nvidia-gpu' has no pod-security.kubernetes.io/warn label",
    ]


# ------------------------------------------------------------------ gpus-only-as-allocated


def _plugin_config(**plugin: object) -> dict[str, object]:
    doc = {"version": "v1", "flags": {"migStrategy": "none", "plugin": {"deviceIDStrategy": "uuid", **plugin}}}
    return {"metadata": {"name": "device-plugin-config-h100"}, "data": {"Exclusive": yaml.safe_dump(doc)}}


@pytest.mark.parametrize("strategy", [["volume-mounts"], ["cdi-cri"], "volume-mounts,cdi-annotations"])
def test_device_lists_a_pod_cannot_forge_pass(strategy: object) -> None:
    assert check("gpus-only-as-allocated", CM_TYPE, _plugin_config(deviceListStrategy=strategy)) == []


def test_envvar_device_list_is_warned_about() -> None:
    tail = ("the NVIDIA toolkit must then honour NVIDIA_VISIBLE_DEVICES in unprivileged containers, so any pod on "
            "these nodes can take every GPU by setting NVIDIA_VISIBLE_DEVICES=all; use volume-mounts or cdi-cri "
            "(gpu.deviceListStrategy)")
    assert check("gpus-only-as-allocated", CM_TYPE, _plugin_config(deviceListStrategy=["volume-mounts", "envvar"])) == [
        f"ConfigMap 'device-plugin-config-h100' data[Exclusive]: deviceListStrategy includes envvar: {tail}"]
    assert check("gpus-only-as-allocated", CM_TYPE, _plugin_config()) == [
        f"ConfigMap 'device-plugin-config-h100' data[Exclusive]: no deviceListStrategy, so envvar: {tail}"]
    other = {"metadata": {"name": "mig-parted"}, "data": {"config.yaml": "version: v1\nmig-configs: {}\n"}}
    assert check("gpus-only-as-allocated", CM_TYPE, other) == []


def test_envvar_is_said_once_per_config_map() -> None:
    """A node group's ConfigMap carries one config per sharing variant; the advisory names them all in one line
    (it used to be printed once per config, four times for one setting)."""
    cm = _plugin_config(deviceListStrategy="envvar")
    data = cm["data"]
    assert isinstance(data, dict)
    cm["data"] = {name: data["Exclusive"] for name in ("Exclusive", "TimeSlicing", "MPS", "default")}
    (line,) = check("gpus-only-as-allocated", CM_TYPE, cm)
    assert line.startswith("ConfigMap 'device-plugin-config-h100' data[Exclusive], data[TimeSlicing], data[MPS], "
                           "data[default]: deviceListStrategy includes envvar"), line


def test_envvar_policy_is_advisory() -> None:
    assert policy("gpus-only-as-allocated").enforcement_level is EnforcementLevel.ADVISORY
