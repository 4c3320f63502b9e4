"""``GpuPlatform``: the cluster-wide pieces every node group shares (namespace, ServiceAccounts, RBAC, the
``nvidia`` RuntimeClass for users' GPU pods)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pydantic import ValidationError

from nvgpu.stackconfig import Cluster, NodeSetupBackend
from nvidia_gpu.components import inputs
from nvidia_gpu.components.manifests import confinement
from nvidia_gpu.components.manifests import inventory as inventory_manifests
from nvidia_gpu.components.manifests import monitoring as monitoring_manifests
from nvidia_gpu.components.manifests import platform as manifests
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.register import register as register_object
from nvidia_gpu.components.register import register_shared

TYPE = "nvidia-gpu:index:GpuPlatform"


def validation_problems(where: str, err: ValidationError) -> str:
    """A pydantic error as one line per field, named the way the caller spelled the args."""
    lines = []
    for e in err.errors(include_url=False):
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"] if p != "function-after")
        lines.append(f"{where}{loc}: {e['msg']}")
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class GpuPlatformArgs:
    """The cluster-wide settings; every check of a plain value runs here, before anything registers.

    A plain bad value raises ``ValueError`` naming the field; an Output is checked when it resolves
    (the deployment fails with the field named).
    """

    #: The stack config's ``cluster`` block: a validated :class:`~nvgpu.stackconfig.Cluster`, or the same
    #: keys as plain values (camelCase as in ``Pulumi.<stack>.yaml``, or snake_case), validated here.
    #: ``kubernetesVersion`` is required; ``agentImage`` too unless ``agent_image`` is given.
    cluster: Cluster | Mapping[str, Any]
    #: The namespace the agents run in (default ``cluster.namespace``); may come from another resource.
    namespace: pulumi.Input[str] | None = None
    #: The node-agent image reference, ``repository:tag`` and/or ``@sha256:...`` (default
    #: ``cluster.agentImage``); may come from another resource (a build, a registry lookup). With an
    #: Output the tag is unknown to the program, so no ``app.kubernetes.io/version`` label is set.
    agent_image: pulumi.Input[str] | None = None
    #: Labels added to every object the platform and its node groups create (a clash with a label the
    #: component sets is refused). Patches of objects others own (the Deckhouse NodeGroup) get none, nor do
    #: the definitions every stack on the cluster shares (the GPU CRD, the RuntimeClass, the DeviceClasses:
    #: see :mod:`nvidia_gpu.components.manifests.shared`).
    extra_labels: pulumi.Input[Mapping[str, pulumi.Input[str]]] | None = None
    #: The taint keys the node groups declare (``extraTaints``; ``nvidia.com/gpu`` is always included): the
    #: labeller may set and remove these on its node and no others, so it cannot lift an administrator's
    #: taint. The program passes its groups' keys; a group whose taint is missing here is refused.
    node_taint_keys: Sequence[str] = ()
    #: ``cluster`` validated, with ``namespace`` and ``agent_image`` folded in (an Output as its stand-in).
    settings: Cluster = field(init=False, repr=False)
    #: ``extra_labels`` checked (or an Output that checks them when it resolves).
    labels: pulumi.Input[dict[str, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        overrides: dict[str, Any] = {}
        if self.namespace is not None:
            overrides["namespace"] = inputs.namespace("GpuPlatformArgs.namespace", self.namespace)
        if self.agent_image is not None:
            overrides["agent_image"] = inputs.agent_image("GpuPlatformArgs.agent_image", self.agent_image)
        labels = inputs.labels("GpuPlatformArgs.extra_labels", self.extra_labels)
        if isinstance(self.cluster, Cluster):
            settings = self.cluster.model_copy(update=overrides) if overrides else self.cluster
        else:
            try:
                settings = Cluster.model_validate({**self.cluster, **overrides})
            except ValidationError as e:
                raise ValueError(validation_problems("GpuPlatformArgs.cluster", e)) from None
            if settings.preview_identity is not None:
                # Its role is derived from every object of the stack, which one component cannot see.
                raise ValueError("GpuPlatformArgs.cluster.previewIdentity: a whole stack's setting (build_stack, "
                                 "the stack config's nvidia-gpu:cluster); a component does not grant it: leave it out")
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "labels", labels)


@dataclass(frozen=True)
class PlatformRefs:
    """What node groups need from the platform: names to reference and resources to wait for."""

    namespace: str
    service_accounts: dict[AgentRole, str]
    #: The platform's validated settings (what its node groups use unless given their own).
    cluster: Cluster
    #: The platform's extra labels (checked), for its node groups' objects.
    extra_labels: pulumi.Input[dict[str, str]]
    #: Everything the platform created (for consumers that need all of it in place).
    dependencies: tuple[pulumi.Resource, ...]
    #: The namespace object; None for a platform this program did not create (:meth:`deployed`).
    namespace_resource: pulumi.Resource | None
    #: Per role, what its pods need before they can start: the ServiceAccount and its binding.
    role_resources: dict[AgentRole, tuple[pulumi.Resource, ...]]
    #: The taint keys the platform's admission policy lets the labeller set (besides ``nvidia.com/gpu``);
    #: None for a platform deployed elsewhere, whose keys this program cannot see.
    node_taint_keys: tuple[str, ...] | None = None

    def needs(self, role: AgentRole) -> list[pulumi.Resource]:
        """What a workload running as ``role`` must wait for: the namespace and the role's identity."""
        return [*self.needs_namespace(), *self.role_resources.get(role, ())]

    def needs_namespace(self) -> list[pulumi.Resource]:
        """What an object in the namespace must wait for (nothing when the platform is deployed elsewhere)."""
        return [self.namespace_resource] if self.namespace_resource is not None else []

    @classmethod
    def deployed(cls, args: GpuPlatformArgs) -> PlatformRefs:
        """The refs of a ``GpuPlatform`` with these args that is deployed by someone else: another stack,
        or, in a multi-language program, a separate ``GpuPlatform`` resource the component depends on
        (``dependsOn``). The names are the platform's own (they derive from the settings); there is no
        resource of this program to wait for, so ordering is the caller's ``depends_on``."""
        cluster = args.settings
        roles = manifests.roles_for_backend(cluster.node_setup is NodeSetupBackend.DAEMONSET)
        return cls(namespace=cluster.namespace, service_accounts={role: role.value for role in roles},
                   cluster=cluster, extra_labels=args.labels, dependencies=(), namespace_resource=None,
                   role_resources={})


class GpuPlatform(pulumi.ComponentResource):
    namespace: pulumi.Output[str]
    service_accounts: dict[str, str]

    def __init__(self, name: str, args: GpuPlatformArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        cluster = args.settings
        ns_name = cluster.namespace
        child = pulumi.ResourceOptions(parent=self)

        def register(name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
            return register_object(name, inputs.with_labels(manifest, args.labels, "GpuPlatformArgs.extra_labels"),
                                   opts)

        ns = register(f"{name}-ns", manifests.namespace(ns_name, cluster.kubernetes_version,
                                                        monitoring_manifests.namespace_labels(cluster),
                                                        stack=f"{pulumi.get_project()}/{pulumi.get_stack()}"), child)
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
        # The GPU inventory's kind (its objects are the labellers'): before the agents that write them.
        # Shared by every stack on the cluster, so without this stack's extra labels (see manifests.shared).
        deps.append(register_shared(f"{name}-gpu-inventory-crd", inventory_manifests.crd(), ns, child))
        # Each node agent that writes Nodes or Pods may touch only its own node (RBAC cannot say so).
        if cluster.kubernetes_minor >= confinement.MIN_MINOR:
            policy = register(f"{name}-own-node-policy",
                              confinement.admission_policy(ns_name, args.node_taint_keys), child)
            binding = register(f"{name}-own-node-policy-binding", confinement.admission_policy_binding(ns_name),
                               pulumi.ResourceOptions(parent=self, depends_on=[policy]))
            deps += [policy, binding]
        # Users' GPU pods only; the agents do not run under it (see nvidia_gpu.components.manifests.platform).
        # Not in ``deps``: no agent waits for it.
        settings = cluster.runtime_class
        self.runtime_class: pulumi.Resource | None = None
        if settings.create:
            self.runtime_class = register_shared(f"{name}-runtime-class", manifests.runtime_class(settings.name), ns,
                                                 child)
        self.namespace = pulumi.Output.from_input(inputs.resolve(ns_name))
        self.service_accounts = {role.value: role.value for role in roles}
        self.refs = PlatformRefs(
            namespace=ns_name,
            service_accounts={role: role.value for role in roles},
            cluster=cluster,
            extra_labels=args.labels,
            dependencies=tuple(deps),
            namespace_resource=ns,
            role_resources=per_role,
            node_taint_keys=tuple(args.node_taint_keys),
        )
        self.register_outputs({"namespace": self.namespace, "serviceAccounts": self.service_accounts})
