"""The MIG manager's objects: the mig-parted ConfigMap, the manager DaemonSet and its RBAC.

Pure functions of validated stack config (``nvgpu.stackconfig``) and plain values: the ``MigProfile``
component registers what they return, and tests and the benchmarks call them without an engine. One manager serves
the whole stack, not one node group: it must outlive a group's MIG setting, because when a group leaves
MIG its nodes are relabelled ``nvidia.com/mig.config=all-disabled`` and something has to roll them back
(and then clear the label). So the DaemonSet runs on the nodes of every group that can have MIG GPUs
(:func:`may_use_mig`), wherever ``nvidia.com/mig.config`` is set, and the ConfigMap (:func:`mig_config`)
holds mig-parted's standard sets (``all-disabled``, ``all-enabled``, ``all-<profile>``, ``all-balanced``,
per catalogue model, with PCI device filters) plus each MIG group's custom layout under Deckhouse's
``custom-<group>-<hash>`` name.

:func:`mig_config` assembles that config and refuses it unless every MIG group's choice fits its GPU;
the check itself is the shared core's (:func:`nvgpu.stackconfig.mig_layout_problems`, on
:func:`nvgpu.migparted.fit_problems`), run again here on the assembled config because extra configs
are only known here and a caller may hand over groups built past the stack config's validators.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nvgpu import labels
from nvgpu.migparted import MigConfigSpec, MigPartedConfig, MigPartedError, build_config
from nvgpu.stackconfig import Cluster, GroupPlan, NodeGroup, NodeSetupBackend, mig_layout_problems
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, cluster_object_name, selector_labels
from nvidia_gpu.components.manifests.scheduling import node_selector_terms, tolerations
from nvidia_gpu.components.manifests.workloads import (
    AGENT,
    DRIVER_ROOT_ARGS,
    HOST_ROOT,
    MIG_MANAGER_METRICS_PORT,
    driver_root_mount,
    driver_root_volume,
    metrics_port,
    pod_annotations,
    status_args,
)

COMPONENT = "mig-manager"
CONFIG_COMPONENT = "mig-parted-config"
CONFIG_DIR = "/etc/nvidia-gpu/mig"
CONFIG_KEY = "config.yaml"
#: The preStop hook waits for a GPU change in flight; the grace period must cover it.
PRE_STOP_TIMEOUT_S = 100
TERMINATION_GRACE_S = 120
RESOURCES = {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "192Mi"}}
RBAC_API = "rbac.authorization.k8s.io/v1"
#: The manager reads and patches its Node (labels, taint, annotations, cordon), lists the pods on it,
#: deletes the GPU agents' pods and records Events; the node-confinement admission policy keeps the
#: Node writes and pod deletions to its own node (``nvidia_gpu.components.manifests.confinement``).
RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
#: Where it drains itself (``--drain cordon``) it also evicts GPU workloads. An Eviction names only the
#: pod, so no admission policy can keep it to its node: the right is given only where it is used (on
#: Deckhouse, node-manager drains), and the eviction guard's webhook refuses it for other nodes' pods.
EVICT_RULE: dict[str, list[str]] = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}


def drain_mode(cluster: Cluster) -> str:
    return "deckhouse" if cluster.node_setup is NodeSetupBackend.DECKHOUSE else "cordon"


class MigProfileError(ValueError):
    """A MIG layout that cannot be placed; one problem per line, each naming the group and config."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid MIG layout:\n" + "\n".join(f"  - {p}" for p in self.problems))


def may_use_mig(group: NodeGroup) -> bool:
    """Groups whose GPUs can be MIG-capable: those with no declared model, a model the catalogue lacks (NVML
    says on the node) or a MIG-capable one."""
    model = group.gpu.declared_model
    return model is None or model.mig_capable


def mig_config(
    groups: Sequence[NodeGroup], extra: Mapping[str, Sequence[MigConfigSpec]] | None = None
) -> MigPartedConfig:
    """The stack's mig-parted config, refused unless every MIG group's choice fits its GPU.

    ``extra`` adds named configs (for example per-device-filter layouts an operator maintains); they
    are checked against the declared models of the MIG groups that select them by name (or, for a group
    without a model, must fit some catalogue GPU).
    """
    custom: dict[str, Sequence[MigConfigSpec]] = {}
    unbuildable: list[str] = []
    for g in groups:
        try:
            custom.update(g.custom_mig_configs())
        except MigPartedError:
            unbuildable += mig_layout_problems(g)  # the same check names the group and the misspelt profile
    if unbuildable:
        raise MigProfileError(unbuildable)
    for name, specs in (extra or {}).items():
        if name in custom:
            raise MigProfileError([f"extra MIG config {name!r} clashes with a node group's custom layout"])
        custom[name] = specs
    try:
        cfg = build_config(None, custom)
    except MigPartedError as e:
        raise MigProfileError(e.problems) from None
    problems = [p for g in groups for p in mig_layout_problems(g, cfg)]
    if problems:
        raise MigProfileError(problems)
    return cfg


def config_map_name(namespace: str) -> str:
    return f"{namespace}-{CONFIG_COMPONENT}"


def config_map(namespace: str, cfg: MigPartedConfig) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(namespace),
            "namespace": namespace,
            "labels": app_labels(CONFIG_COMPONENT, namespace),
        },
        "data": {CONFIG_KEY: cfg.to_yaml()},
    }


def _affinity(groups: Sequence[NodeGroup]) -> dict[str, Any]:
    terms = []
    for g in groups:
        (term,) = node_selector_terms(g, require_setup_complete=True)
        term["matchExpressions"].append({"key": labels.MIG_CONFIG, "operator": "Exists"})
        terms.append(term)
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _tolerations(groups: Sequence[NodeGroup]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for g in groups:
        for t in tolerations(g):
            if t not in out:
                out.append(t)
    # The manager must come back on a node it tainted itself (a pod restart mid-reconfiguration).
    out.append({"key": labels.MIG_RECONFIGURE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    return out


def manager_args(cluster: Cluster) -> list[str]:
    drain = drain_mode(cluster)
    args = ["--host-root", HOST_ROOT, *DRIVER_ROOT_ARGS,
            "mig-manager", *status_args(cluster, MIG_MANAGER_METRICS_PORT), "--config", f"{CONFIG_DIR}/{CONFIG_KEY}",
            "--drain", drain]
    for unit in cluster.mig.host_gpu_clients or ():  # unset: the manager's own default, NVIDIA's list
        args += ["--host-gpu-client", unit]
    return [*args, "--allow-reboot"] if cluster.mig.allow_reboot else args


#: The instance of the MIG manager DaemonSet for the groups whose driver a container provides, when the stack
#: also has groups with a pre-installed driver (each DaemonSet mounts one driver root).
CONTAINER_DRIVER_INSTANCE = "driver-container"


def by_driver_root(cluster: Cluster, groups: Sequence[NodeGroup], plans: Mapping[str, GroupPlan]
                   ) -> dict[str, list[NodeGroup]]:
    """The MIG groups by where their driver is (``plans``: each group's plan, by name), ``cluster.driverRoot``'s
    first: one manager DaemonSet each."""
    out: dict[str, list[NodeGroup]] = {}
    for g in sorted(groups, key=lambda g: plans[g.name].driver_root != cluster.driver_root):
        out.setdefault(plans[g.name].driver_root, []).append(g)
    return out


def daemonset(namespace: str, cluster: Cluster, groups: Sequence[NodeGroup], driver_root: str | None = None
              ) -> Manifest:
    """The MIG manager on the nodes of ``groups`` that carry ``nvidia.com/mig.config``, reading the driver
    under ``driver_root`` (default ``cluster.driverRoot``; another root gets a DaemonSet of its own).

    Privileged with the host root mounted: MIG changes need the ``/dev/nvidia-caps`` control devices,
    the GPU reset runs the host's ``nvidia-smi``, the journal lives in the host's agent state
    directory and a reboot (only when allowed) goes through the host's systemd.
    """
    root = driver_root or cluster.driver_root
    instance = namespace if root == cluster.driver_root else f"{namespace}-{CONTAINER_DRIVER_INSTANCE}"
    name = cluster_object_name(namespace, COMPONENT) + ("" if instance == namespace else
                                                        f"-{CONTAINER_DRIVER_INSTANCE}")
    meta = app_labels(COMPONENT, instance, version=cluster.agent_image.tag)
    container: dict[str, Any] = {
        "name": COMPONENT,
        "image": cluster.agent_image.ref,
        "imagePullPolicy": cluster.agent_image.pull_policy,
        "command": list(AGENT),
        "args": manager_args(cluster),
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
            {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
            {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"},
        ],
        "resources": RESOURCES,
        "securityContext": {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0},
        # /metrics only: no liveness probe, which could kill the manager in the middle of a GPU change.
        "ports": metrics_port(MIG_MANAGER_METRICS_PORT),
        "lifecycle": {"preStop": {"exec": {"command": [
            *AGENT, "--host-root", HOST_ROOT, *DRIVER_ROOT_ARGS,
            "mig-manager", "--pre-stop", "--timeout", str(PRE_STOP_TIMEOUT_S),
        ]}}},
        "volumeMounts": [
            {"name": "host-root", "mountPath": HOST_ROOT},
            driver_root_mount(root),
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": meta},
        "spec": {
            "selector": {"matchLabels": selector_labels(COMPONENT, instance)},
            # One node at a time: a new manager image must not restart every manager at once.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": meta, **pod_annotations(cluster, MIG_MANAGER_METRICS_PORT)},
                "spec": {
                    "serviceAccountName": COMPONENT,
                    "automountServiceAccountToken": True,
                    "priorityClassName": cluster.priority_class_name,
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                    "affinity": _affinity(groups),
                    "tolerations": _tolerations(groups),
                    "containers": [container],
                    "volumes": [
                        {"name": "host-root", "hostPath": {"path": "/", "type": "Directory"}},
                        driver_root_volume(root),
                        {"name": "config", "configMap": {"name": config_map_name(namespace)}},
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    ],
                },
            },
        },
    }


def rbac(namespace: str, cluster: Cluster) -> tuple[Manifest, Manifest, Manifest]:
    """ServiceAccount, ClusterRole and binding of the manager (verbs spelled out, no wildcards)."""
    name = cluster_object_name(namespace, COMPONENT)
    meta = app_labels(COMPONENT, namespace)
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": COMPONENT, "namespace": namespace, "labels": meta},
        "automountServiceAccountToken": False,
    }
    role = {"apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": {"name": name, "labels": meta},
            "rules": [dict(r) for r in RULES] + ([dict(EVICT_RULE)] if drain_mode(cluster) == "cordon" else [])}
    binding = {
        "apiVersion": RBAC_API,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": meta},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": COMPONENT, "namespace": namespace}],
    }
    return sa, role, binding
