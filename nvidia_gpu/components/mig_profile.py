"""``MigProfile``: the component that registers the stack's MIG manager and its mig-parted ConfigMap.

One per stack, not per node group (the manager must outlive a group's MIG setting to roll its nodes
back). What it registers is built by :mod:`nvidia_gpu.components.manifests.mig`; the layouts are
validated there, through the shared core's one MIG check, before any child is registered, so a layout
that cannot be placed fails ``pulumi preview`` naming the group, the config, the GPU, the profile and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi

from nvgpu.migparted import MigConfigSpec
from nvgpu.stackconfig import Cluster, GroupPlan, NodeGroup, Sharing
from nvidia_gpu.components import inputs
from nvidia_gpu.components.manifests import evictionguard
from nvidia_gpu.components.manifests.mig import (
    CONTAINER_DRIVER_INSTANCE,
    by_driver_root,
    config_map,
    config_map_name,
    daemonset,
    drain_mode,
    may_use_mig,
    mig_config,
    rbac,
)
from nvidia_gpu.components.register import register, register_config_map

TYPE = "nvidia-gpu:index:MigProfile"


@dataclass(frozen=True)
class MigProfileArgs:
    cluster: Cluster
    groups: Sequence[NodeGroup]
    #: Extra named mig-parted configs (for example per device filter), validated like the groups' own.
    extra_configs: Mapping[str, Sequence[MigConfigSpec]] = field(default_factory=dict)
    depends_on: Sequence[pulumi.Resource] = ()
    #: What the stack decided for each group, by name (:class:`~nvgpu.stackconfig.GroupPlan`).
    plans: dict[str, GroupPlan] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plans", {g.name: GroupPlan.of(self.cluster, g) for g in self.groups})


class MigProfile(pulumi.ComponentResource):
    config_map_name: pulumi.Output[str]
    #: ``nvidia.com/mig.config`` value per MIG node group.
    config_names: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, args: MigProfileArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        ns = args.cluster.namespace
        groups = [g for g in args.groups if may_use_mig(g)]
        cfg = mig_config(args.groups, args.extra_configs)  # raises before any child is registered
        names = {g.name: args.plans[g.name].mig_config_name for g in args.groups if g.gpu.sharing is Sharing.MIG}
        self.config_map: pulumi.CustomResource | None = None
        self.manager: pulumi.CustomResource | None = None
        self.managers: list[pulumi.CustomResource] = []
        if groups:
            after = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
            sa, role, binding = rbac(ns, args.cluster)
            sa_res = register(f"{name}-sa", sa, after)
            role_res = register(f"{name}-role", role, pulumi.ResourceOptions(parent=self))
            binding_res = register(f"{name}-binding", binding,
                                   pulumi.ResourceOptions(parent=self, depends_on=[sa_res, role_res]))
            # Its data patch (register_config_map): a mig-parted change is an in-place update the manager reloads.
            self.config_map = register_config_map(f"{name}-config", config_map(ns, cfg), after)
            manager_after: list[pulumi.Resource] = [*args.depends_on, self.config_map, binding_res]
            if evictionguard.wanted(args.cluster, drain_mode(args.cluster)):
                manager_after.append(self._eviction_guard(name, args))
            # One manager per driver root (a stack mixing pre-installed and containerised drivers has two); the
            # first keeps the name and URN it always had.
            for i, (root, members) in enumerate(by_driver_root(args.cluster, groups, args.plans).items()):
                manager = register(f"{name}-manager" if i == 0 else f"{name}-manager-{CONTAINER_DRIVER_INSTANCE}",
                                   daemonset(ns, args.cluster, members, root),
                                   pulumi.ResourceOptions(parent=self, depends_on=manager_after))
                self.managers.append(manager)
            self.manager = self.managers[0]
        self.config_map_name = pulumi.Output.from_input(inputs.resolve(config_map_name(ns)))
        self.config_names = pulumi.Output.from_input(names)
        self.register_outputs({"configMapName": self.config_map_name, "configNames": self.config_names})

    def _eviction_guard(self, name: str, args: MigProfileArgs) -> pulumi.Resource:
        """The webhook, then its RBAC, Service and Deployment (see ``manifests.evictionguard``); answers the
        Deployment, ready only once the webhook trusts it, for the manager to wait on. The Deployment is kept
        off every group's nodes, not only the MIG ones: none is a place for a cluster-wide webhook."""
        ns = args.cluster.namespace
        guard = f"{name}-eviction-guard"
        webhook = register(f"{guard}-webhook", evictionguard.webhook_configuration(ns),
                           pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)))
        # The policy holding the guard's patches to caBundle is in force before the guard may patch at all.
        policy = register(f"{guard}-ca-only-policy", evictionguard.ca_only_policy(ns),
                          pulumi.ResourceOptions(parent=self))
        policy_binding = register(f"{guard}-ca-only-policy-binding", evictionguard.ca_only_policy_binding(ns),
                                  pulumi.ResourceOptions(parent=self, depends_on=[policy]))
        sa, cluster_role, cluster_binding = evictionguard.rbac(ns)
        in_ns = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        sa_res = register(f"{guard}-sa", sa, in_ns)
        cr_res = register(f"{guard}-role", cluster_role, pulumi.ResourceOptions(parent=self))
        binding = register(f"{guard}-binding", cluster_binding,
                           pulumi.ResourceOptions(parent=self, depends_on=[sa_res, cr_res, policy_binding]))
        svc = register(f"{guard}-service", evictionguard.service(ns), in_ns)
        register(f"{guard}-network-policy",
                 evictionguard.network_policy(ns, args.cluster.mig.eviction_guard_sources), in_ns)
        return register(f"{guard}-deployment", evictionguard.deployment(ns, args.cluster, args.groups),
                        pulumi.ResourceOptions(parent=self, depends_on=[*args.depends_on, webhook, binding, svc]))
