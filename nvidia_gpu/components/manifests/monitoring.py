"""GPU monitoring: the metrics exporter on every GPU node, how Prometheus finds it, alerts and dashboards.

``cluster.monitoring`` picks one exporter per stack, both serving dcgm-exporter's metric names on its port
(9400), so users' dashboards and alerts select the same series whichever runs:

* ``agent``: the agent image's ``exporter`` (NVML through the agent's NVML layer; no DCGM on the node),
  unprivileged like the labeller: the GPUs' device nodes come from the NVIDIA runtime, asked for the way a
  device plugin's volume-mounts list does, NVML from the read-only driver root; on MIG groups it asks for the
  MIG monitor capability as the labeller does (``workloads.with_mig_monitor``: CAP_SYS_ADMIN, no more);
* ``dcgm``: NVIDIA's dcgm-exporter image, pinned by digest, for DCGM's profiling fields. It embeds DCGM's
  host engine, which needs ``SYS_ADMIN`` for the profiling counters (as NVIDIA's chart grants it).

Either reads its fields from one ConfigMap in dcgm-exporter's counters format (NVIDIA's default file
unless the stack gives its own), with the fields the stack's alerts read appended where missing, and asks
kubelet's PodResources socket which pod holds which GPU. Neither talks to the API server: the exporter's
ServiceAccount has no token mounted and no binding.

Prometheus finds the exporters and the agents' own ``/metrics`` (device plugin 9401, DRA plugin 9402,
MIG manager 9403, node setup's monitor 9404) by ``prometheus.io/*`` pod annotations, or by a
ServiceMonitor (a headless Service per target) or PodMonitor of the Prometheus Operator; on Deckhouse
the monitors and rules carry ``prometheus: main`` and the namespace the labels its Prometheus watches.
The alerts are a PrometheusRule (:mod:`.alerts`); the dashboards are ConfigMaps for Grafana's dashboard
sidecar: NVIDIA's, unchanged, and the stack's own (:mod:`.dashboards`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvgpu import dcgmcounters, devicelist, hostpaths
from nvgpu.stackconfig import AllocationMode, Cluster, GroupPlan, Monitoring, NodeGroup, NodeSetupBackend, ScrapeMode
from nvidia_gpu.components.manifests import Manifest, dra, mig
from nvidia_gpu.components.manifests.meta import app_labels, group_object_name, selector_labels
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.manifests.scheduling import node_affinity, tolerations
from nvidia_gpu.components.manifests.workloads import (
    AGENT,
    ALL_GPUS_VOLUME,
    DEVICE_PLUGIN_METRICS_PORT,
    DRA_PLUGIN_METRICS_PORT,
    DRIVER_ROOT_ARGS,
    MIG_MANAGER_METRICS_PORT,
    NODE_SETUP_METRICS_PORT,
    SKIP_AWAIT,
    GroupContext,
    driver_root_mount,
    driver_root_volume,
    scrape_annotations,
    with_mig_monitor,
)

EXPORTER = "gpu-exporter"
#: NVIDIA's exporter runs under its own component name: the policy pack allows it SYS_ADMIN, not ours.
DCGM_EXPORTER = "dcgm-exporter"
#: dcgm-exporter's port, for either exporter: scrape configs written for it keep working.
EXPORTER_PORT = 9400
COUNTERS_DIR = "/etc/nvidia-gpu/exporter"
COUNTERS_KEY = "counters.csv"
POD_RESOURCES_VOLUME = "pod-resources"
MONITORING_API = "monitoring.coreos.com/v1"
#: The Prometheus Operator's kinds the stack creates (their CRDs are vendored for the offline preview).
OPERATOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
#: Deckhouse's Prometheus (``prometheus: main``) selects monitors and rules by this label, in namespaces
#: carrying the watcher labels below.
DECKHOUSE_PROMETHEUS_LABELS = {"prometheus": "main"}
DECKHOUSE_NAMESPACE_LABELS = {
    "prometheus.deckhouse.io/monitor-watcher-enabled": "true",
    "prometheus.deckhouse.io/rules-watcher-enabled": "true",
}
#: The exporter's resources: one Python process holding an NVML session (bench/bench_exporter.py measured
#: 46 MiB RSS on an 8-GPU node with 56 MIG devices, and about 0.14 s of CPU per scrape there).
EXPORTER_RESOURCES = {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "192Mi"}}
#: dcgm-exporter's, from NVIDIA's chart defaults plus the host engine's working set.
DCGM_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}

#: The fields the stack's alerts read, in dcgm-exporter's format: added to the counters when missing, so
#: an alert never waits on a series no exporter serves.
ALERT_COUNTERS = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
)
#: dcgm-exporter counts XIDs only with this field listed (the agent exporter always counts them).
DCGM_XID_COUNT = ("DCGM_EXP_XID_ERRORS_COUNT", "counter", "Count of XID errors within the user-specified window.")


def counters_text(monitoring: Monitoring) -> str:
    """The counters file both exporters read: the stack's (or NVIDIA's default), plus the alerts' fields."""
    text = monitoring.counters_text
    if not monitoring.rules:
        return text
    listed = {c.name for c in dcgmcounters.read(text, "cluster.monitoring.counters")}
    wanted = [*ALERT_COUNTERS, *([DCGM_XID_COUNT] if monitoring.exporter.value == "dcgm" else [])]
    missing = [c for c in wanted if c[0] not in listed]
    if not missing:
        return text
    lines = [f"{name}, {kind}, {help_}" for name, kind, help_ in missing]
    return text.rstrip("\n") + "\n\n# Added by nvidia-gpu: the fields its alerts read.\n" + "\n".join(lines) + "\n"


def counters_config_map(namespace: str, monitoring: Monitoring) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{EXPORTER}-counters", "namespace": namespace, "labels": app_labels(EXPORTER, namespace)},
        "data": {COUNTERS_KEY: counters_text(monitoring)},
    }


def service_account(namespace: str) -> Manifest:
    """The exporters' identity: no token, no binding (PodResources is a node socket, not an API)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": EXPORTER, "namespace": namespace, "labels": app_labels(EXPORTER, namespace)},
        "automountServiceAccountToken": False,
    }


def _pod_resources() -> tuple[dict[str, Any], dict[str, Any]]:
    directory = hostpaths.KUBELET_POD_RESOURCES_DIR
    return ({"name": POD_RESOURCES_VOLUME, "hostPath": {"path": directory, "type": "Directory"}},
            {"name": POD_RESOURCES_VOLUME, "mountPath": directory, "readOnly": True})


def _counters() -> tuple[dict[str, Any], dict[str, Any]]:
    return ({"name": "counters", "configMap": {"name": f"{EXPORTER}-counters"}},
            {"name": "counters", "mountPath": COUNTERS_DIR, "readOnly": True})


def _gpus() -> tuple[dict[str, Any], dict[str, Any]]:
    """Every GPU, asked for as a device plugin's volume-mounts list does (see the labeller's DaemonSet)."""
    return ({"name": ALL_GPUS_VOLUME, "hostPath": {"path": "/dev/null", "type": "CharDevice"}},
            {"name": ALL_GPUS_VOLUME, "mountPath": f"{devicelist.VOLUME_MOUNT_ROOT}/all", "readOnly": True})


def _probe(path: str, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "metrics"}, "periodSeconds": 10, "timeoutSeconds": 5,
            "failureThreshold": failures}


def _agent_container(ctx: GroupContext) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    args = [*DRIVER_ROOT_ARGS, "exporter", "--listen", f"0.0.0.0:{EXPORTER_PORT}",
            "--collectors", f"{COUNTERS_DIR}/{COUNTERS_KEY}"]
    if ctx.plan.allocation_mode is AllocationMode.DRA:
        args += ["--dra-driver", ctx.cluster.dra.driver_name]
    # nvidia_gpu_node_info, which the stack's dashboard groups by.
    args += ["--info", f"node_group={ctx.group.name}", "--info", f"sharing={ctx.group.gpu.sharing.value}",
             "--info", f"allocation_mode={ctx.plan.allocation_mode.value}"]
    volumes, mounts = zip(_pod_resources(), _counters(), _gpus(), strict=True)
    container = {
        "name": EXPORTER,
        "image": ctx.image,
        "imagePullPolicy": ctx.cluster.agent_image.pull_policy,
        "command": list(AGENT),
        "args": args,
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": devicelist.VOLUME_MOUNT_ROOT},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}],
        "ports": [{"name": "metrics", "containerPort": EXPORTER_PORT, "protocol": "TCP"}],
        "resources": EXPORTER_RESOURCES,
        # Root only to connect to kubelet's root-owned PodResources socket; no capability, no escalation.
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsUser": 0, "runAsGroup": 0, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "startupProbe": _probe("/healthz", 30),
        "livenessProbe": _probe("/healthz", 3),
        "volumeMounts": [*mounts, driver_root_mount(ctx.plan.driver_root), {"name": "tmp", "mountPath": "/tmp"}],
    }
    # MIG groups: the MIG monitor capability, or NVML hides the MIG GPUs' memory and MIG devices.
    container = with_mig_monitor(container, ctx.group)
    return container, [*volumes, driver_root_volume(ctx.plan.driver_root),
                       {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]


def _dcgm_container(ctx: GroupContext) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    image = ctx.cluster.monitoring.dcgm.image
    assert image is not None  # the stack config requires it with exporter: dcgm
    volumes, mounts = zip(_pod_resources(), _counters(), _gpus(), strict=True)
    interval_ms = _milliseconds(ctx.cluster.monitoring.interval)
    container = {
        "name": "dcgm-exporter",
        "image": image.ref,
        "imagePullPolicy": image.pull_policy,
        "args": ["-f", f"{COUNTERS_DIR}/{COUNTERS_KEY}"],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "DCGM_EXPORTER_LISTEN", "value": f":{EXPORTER_PORT}"},
            # Pod, namespace and container labels from kubelet's PodResources API.
            {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
            {"name": "DCGM_EXPORTER_INTERVAL", "value": str(interval_ms)},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": devicelist.VOLUME_MOUNT_ROOT},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ],
        "ports": [{"name": "metrics", "containerPort": EXPORTER_PORT, "protocol": "TCP"}],
        "resources": DCGM_RESOURCES,
        "securityContext": {"privileged": False, "runAsNonRoot": False, "runAsUser": 0,
                            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
        "startupProbe": _probe("/health", 30),
        "livenessProbe": _probe("/health", 3),
        "volumeMounts": list(mounts),
    }
    return container, list(volumes)


def _milliseconds(duration: str) -> int:
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
    for suffix in ("ms", "s", "m", "h"):
        if duration.endswith(suffix) and duration[: -len(suffix)].isdigit():
            return int(duration[: -len(suffix)]) * units[suffix]
    raise ValueError(f"not a duration: {duration!r}")


def exporter_component(monitoring: Monitoring) -> str:
    return DCGM_EXPORTER if monitoring.exporter.value == "dcgm" else EXPORTER


def exporter_daemonset(ctx: GroupContext) -> Manifest:
    """The group's exporter: the agent's or dcgm-exporter, gated on node setup like the other GPU pods."""
    monitoring = ctx.cluster.monitoring
    agent = monitoring.exporter.value == "agent"
    container, volumes = _agent_container(ctx) if agent else _dcgm_container(ctx)
    group = ctx.group
    component = exporter_component(monitoring)
    labels = {**app_labels(component, group.name, node_group=group.name, version=ctx.version if agent else None)}
    pod_meta: dict[str, Any] = {"labels": labels}
    if annotations := scrape_annotations(monitoring, EXPORTER_PORT):
        pod_meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": group_object_name(component, group.name), "namespace": ctx.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector_labels(component, group.name)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "serviceAccountName": EXPORTER,
                    "automountServiceAccountToken": False,
                    # Below the agents that make the node usable: losing metrics never evicts them.
                    "priorityClassName": "system-cluster-critical",
                    "affinity": node_affinity(group, require_setup_complete=True),
                    "tolerations": tolerations(group),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


@dataclass(frozen=True)
class Target:
    """One kind of pod Prometheus scrapes, all groups together: the exporters or one of the agents. The
    series' ``job`` is the component's name under either monitor (the alerts select by it)."""

    component: str
    port: int


def targets(cluster: Cluster, groups: Sequence[NodeGroup], plans: Mapping[str, GroupPlan]) -> tuple[Target, ...]:
    """The exporter and every agent the stack runs that serves ``/metrics``: the device plugins and DRA
    plugins of the groups in each mode (``plans``: each group's plan, by name), the MIG manager where a group
    may use MIG, node setup's monitor with the daemonset backend (on Deckhouse, bashible runs setup and no
    pod stays behind)."""
    monitoring = cluster.monitoring
    out = []
    if monitoring.exporter.value != "none":
        out.append(Target(exporter_component(monitoring), EXPORTER_PORT))
    modes = {plans[g.name].allocation_mode for g in groups}
    if AllocationMode.DEVICE_PLUGIN in modes:
        out.append(Target(AgentRole.DEVICE_PLUGIN.value, DEVICE_PLUGIN_METRICS_PORT))
    if AllocationMode.DRA in modes:
        out.append(Target(dra.COMPONENT, DRA_PLUGIN_METRICS_PORT))
    if any(mig.may_use_mig(g) for g in groups):
        out.append(Target(mig.COMPONENT, MIG_MANAGER_METRICS_PORT))
    if cluster.node_setup is NodeSetupBackend.DAEMONSET and groups:
        out.append(Target(AgentRole.NODE_SETUP.value, NODE_SETUP_METRICS_PORT))
    return tuple(out)


#: The jobs of :func:`targets`, for the alerts' ``up`` selector.
JOBS = (EXPORTER, DCGM_EXPORTER, AgentRole.DEVICE_PLUGIN.value, dra.COMPONENT, mig.COMPONENT,
        AgentRole.NODE_SETUP.value)


def _prometheus_labels(cluster: Cluster) -> dict[str, str]:
    deckhouse = DECKHOUSE_PROMETHEUS_LABELS if cluster.node_setup is NodeSetupBackend.DECKHOUSE else {}
    return {**deckhouse, **cluster.monitoring.labels}


def _pods_of(target: Target) -> dict[str, Any]:
    """Every group's pods of the target: ``name`` only (the instance label is the group)."""
    return {"matchLabels": {"app.kubernetes.io/name": target.component,
                            "app.kubernetes.io/part-of": "nvidia-gpu"}}


#: Per-series labels kept from the pod: the node (the alerts join on it) and the node group.
_RELABEL = [
    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"},
    {"sourceLabels": ["__meta_kubernetes_pod_label_gpu_nvidia_gpu_io_node_group"], "targetLabel": "node_group",
     "action": "replace"},
]


def service(namespace: str, target: Target) -> Manifest:
    """A headless Service naming the target's pods, which a ServiceMonitor selects."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        # Not awaited: the provider waits for a selector's endpoints, and a stack applied before its GPU nodes
        # join (or with every GPU node drained) has none; the monitor finds the pods whenever they come.
        "metadata": {"name": f"{target.component}-metrics", "namespace": namespace,
                     "labels": {**app_labels(target.component, namespace), "nvidia-gpu.io/metrics": target.component},
                     "annotations": dict(SKIP_AWAIT)},
        "spec": {
            "clusterIP": "None",
            "selector": _pods_of(target)["matchLabels"],
            "ports": [{"name": "metrics", "port": target.port, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def monitor(namespace: str, cluster: Cluster, target: Target) -> Manifest:
    """The target's ServiceMonitor or PodMonitor, as ``cluster.monitoring.scrape`` says."""
    monitoring = cluster.monitoring
    endpoint: dict[str, Any] = {"port": "metrics", "path": "/metrics", "interval": monitoring.interval,
                                "scrapeTimeout": _timeout(monitoring.interval), "honorLabels": True,
                                "relabelings": [dict(r) for r in _RELABEL]}
    meta = {"name": target.component, "namespace": namespace,
            "labels": {**app_labels(target.component, namespace), **_prometheus_labels(cluster)}}
    if monitoring.scrape is ScrapeMode.SERVICE_MONITOR:
        spec: dict[str, Any] = {
            "jobLabel": "nvidia-gpu.io/metrics",
            "selector": {"matchLabels": {"nvidia-gpu.io/metrics": target.component}},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [endpoint],
        }
        return {"apiVersion": MONITORING_API, "kind": "ServiceMonitor", "metadata": meta, "spec": spec}
    spec = {
        "jobLabel": "app.kubernetes.io/name",
        "selector": _pods_of(target),
        "namespaceSelector": {"matchNames": [namespace]},
        "podMetricsEndpoints": [endpoint],
    }
    return {"apiVersion": MONITORING_API, "kind": "PodMonitor", "metadata": meta, "spec": spec}


def _timeout(interval: str) -> str:
    """Half the interval, at most 10 s (an NVML read of a large node takes well under one)."""
    ms = min(_milliseconds(interval) // 2, 10_000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def prometheus_rule(namespace: str, cluster: Cluster, groups: list[dict[str, Any]]) -> Manifest:
    labels = {**app_labels("gpu-alerts", namespace), **_prometheus_labels(cluster)}
    if cluster.node_setup is NodeSetupBackend.DECKHOUSE:
        labels["component"] = "rules"
    return {"apiVersion": MONITORING_API, "kind": "PrometheusRule",
            "metadata": {"name": "nvidia-gpu-alerts", "namespace": namespace, "labels": labels},
            "spec": {"groups": groups}}


def dashboard_config_map(namespace: str, monitoring: Monitoring, name: str, text: str) -> Manifest:
    settings = monitoring.dashboards
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"nvidia-gpu-dashboard-{name}", "namespace": settings.namespace or namespace,
                     "labels": {**app_labels("dashboards", namespace), settings.label: settings.label_value}},
        "data": {f"{name}.json": text},
    }


def namespace_labels(cluster: Cluster) -> dict[str, str]:
    """Labels the stack's namespace needs for the cluster's Prometheus to look into it."""
    if cluster.node_setup is NodeSetupBackend.DECKHOUSE and cluster.monitoring.operator:
        return dict(DECKHOUSE_NAMESPACE_LABELS)
    return {}
