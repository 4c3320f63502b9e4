"""The driver upgrade controller (``gpu.driver.source: container``): one Deployment per stack running the
agent's ``driver-upgrade``, which rolls a driver change through the nodes one at a time
(``node_agent.driverupgrade``).

Like the eviction guard it runs off the GPU nodes (a compromised GPU node never holds a token that may
cordon and evict across the cluster), unprivileged, one replica replaced with ``Recreate`` (two
controllers would both count free slots). Its RBAC is what the rollout needs and no more: read the
driver DaemonSets, delete their pods (in the stack's namespace only); read, label, taint and cordon Nodes;
list pods and create evictions (a drain moves any workload of the node, and the node's GPU agents are
evicted before the driver is replaced); post Events; on Deckhouse, read NodeGroups. The stack never
emits it for pre-installed drivers or NVIDIA's operator (which upgrades its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from nvgpu.stackconfig import Cluster, NodeGroup, NodeSetupBackend
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, cluster_object_name
from nvidia_gpu.components.manifests.offgpu import controller_deployment
from nvidia_gpu.components.manifests.workloads import AGENT

RBAC_API = "rbac.authorization.k8s.io/v1"
COMPONENT = "driver-upgrade"
RESOURCES = {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}


def drain_mode(cluster: Cluster) -> str:
    """Cordon and evict; on Deckhouse within each NodeGroup's disruption settings."""
    return "deckhouse" if cluster.node_setup is NodeSetupBackend.DECKHOUSE else "cordon"


def rbac(namespace: str, *, deckhouse: bool = False) -> tuple[Manifest, ...]:
    """``deckhouse``: it also reads the NodeGroups, whose disruption settings it honours."""
    meta = app_labels(COMPONENT, namespace)
    name = cluster_object_name(namespace, COMPONENT)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
          "metadata": {"name": COMPONENT, "namespace": namespace, "labels": meta}}
    cluster_role = {"apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": {"name": name, "labels": meta},
                    "rules": [
                        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
                        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
                        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
                        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
                        *([{"apiGroups": ["deckhouse.io"], "resources": ["nodegroups"], "verbs": ["get"]}]
                          if deckhouse else []),
                    ]}
    cluster_binding = {"apiVersion": RBAC_API, "kind": "ClusterRoleBinding", "metadata": {"name": name, "labels": meta},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                       "subjects": [{"kind": "ServiceAccount", "name": COMPONENT, "namespace": namespace}]}
    role = {"apiVersion": RBAC_API, "kind": "Role",
            "metadata": {"name": COMPONENT, "namespace": namespace, "labels": meta},
            "rules": [{"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "watch"]},
                      {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]}
    binding = {"apiVersion": RBAC_API, "kind": "RoleBinding",
               "metadata": {"name": COMPONENT, "namespace": namespace, "labels": meta},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": COMPONENT},
               "subjects": [{"kind": "ServiceAccount", "name": COMPONENT, "namespace": namespace}]}
    return sa, cluster_role, cluster_binding, role, binding


def deployment(namespace: str, cluster: Cluster, groups: Sequence[NodeGroup]) -> Manifest:
    container = {
        "name": COMPONENT,
        "image": cluster.agent_image.ref,
        "imagePullPolicy": cluster.agent_image.pull_policy,
        "command": list(AGENT),
        "args": ["driver-upgrade", "--drain", drain_mode(cluster)],
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "resources": RESOURCES,
    }
    meta = app_labels(COMPONENT, namespace, version=cluster.agent_image.tag)
    return controller_deployment(COMPONENT, namespace, meta, groups, container)
