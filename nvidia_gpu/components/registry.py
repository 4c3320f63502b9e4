"""The one list of nvidia-gpu's components: what each is called, where it lives, what it takes and what it does.

Everything that lists the components is derived from :data:`COMPONENTS`:

- the Python library's exports (``nvidia_gpu.__all__``: each component and its ``...Args``, loaded on first use);
- the multi-language package (``nvidia_gpu.package.COMPONENTS``, served by ``provider/__main__.py``): each
  served class takes its schema description from :attr:`Component.doc`, and its settings objects are the
  entry's :attr:`Component.settings`;
- the reference page ``docs/reference/components.md`` (``python -m nvidia_gpu.components.reference``).

``tests/nvidia_gpu/test_registry.py`` holds every component to all three. Plain data only: ``import nvidia_gpu``
reads this module, and neither the policy pack nor the preview should pay for Pulumi's import to do so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The package name: the first part of every type token (``nvidia-gpu:index:<Name>``).
PACKAGE = "nvidia-gpu"

#: The stack-config objects a component takes, as the package and the stack config spell them: ``cluster``
#: (the ``nvidia-gpu:cluster`` object), ``group`` (one entry of ``nvidia-gpu:nodeGroups``) or ``groups``
#: (the whole list).
Settings = Literal["cluster", "group", "groups"]


@dataclass(frozen=True)
class Component:
    #: The class name: the Python component's, the served one's, and the type token's last part.
    name: str
    #: The module of the Python component (and its ``<name>Args``).
    module: str
    #: What the component deploys and what it needs: the package schema's description of the resource and
    #: the reference page's paragraph.
    doc: str
    #: The stack-config objects the served component takes (the Python one takes the validated models).
    settings: tuple[Settings, ...]

    @property
    def token(self) -> str:
        """The type token, the URN's type: unchanged since the component was first released."""
        return f"{PACKAGE}:index:{self.name}"

    @property
    def args(self) -> str:
        """The Python component's args class (in :attr:`module`)."""
        return f"{self.name}Args"


COMPONENTS: tuple[Component, ...] = (
    Component(
        "GpuPlatform", "nvidia_gpu.components.platform",
        "The cluster-wide part of nvidia-gpu: the agents' namespace, ServiceAccounts and least-privilege "
        "RBAC, and the ``nvidia`` RuntimeClass for users' GPU pods. Every other component depends on it "
        "(``dependsOn``): their agents run under its ServiceAccounts.",
        ("cluster",)),
    Component(
        "GpuNodeGroup", "nvidia_gpu.components.node_group",
        "One group of GPU nodes: node setup (Deckhouse NodeGroupConfigurations or the setup DaemonSet), the "
        "labeller, the driver and toolkit containers where the group asks for them, and in device-plugin mode "
        "the device plugin with its sharing configs (a ``SharingPolicy``: exclusive, time-slicing, MPS, MIG). "
        "Depends on its ``GpuPlatform``.",
        ("cluster", "group")),
    Component(
        "SharingPolicy", "nvidia_gpu.components.sharing_policy",
        "One node group's device-plugin configuration as a ConfigMap: a config in NVIDIA's device-plugin "
        "format for each sharing mode (``Exclusive``, ``TimeSlicing``, ``MPS``, ``MIG``) with the group's "
        "parameters, the group's own mode the default. A ``GpuNodeGroup`` in device-plugin mode creates its "
        "own (same ConfigMap name): on its own, for a device plugin the stack does not run (NVIDIA's Helm "
        "chart, ``config.name``), never beside a device-plugin ``GpuNodeGroup`` of the same group and namespace.",
        ("cluster", "group")),
    Component(
        "MigProfile", "nvidia_gpu.components.mig_profile",
        "The stack's MIG layouts as a mig-parted ConfigMap, and the MIG manager DaemonSet that applies them "
        "on every group that can have MIG GPUs. One per cluster; depends on its ``GpuPlatform``.",
        ("cluster", "groups")),
    Component(
        "DraStack", "nvidia_gpu.components.dra_stack",
        "DRA mode (Kubernetes 1.34+) for the groups whose ``allocationMode`` is ``dra``: the DeviceClasses, "
        "the kubelet plugin DaemonSets, their RBAC and the admission policy that confines each plugin to its "
        "own node's ResourceSlices. Depends on its ``GpuPlatform``.",
        ("cluster", "groups")),
    Component(
        "GpuMonitoring", "nvidia_gpu.components.monitoring",
        "GPU metrics and their use, as ``cluster.monitoring`` says: an exporter DaemonSet per group (the "
        "agent's NVML exporter or NVIDIA's dcgm-exporter), ServiceMonitors or PodMonitors, the alert rules "
        "and the Grafana dashboards. One per cluster; depends on its ``GpuPlatform`` and, for the exporters, "
        "on the groups.",
        ("cluster", "groups")),
    Component(
        "DriverUpgrade", "nvidia_gpu.components.driver_upgrade",
        "The driver upgrade controller for the groups whose ``gpu.driver.source`` is ``container``: it rolls "
        "a driver change through their nodes one at a time (cordon, drain, new driver, check, uncordon), "
        "honouring Deckhouse disruption windows. One per cluster; depends on its ``GpuPlatform``.",
        ("cluster", "groups")),
)

BY_NAME: dict[str, Component] = {c.name: c for c in COMPONENTS}
