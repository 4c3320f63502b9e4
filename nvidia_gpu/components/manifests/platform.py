"""The cluster-wide objects: the stack's namespace and one ServiceAccount plus least-privilege RBAC per agent role.

The namespace enforces Pod Security ``privileged`` because the device plugin and the node-setup agent
must be privileged (host devices, ``/proc/sys``) and every agent pod mounts host paths. ``warn`` is
``privileged`` too: warning on every apply of pods that are privileged by design only teaches people
to ignore warnings. ``audit`` is ``baseline``, so the API server's audit log marks every pod here that
uses host access, which is what a security review of this namespace wants to see.

RBAC is spelled out verb by verb: no wildcards, no access to Secrets, only what each role's code calls.

The RuntimeClass is for users' GPU pods (``runtimeClassName: nvidia``, as NVIDIA's docs write them): its
handler is the runtime entry node setup registers in containerd and CRI-O, and its scheduling puts such
pods only on GPU nodes whose setup finished, tolerating the GPU taint. A group's extra taints are not
tolerated: they dedicate a group (``dedicated=ml``), and one cluster-wide class tolerating them would let
every pod that asks for the nvidia runtime past every group's dedication. The agent pods do not use it:
they load NVML from the driver root on the host and need no nvidia runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nvgpu import inventory, labels
from nvgpu.nodescripts.facts import NVIDIA_RUNTIME_NAME
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, cluster_object_name, shared_labels

RBAC_API = "rbac.authorization.k8s.io/v1"
RUNTIME_CLASS_API = "node.k8s.io/v1"
#: The value node setup gives ``node.deckhouse.io/gpu-setup-complete`` (a RuntimeClass selects on exact values).
SETUP_COMPLETE_VALUE = ""


class AgentRole(StrEnum):
    """One ServiceAccount each; a role never borrows another's permissions."""

    DEVICE_PLUGIN = "device-plugin"
    LABELLER = "gpu-labeller"
    NODE_SETUP = "gpu-setup"


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def as_dict(self) -> dict[str, list[str]]:
        return {"apiGroups": list(self.api_groups), "resources": list(self.resources), "verbs": list(self.verbs)}


_READ_NODES = Rule(("",), ("nodes",), ("get", "list", "watch"))
_PATCH_NODES = Rule(("",), ("nodes",), ("get", "list", "watch", "patch"))
#: The labeller reads, watches and merge-patches its own Node (labels, taints, its ownership annotations),
#: nothing else. The watch (``fieldSelector=metadata.name=<node>``) is what lets a labeller at rest make no
#: request: it reads the Node from memory every interval. RBAC cannot scope a watch to the caller's node,
#: so the role can stream every Node's object, as the device plugin's and the MIG manager's can; it still
#: cannot list them, and the node-confinement policy keeps its writes to its own Node.
_PATCH_OWN_NODE = Rule(("",), ("nodes",), ("get", "watch", "patch"))
#: ... and keeps its node's GPU inventory objects (the node-confinement policy keeps it to its own node's).
_GPU_INVENTORY = Rule((inventory.GROUP,), (inventory.PLURAL,), ("get", "list", "create", "delete"))
_GPU_INVENTORY_STATUS = Rule((inventory.GROUP,), (f"{inventory.PLURAL}/status",), ("patch",))

#: The device plugin reads its own Node to pick the named sharing config from the node label.
#: The labeller and the setup agent patch labels (and the setup-complete label) onto their own Node.
ROLE_RULES: dict[AgentRole, tuple[Rule, ...]] = {
    AgentRole.DEVICE_PLUGIN: (_READ_NODES,),
    AgentRole.LABELLER: (_PATCH_OWN_NODE, _GPU_INVENTORY, _GPU_INVENTORY_STATUS),
    AgentRole.NODE_SETUP: (_PATCH_NODES,),
}

#: Namespaced, in the stack's namespace: the labeller reads its own DaemonSet when stopping, to tell a
#: restart (labels stay) from its group's removal or the stack's destroy (labels withdrawn).
NAMESPACED_RULES: dict[AgentRole, tuple[Rule, ...]] = {
    AgentRole.LABELLER: (Rule(("apps",), ("daemonsets",), ("get",)),),
}

#: Pod Security Admission levels (see the module docstring for why enforce is privileged).
POD_SECURITY = {"enforce": "privileged", "warn": "privileged", "audit": "baseline"}


def namespace(name: str, kubernetes_version: str, extra_labels: dict[str, str] | None = None,
              stack: str | None = None) -> Manifest:
    """The stack's namespace; ``extra_labels`` are what the cluster's Prometheus selects namespaces by, and
    ``stack`` (``<project>/<stack>``) says which Pulumi stack it belongs to."""
    psa: dict[str, str] = dict(extra_labels or {})
    for mode, level in POD_SECURITY.items():
        psa[f"pod-security.kubernetes.io/{mode}"] = level
        psa[f"pod-security.kubernetes.io/{mode}-version"] = f"v{kubernetes_version}"
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {**app_labels("namespace", name), **psa},
                     **({"annotations": {labels.STACK_ANNOTATION: stack}} if stack else {})},
    }


def service_account(namespace_name: str, role: AgentRole) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": role.value, "namespace": namespace_name, "labels": app_labels(role.value, namespace_name)},
        # The token is mounted explicitly by the pods that talk to the API server.
        "automountServiceAccountToken": False,
    }


def cluster_role(namespace_name: str, role: AgentRole) -> Manifest:
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRole",
        "metadata": {
            "name": cluster_object_name(namespace_name, role.value),
            "labels": app_labels(role.value, namespace_name),
        },
        "rules": [r.as_dict() for r in ROLE_RULES[role]],
    }


def cluster_role_binding(namespace_name: str, role: AgentRole) -> Manifest:
    name = cluster_object_name(namespace_name, role.value)
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": app_labels(role.value, namespace_name)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": role.value, "namespace": namespace_name}],
    }


def _namespaced_meta(namespace_name: str, agent: AgentRole) -> dict[str, Any]:
    return {"name": agent.value, "namespace": namespace_name, "labels": app_labels(agent.value, namespace_name)}


def role(namespace_name: str, agent: AgentRole) -> Manifest:
    """The ``Role`` of :data:`NAMESPACED_RULES` for ``agent`` in the stack's namespace."""
    return {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": _namespaced_meta(namespace_name, agent),
        "rules": [r.as_dict() for r in NAMESPACED_RULES[agent]],
    }


def role_binding(namespace_name: str, agent: AgentRole) -> Manifest:
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": _namespaced_meta(namespace_name, agent),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": agent.value},
        "subjects": [{"kind": "ServiceAccount", "name": agent.value, "namespace": namespace_name}],
    }


def roles_for_backend(daemonset_setup: bool) -> tuple[AgentRole, ...]:
    """The setup agent only runs as a DaemonSet on non-Deckhouse clusters (Deckhouse runs the scripts)."""
    roles = [AgentRole.DEVICE_PLUGIN, AgentRole.LABELLER]
    if daemonset_setup:
        roles.append(AgentRole.NODE_SETUP)
    return tuple(roles)


def runtime_class(name: str) -> Manifest:
    """Cluster-scoped ``RuntimeClass`` ``name`` with handler ``nvidia``; admission adds its scheduling to the pods
    that name it (a pod whose own ``nodeSelector`` contradicts it is refused). Shared by every stack on the
    cluster (see :mod:`nvidia_gpu.components.manifests.shared`)."""
    return {
        "apiVersion": RUNTIME_CLASS_API,
        "kind": "RuntimeClass",
        "metadata": {"name": name, "labels": shared_labels("runtime-class")},
        "handler": NVIDIA_RUNTIME_NAME,
        "scheduling": {
            "nodeSelector": {labels.GPU_SETUP_COMPLETE: SETUP_COMPLETE_VALUE},
            "tolerations": [{"key": labels.GPU_TAINT_KEY, "operator": "Exists", "effect": labels.GPU_TAINT_EFFECT}],
        },
    }
