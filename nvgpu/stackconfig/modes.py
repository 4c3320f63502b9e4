"""The two choices that decide which stack runs: how pods get GPUs (device plugin or DRA; the cluster's
default, a group's own) and who sets nodes up (Deckhouse's bashible or the setup DaemonSet).

Their own module because the cluster section, the node groups and the derived plan all use them, and
none of those should have to import another to name them.
"""

from __future__ import annotations

from enum import StrEnum


class AllocationMode(StrEnum):
    """How pods get GPUs: the device plugin's extended resources, or DRA claims (Kubernetes 1.34+)."""

    #: The device plugin: ``nvidia.com/gpu`` (or MIG) extended resources.
    DEVICE_PLUGIN = "devicePlugin"
    #: Dynamic Resource Allocation: ResourceClaims of the ``gpu.nvidia.com`` DeviceClasses.
    DRA = "dra"


class NodeSetupBackend(StrEnum):
    """Who sets the GPU nodes up: Deckhouse's bashible (NodeGroupConfigurations) or the setup DaemonSet."""

    #: Deckhouse NodeGroupConfiguration scripts and NodeGroup node templates.
    DECKHOUSE = "deckhouse"
    #: The setup DaemonSet, on any cluster.
    DAEMONSET = "daemonset"

