"""``DraStack``: DRA mode for the node groups that use it (``allocationMode: dra``).

Children: the three DeviceClasses, the kubelet plugin's ServiceAccount and exactly-as-wide-as-needed RBAC,
the ValidatingAdmissionPolicy (+ binding) confining each plugin to its own node's ResourceSlices, optional
per-namespace claim quotas, one kubelet-plugin DaemonSet per DRA node group, and the uninstall marker.

Uninstall ordering: Pulumi deletes a resource before anything it depends on (reverse dependency order),
and the Kubernetes provider waits until a deleted object is really gone (finalizers included) before
moving on. The uninstall marker ConfigMap depends on every other child, so ``pulumi destroy`` (or removing
DRA from the config) deletes it first. Each running plugin put the ``gpu.nvidia-gpu.io/dra-slices-cleanup``
finalizer on it; seeing the deletion, each plugin withdraws its node's ResourceSlices, and the finalizer is
removed once none of the driver's slices remain (or after a grace period, so an unreachable node cannot
block the uninstall forever). Only then do the DaemonSets, RBAC and DeviceClasses go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi

from nvgpu.stackconfig import AllocationMode, Cluster, GroupPlan, NodeGroup
from nvidia_gpu.components.manifests import dra
from nvidia_gpu.components.platform import PlatformRefs
from nvidia_gpu.components.register import register, register_shared

TYPE = "nvidia-gpu:index:DraStack"


@dataclass(frozen=True)
class DraStackArgs:
    cluster: Cluster
    #: The node groups whose allocation mode is ``dra``.
    groups: Sequence[NodeGroup]
    platform: PlatformRefs
    #: What the stack decided for each group, by name, in DRA mode (:class:`~nvgpu.stackconfig.GroupPlan`).
    plans: dict[str, GroupPlan] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plans", {g.name: GroupPlan.of(self.cluster, g, AllocationMode.DRA)
                                           for g in self.groups})


class DraStack(pulumi.ComponentResource):
    # Children are instance attributes (see GpuNodeGroup: class annotations are the package's outputs).
    def __init__(self, name: str, args: DraStackArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        cluster, ns = args.cluster, args.platform.namespace
        driver = cluster.dra.driver_name
        child = pulumi.ResourceOptions(parent=self)
        after_ns = pulumi.ResourceOptions(parent=self, depends_on=list(args.platform.dependencies))

        self.device_classes: list[pulumi.CustomResource] = [
            register_shared(f"{name}-class-{spec.type}", dra.device_class(driver, spec),
                            args.platform.namespace_resource, child)
            for spec in dra.DEVICE_CLASSES
        ] if cluster.dra.create_device_classes else []
        sa = register(f"{name}-sa", dra.service_account(ns), after_ns)
        role = register(f"{name}-role", dra.cluster_role(ns), child)
        binding = register(f"{name}-binding", dra.cluster_role_binding(ns),
                           pulumi.ResourceOptions(parent=self, depends_on=[sa, role]))
        marker_role = register(f"{name}-marker-role", dra.marker_role(ns), after_ns)
        marker_binding = register(f"{name}-marker-binding", dra.marker_role_binding(ns),
                                  pulumi.ResourceOptions(parent=self, depends_on=[sa, marker_role]))
        policy = register(f"{name}-slice-policy", dra.admission_policy(ns, driver), child)
        policy_binding = register(f"{name}-slice-policy-binding", dra.admission_policy_binding(ns),
                                  pulumi.ResourceOptions(parent=self, depends_on=[policy]))
        self.quotas = [register(f"{name}-quota-{q.namespace}", dra.claim_quota(ns, q), child)
                       for q in cluster.dra.claim_quotas]
        # The policy is in place before any plugin can write a slice.
        plugin_deps: list[pulumi.Resource] = [*args.platform.dependencies, sa, binding, marker_binding, policy_binding]
        self.plugins: dict[str, pulumi.CustomResource] = {
            g.name: register(f"{name}-plugin-{g.name}", dra.plugin_daemonset(ns, cluster, g, args.plans[g.name]),
                             pulumi.ResourceOptions(parent=self, depends_on=plugin_deps))
            for g in args.groups
        }
        # Depends on everything above, so it is deleted first (see the module docstring).
        self.marker: pulumi.CustomResource = register(
            f"{name}-uninstall-marker", dra.uninstall_marker(ns, driver), pulumi.ResourceOptions(
                parent=self, depends_on=[*plugin_deps, *self.device_classes, *self.plugins.values(), role,
                                         marker_role, policy]))
        self.register_outputs({
            "driver": driver,
            "deviceClasses": [spec.name for spec in dra.DEVICE_CLASSES],
            "nodeGroups": sorted(self.plugins),
            "claimQuotaNamespaces": [q.namespace for q in cluster.dra.claim_quotas],
        })
