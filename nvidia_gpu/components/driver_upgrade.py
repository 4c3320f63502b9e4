"""``DriverUpgrade``: the stack's driver upgrade controller, for node groups whose driver it deploys as a
container (``gpu.driver.source: container``).

One per stack: the controller rolls every container group's driver changes, each group by its own policy
(which its driver DaemonSets carry). Children: the controller's ServiceAccount and RBAC, then its
Deployment (:mod:`nvidia_gpu.components.manifests.driverupgrade`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from nvgpu.stackconfig import Cluster, NodeGroup
from nvidia_gpu.components.manifests import driverupgrade
from nvidia_gpu.components.register import register

TYPE = "nvidia-gpu:index:DriverUpgrade"


@dataclass(frozen=True)
class DriverUpgradeArgs:
    cluster: Cluster
    #: Every node group of the stack: the controller runs off all their nodes.
    groups: Sequence[NodeGroup]
    depends_on: Sequence[pulumi.Resource] = ()


class DriverUpgrade(pulumi.ComponentResource):
    def __init__(self, name: str, args: DriverUpgradeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        ns = args.cluster.namespace
        identity: list[pulumi.Resource] = []
        deckhouse = driverupgrade.drain_mode(args.cluster) == "deckhouse"
        suffixes = ("sa", "cluster-role", "cluster-binding", "role", "binding")
        for manifest, suffix in zip(driverupgrade.rbac(ns, deckhouse=deckhouse), suffixes, strict=True):
            identity.append(register(f"{name}-{suffix}", manifest,
                                     pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))))
        self.deployment = register(f"{name}-controller", driverupgrade.deployment(ns, args.cluster, args.groups),
                                   pulumi.ResourceOptions(parent=self, depends_on=[*args.depends_on, *identity]))
        self.register_outputs({"drain": driverupgrade.drain_mode(args.cluster)})
