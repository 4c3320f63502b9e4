"""The group's NVIDIA driver when the stack deploys it: NVIDIA's driver container (``gpu.driver.source:
container``), or NVIDIA's GPU Operator told by an ``NVIDIADriver`` (``gpuOperator``).

**container**: one DaemonSet per OS release of the group (``driver.osReleases``), and per kernel when
precompiled (``driver.kernels``), as NVIDIA's operator runs them: NVIDIA's image for that OS
(``<repository>/<name>:<version>-<os>``, ``<branch>-<kernel>-<os>`` when precompiled; by digest where
``image.digests`` lists the tag), ``nvidia-driver init`` privileged with the host's PID namespace, the
driver installed under ``/run/nvidia/driver`` (propagated to the host, where the agents read it:
``cluster.driverRoot``), ready once ``nvidia-smi`` answers. Its pods land on the group's nodes of that OS
(and kernel), by the labels node setup publishes before its check (``nvgpu.labels.OS_LABELS``), and never
where node setup found a driver of the host's own (``nvidia.com/gpu.deploy.driver=pre-installed``). Node
setup's check passes once the driver is loaded, which opens the gate for every other agent. ``OnDelete``:
a new version replaces a node's driver pod only when the upgrade (one node at a time, drained first)
deletes it, never as a fleet-wide restart.

**gpuOperator**: one ``NVIDIADriver`` (``nvidia.com/v1alpha1``, cluster-scoped) per node group, as the operator's CRD
defines it (vendored in ``nvidia_gpu/preview/crds``, so the preview validates it offline): the group's
driver type, version or branch, precompiled or not, kernel module type and image, its nodes (the group's
selector), its tolerations, and the upgrade policy (one node at a time by default, drained first). The
operator then runs one driver DaemonSet per OS release (per kernel when precompiled) on those nodes and
upgrades them node by node. The cluster's ``ClusterPolicy`` must set ``driver.useNvidiaDriverCRD: true``
(and leave the device plugin, GFD and MIG manager to this stack: ``devicePlugin.enabled: false`` etc.).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from nvgpu import driver as driverspec
from nvgpu import labels
from nvgpu.stackconfig import Cluster, NodeGroup
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, cluster_object_name
from nvidia_gpu.components.manifests.scheduling import node_selector_terms, tolerations
from nvidia_gpu.components.manifests.workloads import (
    AGENT,
    DRIVER_ROOT_ARGS,
    HOST_ROOT,
    SKIP_AWAIT,
    driver_root_mount,
    driver_root_volume,
    status_args,
)

DRIVER_API = "nvidia.com/v1alpha1"
#: The driver container's role (the policy pack allows it privileged, hostPID and host paths).
COMPONENT = driverspec.CONTAINER_COMPONENT
#: The driver DaemonSet's pod label naming the OS release (and kernel) it serves; its ``version`` label
#: is the driver's, which the upgrade compares with the node's.
OS_LABEL = "gpu.nvidia-gpu.io/driver-os"
VERSION_LABEL = "gpu.nvidia-gpu.io/driver-version"
#: The label selector of every driver pod (the upgrade controller lists them by it).
DRIVER_SELECTOR_LABEL = f"app.kubernetes.io/name={COMPONENT}"
RUN_NVIDIA = "/run/nvidia"
VALIDATIONS = f"{RUN_NVIDIA}/validations"
READY_MARKER = f"{VALIDATIONS}/.driver-ctr-ready"
#: The driver container builds and loads the modules (minutes when compiling); NVIDIA's chart requests.
RESOURCES = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
#: The driver pod's own check (the agent's ``setup-monitor``): its status port, inside the pod's network.
CHECK_PORT = 9405
#: How often the driver pod's check runs: a loaded driver shows Ready within this.
CHECK_INTERVAL_S = 30
CHECK_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}


def check_container(cluster: Cluster, group: NodeGroup) -> dict[str, Any]:
    """The agent's check beside NVIDIA's driver container: Ready only while the node is usable with the
    driver this template declares (version or branch, kernel modules), so a driver pod is Ready, and an
    upgrade validated, once our ``check`` agrees with NVIDIA's ``nvidia-smi`` probe. The template is the
    one place that always carries the current declaration (node setup's pods are ``OnDelete``).
    Privileged as node setup's check is: NVML opens the GPUs' device nodes."""
    # Its verdict is the pod's readiness; node setup's monitor is the one that labels the node.
    args = ["--host-root", HOST_ROOT, *DRIVER_ROOT_ARGS, "setup-monitor", "--phase", "host", "--ready-when-usable",
            "--no-patch-node",
            "--interval", str(CHECK_INTERVAL_S), *status_args(cluster, CHECK_PORT),
            *group.gpu.driver_expectation.args()]
    return {
        "name": "driver-check",
        "image": cluster.agent_image.ref,
        "imagePullPolicy": cluster.agent_image.pull_policy,
        "command": list(AGENT),
        "args": args,
        "resources": CHECK_RESOURCES,
        "securityContext": {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0},
        "ports": [{"name": "check", "containerPort": CHECK_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": CHECK_PORT}, "periodSeconds": 10,
                           "timeoutSeconds": 5, "failureThreshold": 1},
        "volumeMounts": [{"name": "host-root", "mountPath": HOST_ROOT, "readOnly": True,
                          "mountPropagation": "HostToContainer"},
                         driver_root_mount(driverspec.CONTAINER_DRIVER_ROOT)],
    }


@dataclass(frozen=True)
class DriverTarget:
    """One driver DaemonSet: an OS release of the group, and a kernel when precompiled."""

    os_release: str
    kernel: str | None = None

    @property
    def os_id(self) -> str:
        m = re.match(r"^([a-z]+)([0-9].*)$", self.os_release)
        assert m, self.os_release  # driverspec.check_os_release admitted it
        return m.group(1)

    @property
    def version_id(self) -> str:
        return self.os_release[len(self.os_id):]


def targets(group: NodeGroup) -> list[DriverTarget]:
    d = group.gpu.driver
    kernels: list[str | None] = list(d.kernels) if d.precompiled else [None]
    return [DriverTarget(os, k) for os in d.os_releases for k in kernels]


def daemonset_name(group: NodeGroup, target: DriverTarget) -> str:
    """``nvidia-driver-<group>-<os>`` (``-<kernel hash>`` when precompiled), within 63 characters."""
    name = f"{COMPONENT}-{group.name}-{target.os_release.replace('.', '-')}"
    if target.kernel is not None:
        name += "-" + hashlib.sha256(target.kernel.encode()).hexdigest()[:8]
    return name if len(name) <= 63 else f"{name[:54]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def image(group: NodeGroup, target: DriverTarget) -> str:
    d = group.gpu.driver
    version = d.parsed_version
    assert version is not None  # source container requires it (stack config)
    tag = driverspec.image_tag(version, target.os_release, target.kernel)
    ref = f"{d.image.repository}/{d.image.name}:{tag}"
    digest = d.image.digests.get(tag)
    return f"{ref}@{digest}" if digest else ref


def _driver_affinity(group: NodeGroup, target: DriverTarget) -> dict[str, Any]:
    """The group's nodes of this OS release (and kernel), unless their host has a driver of its own."""
    terms = node_selector_terms(group, require_setup_complete=False)
    extra = [{"key": labels.OS_RELEASE_ID, "operator": "In", "values": [target.os_id]},
             {"key": labels.OS_RELEASE_VERSION_ID, "operator": "In", "values": [target.version_id]},
             {"key": labels.GPU_DEPLOY_DRIVER, "operator": "NotIn", "values": [labels.DRIVER_PREINSTALLED]}]
    if target.kernel is not None:
        extra.append({"key": labels.KERNEL_VERSION_FULL, "operator": "In", "values": [target.kernel]})
    for term in terms:
        term["matchExpressions"].extend(dict(e) for e in extra)
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def upgrade_policy(group: NodeGroup) -> str:
    u = group.gpu.driver.upgrade
    return driverspec.UpgradePolicy(max_unavailable=u.max_unavailable, drain=u.drain,
                                    drain_timeout_s=float(u.drain_timeout_seconds),
                                    validation_timeout_s=float(u.validation_timeout_seconds),
                                    force=u.force, delete_empty_dir=u.delete_empty_dir).to_annotation()


def driver_spec_hash(container: dict[str, Any], volumes: list[dict[str, Any]], check_args: list[str]) -> str:
    """What decides the driver a pod runs (``nvgpu.driver.DRIVER_SPEC_ANNOTATION``): the driver container,
    the volumes and the declaration the check verifies, not the check's image or interval."""
    text = json.dumps({"container": container, "volumes": volumes, "check": check_args}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _host_path(name: str, path: str, kind: str = "") -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, **({"type": kind} if kind else {})}}


def driver_daemonset(namespace: str, cluster: Cluster, group: NodeGroup, target: DriverTarget) -> Manifest:
    d = group.gpu.driver
    name = daemonset_name(group, target)
    os_value = target.os_release + (f"-{target.kernel}" if target.kernel else "")
    pod_labels = {**app_labels(COMPONENT, group.name, node_group=group.name),
                  "app.kubernetes.io/instance": name, OS_LABEL: os_value[:63].rstrip("-._")}
    version_label = {VERSION_LABEL: d.version} if d.version else {}
    container = {
        "name": "nvidia-driver-ctr",
        "image": image(group, target),
        "imagePullPolicy": d.image.pull_policy,
        "command": ["nvidia-driver"],
        "args": ["init"],
        "env": [{"name": "KERNEL_MODULE_TYPE", "value": d.kernel_modules.value},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": RESOURCES,
        # Loads and unloads kernel modules and writes the driver into the host's /run/nvidia.
        "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
        "volumeMounts": [
            {"name": "run-nvidia", "mountPath": RUN_NVIDIA, "mountPropagation": "Bidirectional"},
            {"name": "var-log", "mountPath": "/var/log"},
            {"name": "dev-log", "mountPath": "/dev/log"},
            {"name": "host-os-release", "mountPath": "/host-etc/os-release", "readOnly": True},
            {"name": "firmware-search-path", "mountPath": "/sys/module/firmware_class/parameters/path"},
            {"name": "nv-firmware", "mountPath": "/lib/firmware"},
        ],
        # Compiling takes minutes: up to 20 for the modules to load and nvidia-smi to answer. Older driver
        # images do not make the validations directory the marker goes in.
        "startupProbe": {"exec": {"command": ["sh", "-c",
                                              f"nvidia-smi && mkdir -p {VALIDATIONS} && touch {READY_MARKER}"]},
                         "initialDelaySeconds": driverspec.STARTUP_INITIAL_DELAY_S,
                         "periodSeconds": driverspec.STARTUP_PERIOD_S, "timeoutSeconds": 60,
                         "failureThreshold": driverspec.STARTUP_FAILURE_THRESHOLD, "successThreshold": 1},
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", f"rm -f {READY_MARKER}"]}}},
    }
    check = check_container(cluster, group)
    volumes = [
        _host_path("host-root", "/", "Directory"),
        driver_root_volume(driverspec.CONTAINER_DRIVER_ROOT),
        _host_path("run-nvidia", RUN_NVIDIA, "DirectoryOrCreate"),
        _host_path("var-log", "/var/log"),
        _host_path("dev-log", "/dev/log"),
        _host_path("host-os-release", "/etc/os-release"),
        _host_path("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        _host_path("nv-firmware", f"{RUN_NVIDIA}/driver/lib/firmware", "DirectoryOrCreate"),
    ]
    spec_hash = driver_spec_hash(container, volumes, group.gpu.driver_expectation.args())
    # The upgrade's taint keeps the node's GPU agents away while the driver is replaced; the new driver
    # pod must still start there.
    upgrade_toleration = {"key": driverspec.UPGRADE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        # Not awaited: OnDelete rolls only as the upgrade deletes pods, and compiling takes minutes per node.
        # The upgrade controller reads the group's policy here (the stack config stays its one source).
        "metadata": {"name": name, "namespace": namespace, "labels": {**pod_labels, **version_label},
                     "annotations": {**SKIP_AWAIT, driverspec.UPGRADE_POLICY_ANNOTATION: upgrade_policy(group)}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": COMPONENT, "app.kubernetes.io/instance": name}},
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": {**pod_labels, **version_label},
                             "annotations": {driverspec.DRIVER_SPEC_ANNOTATION: spec_hash}},
                "spec": {
                    "hostPID": True,
                    "automountServiceAccountToken": False,
                    "priorityClassName": cluster.priority_class_name,
                    "terminationGracePeriodSeconds": 120,
                    "affinity": _driver_affinity(group, target),
                    "tolerations": [*tolerations(group), upgrade_toleration],
                    "containers": [container, check],
                    "volumes": volumes,
                },
            },
        },
    }


def driver_daemonsets(namespace: str, cluster: Cluster, group: NodeGroup) -> list[Manifest]:
    return [driver_daemonset(namespace, cluster, group, t) for t in targets(group)]


def _placement(group: NodeGroup) -> dict[str, Any]:
    """``nodeSelector`` when the group is chosen by labels alone, else the same terms as ``nodeAffinity``."""
    if not group.match_expressions:
        return {"nodeSelector": dict(group.match_labels)}
    terms = node_selector_terms(group, require_setup_complete=False)
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def nvidia_driver(namespace: str, cluster: Cluster, group: NodeGroup) -> Manifest:
    d = group.gpu.driver
    upgrade = d.upgrade
    spec: dict[str, Any] = {
        "default": False,
        "driverType": d.driver_type.value,
        "version": d.version,
        "usePrecompiled": d.precompiled,
        "kernelModuleType": d.kernel_modules.value,
        "repository": d.image.repository,
        "image": d.image.name,
        "imagePullPolicy": d.image.pull_policy,
        **_placement(group),
        "tolerations": tolerations(group),
        "priorityClassName": cluster.priority_class_name,
        "upgradePolicy": {
            "autoUpgrade": True,
            "maxParallelUpgrades": upgrade.max_unavailable,
            "maxUnavailable": upgrade.max_unavailable,
            # Pods holding GPUs go first in any case; drain moves the rest of the node's pods too.
            "podDeletion": {"force": upgrade.force, "deleteEmptyDir": upgrade.delete_empty_dir,
                            "timeoutSeconds": upgrade.drain_timeout_seconds},
            "drain": {"enable": upgrade.drain, "force": upgrade.force, "deleteEmptyDir": upgrade.delete_empty_dir,
                      "timeoutSeconds": upgrade.drain_timeout_seconds},
            "waitForCompletion": {"timeoutSeconds": 0},
        },
    }
    return {
        "apiVersion": DRIVER_API,
        "kind": "NVIDIADriver",
        "metadata": {"name": cluster_object_name(namespace, f"driver-{group.name}"),
                     "labels": app_labels(COMPONENT, namespace, node_group=group.name)},
        "spec": spec,
    }
