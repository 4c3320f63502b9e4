"""The agent DaemonSets of one node group: device plugin, feature labeller and (off Deckhouse) node setup.

Every container runs a subcommand of the pinned agent image (``python -m node_agent ...``), carries
requests and limits, and a securityContext that is privileged only where the host demands it:

* the device plugin needs the GPU device nodes (``/dev/nvidia*``, for NVML and for the device specs it
  hands to kubelet) and root-owned host sockets under ``/var/lib/kubelet/device-plugins``;
* the setup agent writes ``/proc/sys``, loads kernel modules and rewrites the containerd config on the host.

The labeller only reads NVML through the NVIDIA runtime's injected devices, writes one feature file and
merge-patches its own Node through the API, so it runs unprivileged with a read-only root filesystem and
no capabilities; on MIG groups CAP_SYS_ADMIN alone, which the NVIDIA runtime requires to grant the MIG monitor
capability NVML needs to describe GPUs in MIG mode (:func:`with_mig_monitor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvgpu import devicelist, hostpaths, labels
from nvgpu import driver as driverspec
from nvgpu import toolkit as toolkitspec
from nvgpu.nodelabels import desired_node_labels, desired_node_taints
from nvgpu.nodescripts import facts
from nvgpu.stackconfig import (
    AllocationMode,
    Cluster,
    GroupPlan,
    Monitoring,
    NodeGroup,
    NodeSetupBackend,
    ScrapeMode,
    Sharing,
)
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, group_object_name, selector_labels
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.manifests.scheduling import node_affinity, tolerations
from nvidia_gpu.components.manifests.sharing import MPS_ROOT, config_map_name

AGENT = ["python", "-m", "node_agent"]
#: Where the named device-plugin configs are mounted in the plugin and the labeller containers.
DEVICE_PLUGIN_CONFIG_DIR = "/etc/nvidia-gpu/device-plugin"
#: The agents' status ports (``/metrics``, ``/healthz``, ``/readyz``), each the agent's own default
#: (``tests/nvidia_gpu/components/test_agent_contract.py`` holds them together); the exporter's is 9400.
DEVICE_PLUGIN_METRICS_PORT = 9401
DRA_PLUGIN_METRICS_PORT = 9402
MIG_MANAGER_METRICS_PORT = 9403
NODE_SETUP_METRICS_PORT = 9404
KUBELET_DEVICE_PLUGINS = hostpaths.KUBELET_DEVICE_PLUGINS_DIR
CDI_DIR = facts.CDI_DYNAMIC_DIR
AGENT_STATE_DIR = facts.STATE_DIR
#: The setup agent sees the whole host under this path (``--host-root``), never at ``/``.
HOST_ROOT = "/host"
LABEL_INTERVAL_SECONDS = 60


@dataclass(frozen=True)
class Resources:
    cpu_request: str
    memory_request: str
    cpu_limit: str
    memory_limit: str

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"cpu": self.cpu_limit, "memory": self.memory_limit},
        }


#: The agent's own targets are under 80 MiB RSS; limits leave headroom for NVML and Python.
RESOURCES: dict[AgentRole, Resources] = {
    AgentRole.DEVICE_PLUGIN: Resources("50m", "64Mi", "500m", "192Mi"),
    AgentRole.LABELLER: Resources("10m", "48Mi", "200m", "128Mi"),
    AgentRole.NODE_SETUP: Resources("20m", "64Mi", "500m", "256Mi"),
}
#: The teardown holder: a shell at rest, with room for the teardown its preStop hook runs.
TEARDOWN_HOLD_RESOURCES = Resources("1m", "4Mi", "500m", "256Mi")

#: MPS groups: the ``mps-control-daemon`` container starts ``nvidia-cuda-mps-control -d``
#: (``node_agent.deviceplugin.mps``), and the control daemon forks ``nvidia-cuda-mps-server`` when the
#: first client connects. Both stay in that container's memory cgroup, and so do the pages of the
#: server's shared-memory segments under ``/dev/shm`` (``<mpsRoot>/shm``; tmpfs pages are charged to the
#: cgroup that first touches them): its limit is sized for them (:func:`mps_daemon_resources`), as NVIDIA
#: runs the daemon in its own DaemonSet (``nvidia-device-plugin-mps-control-daemon``) for the same reason.
#:
#: The numbers are an upper estimate, not a measurement (no GPU node was available to measure them):
#: the server is a CUDA process that maps the driver's ``libcuda.so`` (tens of MiB resident) and holds a
#: CUDA context on every GPU of the node, each with host-side state (pushbuffers, pinned staging memory,
#: per-client shared memory). So: a fixed ``MPS_BASE_MIB`` for the control daemon and the server process,
#: plus ``MPS_PER_GPU_MIB`` per GPU, sized for ``MPS_SIZED_FOR_GPUS`` GPUs (an 8-GPU HGX/DGX board, the
#: largest machine the simulator models; a node with more GPUs needs more). Measure ``VmRSS`` of both
#: processes plus the memcg's ``shmem`` on a loaded 8-GPU MPS node to tighten them. The request grows
#: by the base only: the server and its per-GPU state exist only while clients run.
MPS_BASE_MIB = 128
MPS_PER_GPU_MIB = 64
MPS_SIZED_FOR_GPUS = 8


def _mib(quantity: str) -> int:
    if not quantity.endswith("Mi"):
        raise ValueError(f"memory quantity {quantity!r} is not in Mi")
    return int(quantity[:-2])


def mps_daemon_resources() -> Resources:
    """The MPS control daemon container's requests and limits: the agent, plus the daemon and its server."""
    base = RESOURCES[AgentRole.DEVICE_PLUGIN]
    limit = _mib(base.memory_limit) + MPS_BASE_MIB + MPS_PER_GPU_MIB * MPS_SIZED_FOR_GPUS
    request = _mib(base.memory_request) + MPS_BASE_MIB
    return Resources(base.cpu_request, f"{request}Mi", base.cpu_limit, f"{limit}Mi")


_PRIVILEGED: dict[str, Any] = {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0}
_RESTRICTED: dict[str, Any] = {
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

#: Node setup's teardown holder: sleeps until SIGTERM (``sleep`` as PID 1 would ignore it and hold the pod
#: for its whole grace period), its preStop hook running the teardown first.
HOLD_COMMAND = ("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done")


def device_plugin_security(group: NodeGroup) -> dict[str, Any]:
    """The device plugin's securityContext, the least each sharing mode needs (NVIDIA's chart: unprivileged,
    ``SYS_ADMIN`` only for MIG strategies). Root, for kubelet's root-owned device-plugins directory, but with
    no capabilities: writing there and to the CDI directory needs only the owner's permission bits. MPS
    groups too: their control daemon, which sets the GPUs' compute mode, runs in its own privileged
    container (:func:`mps_control_daemon_daemonset`), the plugin only reads that it is up."""
    security = {**_RESTRICTED, "runAsUser": 0, "runAsGroup": 0}
    if group.gpu.sharing is Sharing.MIG:
        security["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    return security


_NODE_NAME_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
#: Asks the NVIDIA runtime for the MIG monitor capability (``/dev/nvidia-caps/nvidia-cap2``), without which
#: NVML refuses a GPU in MIG mode's memory and MIG devices (NO_PERMISSION: NVIDIA/gpu-feature-discovery#6,
#: NVIDIA/k8s-device-plugin#399 and #1683). NVIDIA's charts set it on GFD and the device plugin.
MIG_MONITOR_ENV = {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}


def with_mig_monitor(container: dict[str, Any], group: NodeGroup) -> dict[str, Any]:
    """``container`` (a reader of NVML: the labeller, the agent's exporter) given the MIG monitor capability
    on MIG groups, in the narrowest form the runtime honours: ``NVIDIA_MIG_MONITOR_DEVICES=all`` plus
    CAP_SYS_ADMIN and nothing else, not ``privileged``. nvidia-container-toolkit refuses the variable in a
    container without CAP_SYS_ADMIN in its bounding set (``TestMigCapsValidate``: "errors when requested in a
    non-privileged container"); the policy pack allows exactly this pair (``k8s_security.MIG_MONITOR_ROLES``)."""
    if group.gpu.sharing is not Sharing.MIG:
        return container
    security = dict(container["securityContext"])
    security["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    return {**container, "env": [*container["env"], dict(MIG_MONITOR_ENV)], "securityContext": security}


@dataclass(frozen=True)
class GroupContext:
    """What every workload of one node group needs to know: the settings and the group as written, and
    ``plan``, what the stack decided for the group (allocation mode, driver root, CDI hook, ...), computed
    once by the caller (``GpuNodeGroupArgs.plan``)."""

    namespace: str
    cluster: Cluster
    group: NodeGroup
    plan: GroupPlan

    @property
    def image(self) -> str:
        return self.cluster.agent_image.ref

    @property
    def version(self) -> str | None:
        return self.cluster.agent_image.tag


def _host_path(name: str, path: str, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def _mount(name: str, path: str, read_only: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        out["readOnly"] = True
    return out


_TMP_VOLUME = {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}
_TMP_MOUNT = _mount("tmp", "/tmp")


def _container(
    ctx: GroupContext, name: str, role: AgentRole, args: list[str], security: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "image": ctx.image,
        "imagePullPolicy": ctx.cluster.agent_image.pull_policy,
        "command": list(AGENT),
        "args": args,
        "env": [dict(_NODE_NAME_ENV)],
        "resources": RESOURCES[role].as_dict(),
        "securityContext": dict(security),
    }


def _daemonset(
    ctx: GroupContext,
    component: str,
    role: AgentRole,
    pod_spec: dict[str, Any],
    *,
    require_setup_complete: bool,
    update_strategy: dict[str, Any],
    pod_annotations: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Manifest:
    group = ctx.group
    meta_labels = app_labels(component, group.name, node_group=group.name, version=ctx.version)
    pod_meta: dict[str, Any] = {"labels": meta_labels}
    if pod_annotations:
        pod_meta["annotations"] = pod_annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": group_object_name(component, group.name),
            "namespace": ctx.namespace,
            "labels": meta_labels,
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": {
            "selector": {"matchLabels": selector_labels(component, group.name)},
            "updateStrategy": update_strategy,
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "serviceAccountName": role.value,
                    "automountServiceAccountToken": True,
                    "priorityClassName": ctx.cluster.priority_class_name,
                    "affinity": node_affinity(group, require_setup_complete=require_setup_complete),
                    "tolerations": tolerations(group),
                    **pod_spec,
                },
            },
        },
    }


_ROLLING = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
#: pulumi-kubernetes: do not wait for this object to become ready (see ``setup_daemonset``).
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}


#: Where every agent container sees the node's driver root (``cluster.driverRoot``), read-only: the
#: agent's ``--driver-root`` (NVML and ``nvidia-smi`` are loaded from there, so no container needs the
#: NVIDIA runtime to inject them) and the device plugin's ``containerDriverRoot`` (CDI spec discovery).
CONTAINER_DRIVER_ROOT = "/driver-root"
#: The default ``cluster.driverRoot`` and the plugin's ``nvidiaDriverRoot`` default (drivers installed on the host).
HOST_DRIVER_ROOT = "/"
DRIVER_ROOT_VOLUME = "driver-root"
#: Global agent options (before the command) of every agent container.
DRIVER_ROOT_ARGS = ("--driver-root", CONTAINER_DRIVER_ROOT)


#: Where the device plugin and the DRA plugin see the directory of ``cluster.cdiHookPath`` (read-only), to
#: name the hook in their CDI specs only when it is there (a missing hook would fail every container).
CDI_HOOK_DIR = "/run/nvidia-gpu/cdi-hook"
CDI_HOOK_VOLUME = "cdi-hook"
#: The labeller's request for every GPU of its node, in the toolkit's volume-mounts form.
ALL_GPUS_VOLUME = "all-gpus"


def cdi_hook_volume(cdi_hook: str) -> dict[str, Any]:
    """The directory of the group's CDI hook (``GroupPlan.cdi_hook``) as a hostPath volume (mounted by
    ``cdi_hook_mount``)."""
    # DirectoryOrCreate: /usr/local/nvidia/toolkit exists only once a toolkit container installed the toolkit.
    return _host_path(CDI_HOOK_VOLUME, cdi_hook.rsplit("/", 1)[0] or "/", "DirectoryOrCreate")


def cdi_hook_mount() -> dict[str, Any]:
    return _mount(CDI_HOOK_VOLUME, CDI_HOOK_DIR, read_only=True)


def _containerised(driver_root: str) -> bool:
    return driver_root == driverspec.CONTAINER_DRIVER_ROOT


def driver_root_volume(driver_root: str) -> dict[str, Any]:
    """The node's driver root as a hostPath volume (mounted by ``driver_root_mount``). A driver container's
    root does not exist before the container first runs, and node setup (which publishes the labels that
    place the driver container) must start before it: created empty then, the container mounts over it."""
    return _host_path(DRIVER_ROOT_VOLUME, driver_root, "DirectoryOrCreate" if _containerised(driver_root)
                      else "Directory")


def driver_root_mount(driver_root: str) -> dict[str, Any]:
    """Read-only at ``/driver-root``; for a driver container's root, following the host's mounts
    (``HostToContainer``), so a driver replaced by an upgrade is the one the running agents see."""
    mount = _mount(DRIVER_ROOT_VOLUME, CONTAINER_DRIVER_ROOT, read_only=True)
    if _containerised(driver_root):
        mount["mountPropagation"] = "HostToContainer"
    return mount
CDI_STRATEGIES = frozenset({"cdi-annotations", "cdi-cri"})


def uses_cdi(configs: list[dict[str, Any]]) -> bool:
    """Whether any device-plugin config asks for a CDI device-list strategy (then CDI specs are generated)."""
    for doc in configs:
        strategy = doc.get("flags", {}).get("plugin", {}).get("deviceListStrategy", [])
        if CDI_STRATEGIES & set([strategy] if isinstance(strategy, str) else strategy):
            return True
    return False


def config_source_args(group: NodeGroup) -> list[str]:
    """Where the device plugin and the labeller read the device-plugin config: the group's ConfigMap
    (:func:`config_volume`), the named config the node label picks, the group's sharing mode by default."""
    return ["--config-dir", DEVICE_PLUGIN_CONFIG_DIR, "--config-label", labels.DEVICE_GPU_CONFIG,
            "--default-config", group.gpu.sharing.value]


def config_volume(group: NodeGroup) -> dict[str, Any]:
    return {"name": "config", "configMap": {"name": config_map_name(group)}}


def config_mount() -> dict[str, Any]:
    return _mount("config", DEVICE_PLUGIN_CONFIG_DIR, read_only=True)


def device_plugin_daemonset(ctx: GroupContext) -> Manifest:
    component = AgentRole.DEVICE_PLUGIN.value
    group = ctx.group
    args = [
        *DRIVER_ROOT_ARGS,
        "device-plugin",
        *config_source_args(group),
        *status_args(ctx.cluster, DEVICE_PLUGIN_METRICS_PORT),
    ]
    if ctx.plan.driver_root != HOST_DRIVER_ROOT:
        # CDI specs name the driver's files by their host path under nvidiaDriverRoot.
        args += ["--nvidia-driver-root", ctx.plan.driver_root]
    # CDI specs run the toolkit's hook (nvidiaCTKPath) when the plugin sees it in the mounted directory.
    args += ["--nvidia-ctk-path", ctx.plan.cdi_hook, "--cdi-hook-dir", CDI_HOOK_DIR]
    container = _container(ctx, component, AgentRole.DEVICE_PLUGIN, args, device_plugin_security(group))
    # Unprivileged, as NVIDIA's chart runs its plugin: the NVIDIA runtime injects the GPUs' device nodes
    # (asked for as the labeller does, by the volume-mounts list: the toolkit ignores the variable in
    # unprivileged containers), NVML comes from the read-only driver root.
    container["env"] += [{"name": "NVIDIA_VISIBLE_DEVICES", "value": devicelist.VOLUME_MOUNT_ROOT}]
    container["env"] += [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    if group.gpu.sharing is Sharing.MIG:
        # NVML lists MIG devices only to a process that may read their capabilities; the runtime mounts them
        # (/dev/nvidia-caps) for a container with CAP_SYS_ADMIN that asks (NVIDIA's chart, MIG strategies).
        container["env"] += [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}]
    container["ports"] = metrics_port(DEVICE_PLUGIN_METRICS_PORT)
    # /readyz: every resource is registered with kubelet (node_agent.deviceplugin.metrics), and the
    # status port is ours. No liveness probe on that port: it is optional (a taken port must not stop a
    # plugin that serves the kubelet), so the process ends itself when its supervisor stalls
    # (node_agent.kubelet.deviceplugin.process.Watchdog) and the kubelet restarts it.
    container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 10,
                                   "timeoutSeconds": 2, "failureThreshold": 3}
    mounts = [
        _mount("device-plugins", KUBELET_DEVICE_PLUGINS),
        _mount("cdi", CDI_DIR),
        _mount("mps-root", MPS_ROOT),
        _mount("agent-state", AGENT_STATE_DIR),
        config_mount(),
        # NVML and the driver's binaries (--driver-root); CDI specs list the driver's files found here.
        driver_root_mount(ctx.plan.driver_root),
        cdi_hook_mount(),
        _TMP_MOUNT,
    ]
    volumes = [
        _host_path("device-plugins", KUBELET_DEVICE_PLUGINS, "Directory"),
        _host_path("cdi", CDI_DIR, "DirectoryOrCreate"),
        _host_path("mps-root", MPS_ROOT, "DirectoryOrCreate"),
        _host_path("agent-state", AGENT_STATE_DIR, "DirectoryOrCreate"),
        config_volume(group),
        driver_root_volume(ctx.plan.driver_root),
        cdi_hook_volume(ctx.plan.cdi_hook),
        dict(_TMP_VOLUME),
    ]
    mounts.append(_mount(ALL_GPUS_VOLUME, f"{devicelist.VOLUME_MOUNT_ROOT}/all", read_only=True))
    volumes.append(_host_path(ALL_GPUS_VOLUME, "/dev/null", "CharDevice"))
    container["volumeMounts"] = mounts
    pod_spec = {"containers": [container], "volumes": volumes}
    return _daemonset(ctx, component, AgentRole.DEVICE_PLUGIN, pod_spec, require_setup_complete=True,
                      update_strategy=_ROLLING,
                      pod_annotations=scrape_annotations(ctx.cluster.monitoring, DEVICE_PLUGIN_METRICS_PORT))


#: The component (``app.kubernetes.io/component``) of an MPS group's control daemon DaemonSet.
MPS_CONTROL_DAEMON = "mps-control-daemon"
#: Written by ``mps-daemon`` once every daemon of the node is up (``node_agent.deviceplugin.mps.READY_FILE``).
MPS_READY_FILE = f"{MPS_ROOT}/.ready"


def mps_control_daemon_daemonset(ctx: GroupContext) -> Manifest:
    """An MPS group's control daemons, apart from the device plugin, as NVIDIA runs them.

    NVIDIA/k8s-device-plugin's chart (``templates/daemonset-mps-control-daemon.yml``) runs
    ``mps-control-daemon`` from the plugin's image, privileged, with the MPS root at ``/mps`` and a shared
    ``<mpsRoot>/shm`` as its ``/dev/shm`` (the same directory the plugin's Allocate mounts at ``/dev/shm`` in
    every client), under the plugin's ServiceAccount (it reads the plugin's config and node label). Here the
    agent's ``mps-daemon`` command does the same, with the host's MPS root at its own path (the pipe
    directory names in ``.started`` are the host's) and, as NVIDIA's DRA driver runs its daemon
    (``templates/mps-control-daemon.tmpl.yaml``), ``hostPID``: the daemon and its server then live in the
    host's PID namespace, where a restarted container finds and adopts them, and clients in other pods can
    be told apart by the server. Privileged: it sets the GPUs' compute mode (root, every GPU's device node)
    and the NVIDIA runtime gives it every GPU. Ready once ``mpsRoot/.ready`` exists (NVIDIA's DRA driver
    probes its daemon with ``cat`` of a startup file the same way)."""
    group = ctx.group
    args = [*DRIVER_ROOT_ARGS, "mps-daemon", *config_source_args(group)]
    container = _container(ctx, MPS_CONTROL_DAEMON, AgentRole.DEVICE_PLUGIN, args, dict(_PRIVILEGED))
    container["resources"] = mps_daemon_resources().as_dict()
    container["env"] += [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                         {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    container["readinessProbe"] = {"exec": {"command": ["cat", MPS_READY_FILE]}, "periodSeconds": 5,
                                   "timeoutSeconds": 2, "failureThreshold": 3}
    container["volumeMounts"] = [
        _mount("mps-root", MPS_ROOT),
        _mount("mps-shm", "/dev/shm"),
        config_mount(),
        driver_root_mount(ctx.plan.driver_root),
        _TMP_MOUNT,
    ]
    pod_spec = {
        "hostPID": True,
        "containers": [container],
        "volumes": [
            _host_path("mps-root", MPS_ROOT, "DirectoryOrCreate"),
            _host_path("mps-shm", f"{MPS_ROOT}/shm", "DirectoryOrCreate"),
            config_volume(group),
            driver_root_volume(ctx.plan.driver_root),
            dict(_TMP_VOLUME),
        ],
    }
    return _daemonset(ctx, MPS_CONTROL_DAEMON, AgentRole.DEVICE_PLUGIN, pod_spec, require_setup_complete=True,
                      update_strategy=_ROLLING)


def scrape_annotations(monitoring: Monitoring, port: int) -> dict[str, str]:
    """``prometheus.io/*`` on an agent's pods for annotation-based scrapers (``cluster.monitoring.scrape:
    annotations``); none when a ServiceMonitor or PodMonitor selects them
    (``nvidia_gpu.components.manifests.monitoring``) or monitoring is off."""
    if not monitoring.enabled or monitoring.scrape is not ScrapeMode.ANNOTATIONS:
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def pod_annotations(cluster: Cluster, port: int) -> dict[str, Any]:
    """A pod template's ``annotations`` entry with :func:`scrape_annotations`, or nothing at all."""
    annotations = scrape_annotations(cluster.monitoring, port)
    return {"annotations": annotations} if annotations else {}


def status_args(cluster: Cluster, port: int) -> list[str]:
    """An agent's status-port flags: the port, and ``--metrics-port-required`` where the stack asks for it
    (``cluster.monitoring.requireStatusPort``; otherwise a taken port does not stop the agent)."""
    return ["--metrics-port", str(port), *(["--metrics-port-required"] if cluster.monitoring.require_status_port
                                           else [])]


def metrics_port(port: int) -> list[dict[str, Any]]:
    """The container port every scrape object and probe names (``metrics``)."""
    return [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]


def labeller_args(ctx: GroupContext) -> list[str]:
    """``labels`` reading the device plugin's own config, so the GFD labels follow what the plugin serves.

    Device-plugin groups: the same config source as the plugin (:func:`config_source_args`, the ConfigMap
    mounted the same way), as NVIDIA's GFD shares the plugin's config file. ``.replicas``,
    ``.sharing-strategy``, ``-SHARED``, ``mps.capable`` and ``mig.strategy`` then come from the named config
    the node label picks, and follow an operator who relabels a node to another mode within one interval.
    DRA groups have no such config (and no ConfigMap): their labels take the group's sharing as flags.

    ``--daemonset`` names the labeller's own DaemonSet: it labels only behind that DaemonSet's setup gate and
    withdraws its labels when the DaemonSet is deleted (``node_agent.labeller.labels``).

    On the daemonset backend there is no NodeGroup node template, so the labeller also keeps the group's
    own labels and taints on each node (``--node-label``/``--node-taint``, from ``nvgpu.nodelabels``, the
    same source the Deckhouse node template uses). NVML comes from the driver root (``--driver-root``).
    """
    gpu = ctx.group.gpu
    if ctx.plan.allocation_mode is AllocationMode.DEVICE_PLUGIN:
        sharing = config_source_args(ctx.group)
    else:
        mig_strategy = gpu.effective_mig.strategy.value if gpu.sharing is Sharing.MIG else "none"
        sharing = ["--mig-strategy", mig_strategy, "--replicas", str(gpu.replicas),
                   "--sharing-strategy", "mps" if gpu.sharing is Sharing.MPS else "time-slicing"]
    args = [
        *DRIVER_ROOT_ARGS,
        "labels", "--loop", "--interval", str(LABEL_INTERVAL_SECONDS), "--patch-node",
        *sharing,
        # Its own DaemonSet: the labels go when it does (group removed, stack destroyed), not on a restart.
        "--daemonset", f"{ctx.namespace}/{group_object_name(AgentRole.LABELLER.value, ctx.group.name)}",
    ]
    # One gpus.gpu.nvidia-gpu.io object per GPU of the node (nvidia_gpu.components.manifests.inventory).
    args += ["--inventory", "--inventory-sharing", gpu.sharing.value,
             "--inventory-allocation-mode", ctx.plan.allocation_mode.value]
    if ctx.plan.allocation_mode is AllocationMode.DRA:
        args += ["--inventory-dra-driver", ctx.cluster.dra.driver_name]
    if ctx.cluster.node_setup is NodeSetupBackend.DAEMONSET:
        for key, value in desired_node_labels(ctx.group, ctx.plan).items():
            args += ["--node-label", f"{key}={value}"]
        for taint in desired_node_taints(ctx.group):
            args += ["--node-taint", taint.flag()]
    return args


def labeller_daemonset(ctx: GroupContext) -> Manifest:
    component = AgentRole.LABELLER.value
    container = _container(ctx, component, AgentRole.LABELLER, labeller_args(ctx), _RESTRICTED)
    # The NVIDIA runtime injects the GPUs' device nodes into this unprivileged container; NVML itself comes
    # from the read-only driver root (--driver-root), not from the runtime. The GPUs are asked for as a
    # device plugin's volume-mounts list does (/dev/null at <list root>/all): node setup makes the toolkit
    # ignore NVIDIA_VISIBLE_DEVICES in unprivileged containers, and only a pod allowed hostPath volumes, as
    # this namespace's are, can ask this way.
    container["env"] += [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": devicelist.VOLUME_MOUNT_ROOT},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
    ]
    # MIG groups: the MIG monitor capability, or NVML hides the MIG GPUs' memory and MIG devices.
    container = with_mig_monitor(container, ctx.group)
    # No probe: the loop has no endpoint, and a wedged loop only delays labels the setup gate already guards.
    # Gated on gpu-setup-complete like the other GPU pods, also on the daemonset backend where it applies the
    # group's labels and taints: node setup (check, runtime, sysctl, VFIO) reads none of them, their readers
    # (the device plugin, which falls back to the group's own sharing config, and the MIG manager) wait for
    # setup themselves, and the labeller needs the NVIDIA runtime that setup configures. Nodes that must
    # never take other pods before then get the GPU taint at provisioning too (stack output nodeTemplates);
    # the labeller then leaves that taint alone, as it is not the one that set it.
    mounts = [_mount("features", labels.NFD_FEATURES_DIR), driver_root_mount(ctx.plan.driver_root), _TMP_MOUNT,
              _mount(ALL_GPUS_VOLUME, f"{devicelist.VOLUME_MOUNT_ROOT}/all", read_only=True)]
    volumes = [_host_path("features", labels.NFD_FEATURES_DIR, "DirectoryOrCreate"),
               driver_root_volume(ctx.plan.driver_root), dict(_TMP_VOLUME),
               _host_path(ALL_GPUS_VOLUME, "/dev/null", "CharDevice")]
    if ctx.plan.allocation_mode is AllocationMode.DEVICE_PLUGIN:
        mounts.append(config_mount())  # the device plugin's named configs (labeller_args)
        volumes.append(config_volume(ctx.group))
    container["volumeMounts"] = mounts
    pod_spec = {
        # Root (for the root-owned features.d directory) but with no capabilities and no escalation.
        "securityContext": {"runAsUser": 0, "runAsGroup": 0},
        "containers": [container],
        "volumes": volumes,
    }
    return _daemonset(ctx, component, AgentRole.LABELLER, pod_spec, require_setup_complete=True,
                      update_strategy=_ROLLING)


def setup_daemonset(ctx: GroupContext) -> Manifest:
    """Node setup for clusters without Deckhouse.

    The init container runs ``setup`` (check, runtime, sysctl, then the setup-complete label), so a
    node that cannot be prepared shows ``Init:Error`` with the reason and the gate stays closed. The
    main container holds the pod so that its ``preStop`` hook can undo the setup when the pod goes
    away, and meanwhile runs ``setup-monitor``: the same check every few minutes, its verdict and
    findings as metrics (a driver unloaded or a runtime config rewritten after setup shows there).

    Teardown story: ``updateStrategy: OnDelete`` makes a pod's deletion mean "this node leaves the
    group" (the node no longer matches, the group or the stack is removed, or an operator deletes the
    pod on purpose), and only then ``preStop`` runs ``teardown``: the label, the containerd drop-in
    and the sysctl change are rolled back. A new image therefore rolls out node by node, when an
    operator deletes each pod, never as a surprise restart of containerd across the fleet.
    """
    component = AgentRole.NODE_SETUP.value
    driver_root = ctx.plan.driver_root
    # NVML from the driver root: the NVIDIA runtime this pod would otherwise need is what setup configures.
    base = ["--host-root", HOST_ROOT, *DRIVER_ROOT_ARGS]
    # Privileged: the agent writes /proc/sys, loads kernel modules and restarts containerd through the
    # host's systemd (reached via the host root mount and chroot, so hostPID is not needed).
    # Passthrough groups (DRA, vfio.gpu.nvidia.com) also get VFIO prepared: modules and the IOMMU check.
    expect = ctx.plan.node_setup_expectation.args()  # check compares the loaded driver with the group's
    setup = [*base, "setup", *(["--dra"] if ctx.plan.passthrough else []), *expect]
    if ctx.plan.accept_envvar:  # the group chose the envvar device list
        setup.append("--accept-envvar-when-unprivileged")
    teardown = [*AGENT, *base, "teardown"]
    # The main container checks the node again every few minutes and serves the findings
    # (node_agent.setup.monitor: read-only, nothing recorded); SIGTERM ends it, then preStop tears down.
    monitor = [*base, "setup-monitor", *status_args(ctx.cluster, NODE_SETUP_METRICS_PORT), *expect]
    if ctx.group.toolkit.container:
        # NVIDIA's toolkit container installs the toolkit (and its config, from the stack's flags): the runtime
        # runs the installed binary once it is there, and teardown removes the install when the node leaves.
        toolkit_dir = ["--toolkit-dir", toolkitspec.toolkit_dir(ctx.group.toolkit.install_dir)]
        setup += toolkit_dir
        teardown += toolkit_dir
        monitor += toolkit_dir
    elif _containerised(driver_root):  # the host's toolkit must look for the driver where the container put it
        setup += ["--toolkit-driver-root", driver_root]
    init = _container(ctx, component, AgentRole.NODE_SETUP, setup, _PRIVILEGED)
    # Only setup and teardown write the host. The hold container does nothing but hold the teardown (its
    # preStop hook) with the host root writable: a shell waiting for SIGTERM, not an interpreter. The
    # monitor reads: the host root is mounted read-only there. It stays privileged only because NVML opens
    # the GPUs' device nodes and this pod, which configures the NVIDIA runtime, cannot have them injected
    # (its sandbox predates the runtime's configuration).
    hold = _container(ctx, f"{component}-hold", AgentRole.NODE_SETUP, [], _PRIVILEGED)
    hold["command"] = list(HOLD_COMMAND)
    hold["resources"] = TEARDOWN_HOLD_RESOURCES.as_dict()
    hold["lifecycle"] = {"preStop": {"exec": {"command": teardown}}}
    watch = _container(ctx, f"{component}-monitor", AgentRole.NODE_SETUP, monitor, _PRIVILEGED)
    watch["ports"] = metrics_port(NODE_SETUP_METRICS_PORT)
    mounts = [_mount("host-root", HOST_ROOT), driver_root_mount(driver_root), _TMP_MOUNT]
    init["volumeMounts"] = list(mounts)
    hold["volumeMounts"] = list(mounts)
    watch["volumeMounts"] = [_mount("host-root", HOST_ROOT, read_only=True), driver_root_mount(driver_root),
                             _TMP_MOUNT]
    pod_spec = {
        "hostPID": False,
        "terminationGracePeriodSeconds": 120,
        "initContainers": [init],
        "containers": [hold, watch],
        "volumes": [_host_path("host-root", "/", "Directory"), driver_root_volume(driver_root), dict(_TMP_VOLUME)],
    }
    # The provider waits for a DaemonSet's rollout; an OnDelete one rolls only when an operator deletes
    # pods, so a template change would hang `pulumi up` until its timeout (the provider's own docs).
    # Progress is per node and visible (Init:Error, the setup-complete label), not a stack-wide state.
    return _daemonset(ctx, component, AgentRole.NODE_SETUP, pod_spec, require_setup_complete=False,
                      update_strategy={"type": "OnDelete"}, annotations=dict(SKIP_AWAIT),
                      pod_annotations=scrape_annotations(ctx.cluster.monitoring, NODE_SETUP_METRICS_PORT))
