"""``GpuPlatform``: the cluster-wide pieces every node group shares (namespace, ServiceAccounts, RBAC, the
``nvidia`` RuntimeClass for users' GPU pods)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from nvgpu.stackconfig import Cluster, NodeSetupBackend
from nvidia_gpu.components.manifests import platform as manifests
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.register import register

TYPE = "nvidia-gpu:index:GpuPlatform"


@dataclass(frozen=True)
class GpuPlatformArgs:
    cluster: Cluster


@dataclass(frozen=True)
class PlatformRefs:
    """What node groups need from the platform: names to reference and resources to wait for."""

    namespace: str
    service_accounts: dict[AgentRole, str]
    #: Everything the platform created (for consumers that need all of it in place).
    dependencies: tuple[pulumi.Resource, ...]
    namespace_resource: pulumi.Resource
    #: Per role, what its pods need before they can start: the ServiceAccount and its binding.
    role_resources: dict[AgentRole, tuple[pulumi.Resource, ...]]

    def needs(self, role: AgentRole) -> list[pulumi.Resource]:
        """What a workload running as ``role`` must wait for: the namespace and the role's identity."""
        return [self.namespace_resource, *self.role_resources[role]]


class GpuPlatform(pulumi.ComponentResource):
    namespace: pulumi.Output[str]
    service_accounts: dict[str, str]

    def __init__(self, name: str, args: GpuPlatformArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        cluster = args.cluster
        ns_name = cluster.namespace
        child = pulumi.ResourceOptions(parent=self)
        ns = register(f"{name}-ns", manifests.namespace(ns_name, cluster.kubernetes_version), child)
        in_ns = pulumi.ResourceOptions(parent=self, depends_on=[ns])
        deps: list[pulumi.Resource] = [ns]
        per_role: dict[AgentRole, tuple[pulumi.Resource, ...]] = {}
        roles = manifests.roles_for_backend(cluster.node_setup is NodeSetupBackend.DAEMONSET)
        for role in roles:
            sa = register(f"{name}-{role.value}-sa", manifests.service_account(ns_name, role), in_ns)
            cr = register(f"{name}-{role.value}-role", manifests.cluster_role(ns_name, role), child)
            crb = register(
                f"{name}-{role.value}-binding",
                manifests.cluster_role_binding(ns_name, role),
                pulumi.ResourceOptions(parent=self, depends_on=[sa, cr]),
            )
            deps += [sa, cr, crb]
            per_role[role] = (sa, crb)
            if role in manifests.NAMESPACED_RULES:
                r = register(f"{name}-{role.value}-ns-role", manifests.role(ns_name, role), in_ns)
                rb = register(f"{name}-{role.value}-ns-binding", manifests.role_binding(ns_name, role),
                              pulumi.ResourceOptions(parent=self, depends_on=[sa, r]))
                deps += [r, rb]
                per_role[role] = (sa, crb, rb)
        # Users' GPU pods only; the agents do not run under it (see nvidia_gpu.components.manifests.platform).
        # Not in ``deps``: no agent waits for it.
        settings = cluster.runtime_class
        self.runtime_class: pulumi.Resource | None = None
        if settings.create:
            rc = manifests.runtime_class(settings.name, ns_name)
            self.runtime_class = register(f"{name}-runtime-class", rc, child)
        self.namespace = pulumi.Output.from_input(ns_name)
        self.service_accounts = {role.value: role.value for role in roles}
        self.refs = PlatformRefs(
            namespace=ns_name,
            service_accounts={role: role.value for role in roles},
            dependencies=tuple(deps),
            namespace_resource=ns,
            role_resources=per_role,
        )
        self.register_outputs({"namespace": self.namespace, "serviceAccounts": self.service_accounts})
