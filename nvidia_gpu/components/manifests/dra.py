"""Pure builders of the DRA mode's objects: DeviceClasses, the kubelet-plugin DaemonSet, its RBAC, the
ValidatingAdmissionPolicy that pins each plugin to its own node's ResourceSlices, claim quotas and the
uninstall marker.

DeviceClasses keep NVIDIA's names and selectors (``gpu.nvidia.com``, ``mig.nvidia.com``,
``vfio.gpu.nvidia.com``; CEL on the driver and the ``type`` attribute), so claims written for NVIDIA's DRA
driver work unchanged. They deliberately do not set ``extendedResourceName: nvidia.com/gpu``: that field
needs the alpha DRAExtendedResource gate on 1.34/1.35, and in a cluster that runs device-plugin groups
beside DRA groups it would let the scheduler satisfy ``nvidia.com/gpu`` limits from DRA devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

from nvgpu import hostpaths
from nvgpu.nodescripts import NodeScript, facts
from nvgpu.stackconfig import ClaimQuota, Cluster, GroupPlan, NodeGroup
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.confinement import deny_binding
from nvidia_gpu.components.manifests.meta import (
    app_labels,
    cluster_object_name,
    group_object_name,
    selector_labels,
    shared_labels,
)
from nvidia_gpu.components.manifests.scheduling import node_affinity, tolerations
from nvidia_gpu.components.manifests.workloads import (
    CDI_HOOK_DIR,
    DRA_PLUGIN_METRICS_PORT,
    DRIVER_ROOT_ARGS,
    MPS_BASE_MIB,
    MPS_PER_GPU_MIB,
    MPS_SIZED_FOR_GPUS,
    cdi_hook_mount,
    cdi_hook_volume,
    driver_root_mount,
    driver_root_volume,
    metrics_port,
    pod_annotations,
    status_args,
)

RESOURCE_API = "resource.k8s.io/v1"
ADMISSION_API = "admissionregistration.k8s.io/v1"
RBAC_API = "rbac.authorization.k8s.io/v1"
COMPONENT = "dra-kubelet-plugin"
SERVICE_ACCOUNT = COMPONENT
#: ConfigMap whose deletion (first, on uninstall) makes every plugin withdraw its node's ResourceSlices.
UNINSTALL_MARKER = "dra-uninstall-marker"
CLEANUP_FINALIZER = "gpu.nvidia-gpu.io/dra-slices-cleanup"

PLUGINS_REGISTRY = hostpaths.KUBELET_PLUGINS_REGISTRY_DIR
PLUGINS = hostpaths.KUBELET_PLUGINS_DIR
CDI_DIR = facts.CDI_DYNAMIC_DIR
AGENT_STATE_DIR = facts.STATE_DIR
MPS_DIR = hostpaths.AGENT_RUN_DIR
AGENT = ["python", "-m", "node_agent"]
#: Runs just before gpu-vfio.sh (35): the kernel parameters must be in place before the IOMMU check.
IOMMU_SCRIPT_WEIGHT = 34


@dataclass(frozen=True)
class DeviceClassSpec:
    name: str
    type: str


DEVICE_CLASSES = (
    DeviceClassSpec("gpu.nvidia.com", "gpu"),
    DeviceClassSpec("mig.nvidia.com", "mig"),
    DeviceClassSpec("vfio.gpu.nvidia.com", "vfio"),
)


def selector(driver: str, device_type: str) -> str:
    return f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{device_type}'"


def device_class(driver: str, spec: DeviceClassSpec) -> Manifest:
    """Shared by every stack on the cluster (see :mod:`nvidia_gpu.components.manifests.shared`)."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": spec.name, "labels": shared_labels("dra-device-class")},
        "spec": {"selectors": [{"cel": {"expression": selector(driver, spec.type)}}]},
    }


def service_account(namespace: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace, "labels": app_labels(COMPONENT, namespace)},
        "automountServiceAccountToken": False,
    }


#: Exactly what the plugin calls: publish its slices, read the claims it prepares, read its Node's UID
#: (owner reference on the slices), and record Events on its Node (checkpoint recovery).
CLUSTER_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)


def cluster_role(namespace: str) -> Manifest:
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRole",
        "metadata": {"name": cluster_object_name(namespace, COMPONENT), "labels": app_labels(COMPONENT, namespace)},
        "rules": [dict(r) for r in CLUSTER_RULES],
    }


def cluster_role_binding(namespace: str) -> Manifest:
    name = cluster_object_name(namespace, COMPONENT)
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": app_labels(COMPONENT, namespace)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}],
    }


def marker_role(namespace: str) -> Manifest:
    """The plugin may only read, watch and un-finalize the one uninstall marker in its own namespace (a
    watch names it with ``fieldSelector=metadata.name=``, which is how RBAC's ``resourceNames`` admits one)."""
    return {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": {"name": COMPONENT, "namespace": namespace, "labels": app_labels(COMPONENT, namespace)},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [UNINSTALL_MARKER],
                   "verbs": ["get", "watch", "patch"]}],
    }


def marker_role_binding(namespace: str) -> Manifest:
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": {"name": COMPONENT, "namespace": namespace, "labels": app_labels(COMPONENT, namespace)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": COMPONENT},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}],
    }


def admission_policy(namespace: str, driver: str) -> Manifest:
    """Each plugin's service account may write only ResourceSlices of this driver on its own node.

    The node comes from the token's ``authentication.kubernetes.io/node-name`` claim (bound service-account
    tokens carry it: ServiceAccountTokenPodNodeInfo, on by default since 1.30)."""
    user = f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": cluster_object_name(namespace, "dra-slices-own-node"),
                     "labels": app_labels(COMPONENT, namespace)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"],
            }]},
            "matchConditions": [{"name": "is-dra-plugin", "expression": f"request.userInfo.username == '{user}'"}],
            "variables": [
                {"name": "userNodeName",
                 "expression": "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                {"name": "slice", "expression": "request.operation == 'DELETE' ? oldObject : object"},
                {"name": "objectNodeName", "expression": "variables.slice.spec.?nodeName.orValue('')"},
            ],
            # ``reason: Forbidden``: a denial here is about who writes, not about the object, so the
            # server answers 403 (without it, 422 Invalid, which reads as a malformed slice).
            "validations": [
                {"expression": "variables.userNodeName != ''", "reason": "Forbidden",
                 "message": "the DRA plugin's token carries no node name; it must run in a pod on a node"},
                {"expression": "variables.userNodeName == variables.objectNodeName", "reason": "Forbidden",
                 "messageExpression": "'the DRA plugin on node ' + variables.userNodeName + ' may not write "
                                      "ResourceSlices of ' + (variables.objectNodeName == '' ? 'no node' : "
                                      "'node ' + variables.objectNodeName)"},
                {"expression": f"variables.slice.spec.driver == '{driver}'", "reason": "Forbidden",
                 "message": f"the DRA plugin may only write ResourceSlices of driver {driver}"},
            ],
        },
    }


def admission_policy_binding(namespace: str) -> Manifest:
    return deny_binding(cluster_object_name(namespace, "dra-slices-own-node"), app_labels(COMPONENT, namespace))


def claim_quota(namespace: str, quota: ClaimQuota) -> Manifest:
    """Named after the stack (``<namespace>-dra-claims``): the tenant namespace is not the stack's, and a
    second stack may set its own quota there (the API server enforces every quota of a namespace)."""
    hard: dict[str, str] = {}
    if quota.claims is not None:
        hard["count/resourceclaims.resource.k8s.io"] = str(quota.claims)
    for device_class_name, count in sorted(quota.devices.items()):
        hard[f"{device_class_name}.deviceclass.resource.k8s.io/devices"] = str(count)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": cluster_object_name(namespace, "dra-claims"), "namespace": quota.namespace,
                     "labels": app_labels("dra-claim-quota", namespace)},
        "spec": {"hard": hard},
    }


def uninstall_marker(namespace: str, driver: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": UNINSTALL_MARKER, "namespace": namespace, "labels": app_labels(COMPONENT, namespace)},
        "data": {"driver": driver, "purpose": "deleted first on uninstall: DRA plugins withdraw their ResourceSlices, "
                 f"then remove the {CLEANUP_FINALIZER} finalizer they added"},
    }


def _host_path(name: str, path: str, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


#: The plugin's own 192 MiB plus what the MPS daemons of its claims may use (``workloads.MPS_*``).
DRA_PLUGIN_MEMORY_LIMIT_MIB = 192 + MPS_BASE_MIB + MPS_PER_GPU_MIB * MPS_SIZED_FOR_GPUS


def plugin_args(cluster: Cluster, namespace: str, plan: GroupPlan) -> list[str]:
    """The kubelet plugin's flags for a group (``plan``: what the stack decided for it)."""
    dra = cluster.dra
    # CDI specs name the driver's files under the node's driver root and run the toolkit's hook when the
    # plugin sees it in the mounted directory.
    return [*DRIVER_ROOT_ARGS, "dra-driver", "--driver-name", dra.driver_name, "--health-action", dra.health_action,
            "--nvidia-driver-root", plan.driver_root, "--cdi-hook-path", plan.cdi_hook,
            "--cdi-hook-dir", CDI_HOOK_DIR, "--uninstall-marker", f"{namespace}/{UNINSTALL_MARKER}",
            *status_args(cluster, DRA_PLUGIN_METRICS_PORT)]


def plugin_daemonset(namespace: str, cluster: Cluster, group: NodeGroup, plan: GroupPlan) -> Manifest:
    """The kubelet plugin on one DRA node group's nodes, once node setup has finished there (``plan``: what
    the stack decided for the group)."""
    driver = cluster.dra.driver_name
    labels = app_labels(COMPONENT, group.name, node_group=group.name, version=cluster.agent_image.tag)
    socket_dir = f"{PLUGINS}/{driver}"
    container: dict[str, Any] = {
        "name": COMPONENT,
        "image": cluster.agent_image.ref,
        "imagePullPolicy": cluster.agent_image.pull_policy,
        "command": list(AGENT),
        "args": plugin_args(cluster, namespace, plan),
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            # NVML and nvidia-smi (time-slice and compute-mode changes) come from the driver root
            # (--driver-root); the NVIDIA runtime may inject them too.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
            # Few malloc arenas: the gRPC and claim-read threads would otherwise each grow their own.
            {"name": "MALLOC_ARENA_MAX", "value": "2"},
        ],
        # MPS claims start nvidia-cuda-mps-control in this container (NVIDIA runs a Deployment per claim):
        # the limit leaves room for the control daemon and servers on an 8-GPU board, as the device
        # plugin's does in MPS groups; the request is the plugin's own, MPS claims being occasional.
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": f"{DRA_PLUGIN_MEMORY_LIMIT_MIB}Mi"}},
        # Privileged: compute-mode/time-slice changes and MPS daemons need the GPUs' device nodes, and the
        # sockets live in kubelet's root-owned plugin directories (Bidirectional propagation needs it too).
        "securityContext": {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0},
        "volumeMounts": [
            {"name": "plugins-registry", "mountPath": PLUGINS_REGISTRY},
            {"name": "plugins", "mountPath": PLUGINS, "mountPropagation": "Bidirectional"},
            {"name": "cdi", "mountPath": CDI_DIR},
            {"name": "agent-state", "mountPath": AGENT_STATE_DIR},
            {"name": "mps", "mountPath": MPS_DIR},
            {"name": "dev", "mountPath": "/dev"},
            # The MPS daemons' /dev/shm, over the host's /dev: every MPS claim's containers get this directory
            # at /dev/shm (node_agent.dra.sharing), as NVIDIA's per-claim daemon and its clients share one.
            {"name": "mps-shm", "mountPath": "/dev/shm"},
            driver_root_mount(plan.driver_root),
            cdi_hook_mount(),
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "ports": metrics_port(DRA_PLUGIN_METRICS_PORT),
        "livenessProbe": {"exec": {"command": ["test", "-S", f"{socket_dir}/dra.sock"]},
                          "periodSeconds": 10, "failureThreshold": 3},
        "startupProbe": {"exec": {"command": ["test", "-S", f"{PLUGINS_REGISTRY}/{driver}-reg.sock"]},
                         "periodSeconds": 2, "failureThreshold": 60},
        # /readyz: kubelet accepted the registration (node_agent.dra.metrics has it as a gauge too).
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 10,
                           "timeoutSeconds": 2, "failureThreshold": 3},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": group_object_name(COMPONENT, group.name), "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector_labels(COMPONENT, group.name)},
            # Sockets have fixed names, so two plugin pods on one node must never overlap.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels, **pod_annotations(cluster, DRA_PLUGIN_METRICS_PORT)},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "automountServiceAccountToken": True,
                    "priorityClassName": cluster.priority_class_name,
                    "terminationGracePeriodSeconds": 30,
                    "affinity": node_affinity(group, require_setup_complete=True),
                    "tolerations": tolerations(group),
                    "containers": [container],
                    "volumes": [
                        _host_path("plugins-registry", PLUGINS_REGISTRY, "Directory"),
                        _host_path("plugins", PLUGINS, "DirectoryOrCreate"),
                        _host_path("cdi", CDI_DIR, "DirectoryOrCreate"),
                        _host_path("agent-state", AGENT_STATE_DIR, "DirectoryOrCreate"),
                        _host_path("mps", MPS_DIR, "DirectoryOrCreate"),
                        _host_path("dev", "/dev", "Directory"),
                        _host_path("mps-shm", hostpaths.DRA_MPS_SHM, "DirectoryOrCreate"),
                        driver_root_volume(plan.driver_root),
                        cdi_hook_volume(plan.cdi_hook),
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    ],
                },
            },
        },
    }


def iommu_script() -> NodeScript:
    """``gpu-iommu.sh``: IOMMU kernel parameters for passthrough groups (Deckhouse backend)."""
    content = resources.files("nvidia_gpu.components.manifests").joinpath("gpu-iommu.sh").read_text()
    return NodeScript(name="gpu-iommu.sh", weight=IOMMU_SCRIPT_WEIGHT, content=content)
