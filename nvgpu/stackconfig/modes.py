"""The two choices that decide which stack runs: how pods get GPUs (device plugin or DRA; the cluster's
default, a group's own) and who sets nodes up (Deckhouse's bashible or the setup DaemonSet).

Their own module because the cluster section, the node groups and the derived plan all use them, and
none of those should have to import another to name them.
"""

from __future__ import annotations

from enum import StrEnum


class AllocationMode(StrEnum):
    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class NodeSetupBackend(StrEnum):
    DECKHOUSE = "deckhouse"
    DAEMONSET = "daemonset"

