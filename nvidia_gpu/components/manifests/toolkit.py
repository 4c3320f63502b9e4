"""NVIDIA's toolkit container for a node group whose nodes have no NVIDIA Container Toolkit
(``nodeGroups[].toolkit.source: container``; the paths and the installer's facts are ``nvgpu.toolkit``).

One DaemonSet per such group runs NVIDIA's ``container-toolkit`` image as the GPU Operator does: its
``nvidia-ctk-installer`` copies the toolkit into ``<installDir>/toolkit`` on the host, writes the toolkit's
config there, and stays running (it holds ``/run/nvidia/toolkit/toolkit.pid``). Unlike the operator's,
it runs with ``--no-runtime-config``: node setup alone writes containerd's or CRI-O's config (one owner,
journaled, undone by teardown) and points the nvidia runtime at the installed binary once it is there,
so GPU pods wait for the toolkit as they wait for the driver. The installer's own config settings come
from this stack's: the driver root (``/run/nvidia/driver`` where a driver container installs it), device
lists as volume mounts with ``NVIDIA_VISIBLE_DEVICES`` refused to unprivileged containers unless the group
chose the ``envvar`` strategy, no CDI spec of its own (the device plugin and DRA plugin write the specs),
and no device nodes created. Its pods land on the group's nodes before node setup's gate opens (setup
waits for the toolkit), and tolerate the group's taints. ``RollingUpdate``: a new image reinstalls in
place; running containers keep the runtime they started with. When a node leaves the group, node setup's
teardown removes the installed directory; a container whose install went missing is restarted by its
liveness probe, and reinstalls.
"""

from __future__ import annotations

from typing import Any

from nvgpu import toolkit as toolkitspec
from nvgpu.stackconfig import GroupPlan, NodeGroup
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, group_object_name
from nvidia_gpu.components.manifests.scheduling import node_selector_terms, tolerations

COMPONENT = toolkitspec.COMPONENT
#: Where the host's driver root is mounted in the installer's container (``--driver-root-ctr-path``).
DRIVER_ROOT_IN_CONTAINER = "/driver-root"
RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}


def daemonset_name(group: NodeGroup) -> str:
    return group_object_name(COMPONENT, group.name)


def installer_args(plan: GroupPlan) -> list[str]:
    """The installer's flags: where it installs, and the toolkit config node setup would otherwise edit in."""
    return [
        f"--toolkit-install-dir={plan.toolkit_install_dir}",
        "--no-runtime-config",
        f"--pid-file={toolkitspec.PID_FILE}",
        f"--driver-root={plan.driver_root}",
        f"--driver-root-ctr-path={DRIVER_ROOT_IN_CONTAINER}",
        f"--accept-nvidia-visible-devices-envvar-when-unprivileged={'true' if plan.accept_envvar else 'false'}",
        "--accept-nvidia-visible-devices-as-volume-mounts=true",
        "--cdi-enabled=false",
        "--create-device-nodes=none",
    ]


def toolkit_daemonset(namespace: str, group: NodeGroup, plan: GroupPlan) -> Manifest:
    """The installer's DaemonSet for ``group`` (``plan``: what the stack decided for it)."""
    t = group.toolkit
    name = daemonset_name(group)
    pod_labels = {**app_labels(COMPONENT, group.name, node_group=group.name), "app.kubernetes.io/instance": name}
    install_dir = t.install_dir
    driver_root = plan.driver_root
    # The image is distroless with busybox's shell (NVIDIA's Dockerfile links /bin/sh to it).
    installed = {"exec": {"command": ["sh", "-c", f"test -x {toolkitspec.runtime_binary(install_dir)}"]}}
    container: dict[str, Any] = {
        "name": COMPONENT,
        "image": t.image.ref,
        "imagePullPolicy": t.image.pull_policy,
        "command": [toolkitspec.INSTALLER],
        "args": installer_args(plan),
        "resources": RESOURCES,
        # Writes the host's install directory and takes a lock under the host's /run/nvidia.
        "securityContext": {"privileged": True},
        # Ready once the installer wrote the wrapper node setup points the runtime at; restarted (and so
        # reinstalled) when it is gone, as when a node setup pod deleted to re-run setup took it with it.
        "startupProbe": {**installed, "periodSeconds": 2, "failureThreshold": 150},
        "readinessProbe": {**installed, "periodSeconds": 10, "failureThreshold": 1},
        "livenessProbe": {**installed, "periodSeconds": 10, "failureThreshold": 3},
        "volumeMounts": [
            {"name": "toolkit-install-dir", "mountPath": install_dir},
            {"name": "run-nvidia-toolkit", "mountPath": toolkitspec.PID_FILE.rsplit("/", 1)[0]},
            {"name": "driver-root", "mountPath": DRIVER_ROOT_IN_CONTAINER, "readOnly": True,
             "mountPropagation": "HostToContainer"},
        ],
    }
    terms = node_selector_terms(group, require_setup_complete=False)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": COMPONENT, "app.kubernetes.io/instance": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "priorityClassName": plan.priority_class_name,
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": terms}}},
                    "tolerations": tolerations(group),
                    "containers": [container],
                    "volumes": [
                        {"name": "toolkit-install-dir", "hostPath": {"path": install_dir,
                                                                     "type": "DirectoryOrCreate"}},
                        {"name": "run-nvidia-toolkit", "hostPath": {"path": toolkitspec.PID_FILE.rsplit("/", 1)[0],
                                                                    "type": "DirectoryOrCreate"}},
                        {"name": "driver-root", "hostPath": {"path": driver_root, "type": "DirectoryOrCreate"}},
                    ],
                },
            },
        },
    }

