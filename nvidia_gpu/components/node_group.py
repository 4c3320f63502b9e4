"""``GpuNodeGroup``: everything one GPU node group runs, in device-plugin mode.

Children: the ``SharingPolicy`` (device-plugin configs), the device-plugin and feature-labelling
DaemonSets (and, in MPS groups, the MPS control daemon's), and node setup for the cluster's backend: the
Deckhouse NodeGroup's node template plus ``NodeGroupConfiguration`` scripts, or the setup DaemonSet
elsewhere. A group whose allocation mode is ``dra`` gets node setup and labels only; its DRA driver is a
separate component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pydantic import ValidationError

from nvgpu.driver import DriverSource
from nvgpu.labels import GPU_TAINT_KEY
from nvgpu.nodelabels import desired_node_labels, desired_node_taints
from nvgpu.nodescripts import NodeScript, render_node_scripts
from nvgpu.stackconfig import AllocationMode, Cluster, NodeGroup, NodeSetupBackend, Sharing
from nvgpu.stackconfig.resolved import GroupPlan
from nvidia_gpu.components import inputs
from nvidia_gpu.components.manifests import deckhouse, dra, driver, toolkit, workloads
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvidia_gpu.components.platform import GpuPlatform, PlatformRefs, validation_problems
from nvidia_gpu.components.register import KubernetesRead, register_patch
from nvidia_gpu.components.register import register as register_object
from nvidia_gpu.components.sharing_policy import SharingPolicy, SharingPolicyArgs

TYPE = "nvidia-gpu:index:GpuNodeGroup"


def node_scripts(plan: GroupPlan) -> tuple[NodeScript, ...]:
    """The bashible steps for a group on the deckhouse backend (none elsewhere: the setup DaemonSet runs).

    DRA groups that allow passthrough also get ``gpu-iommu.sh`` (IOMMU kernel parameters) and
    ``gpu-vfio.sh`` (VFIO modules and the IOMMU check).
    """
    if plan.node_setup is not NodeSetupBackend.DECKHOUSE:
        return ()
    scripts = render_node_scripts(vfio=plan.passthrough, accept_envvar=plan.accept_envvar,
                                  expect=plan.node_setup_expectation, driver_root=plan.driver_root)
    return (*scripts, dra.iommu_script()) if plan.passthrough else tuple(scripts)


@dataclass(frozen=True, kw_only=True)
class GpuNodeGroupArgs:
    """One node group; every check of a plain value runs here, before anything registers."""

    #: The platform the group's agents run under (its namespace, ServiceAccounts, settings).
    platform: GpuPlatform | PlatformRefs
    #: The group as in the stack config's ``nodeGroups`` (camelCase or snake_case keys), or validated.
    group: NodeGroup | Mapping[str, Any]
    #: The cluster settings (default: the platform's).
    cluster: Cluster | None = None
    #: Device plugin or DRA (default: the group's own ``allocationMode``, else the cluster's).
    allocation_mode: AllocationMode | None = None
    #: The deckhouse backend's bashible steps (default: the rendered ones, :func:`node_scripts`; none on
    #: the daemonset backend).
    node_scripts: Sequence[NodeScript] | None = None
    #: Labels added to the group's objects (default: the platform's ``extra_labels``).
    extra_labels: pulumi.Input[Mapping[str, pulumi.Input[str]]] | None = None
    refs: PlatformRefs = field(init=False, repr=False)
    settings: Cluster = field(init=False, repr=False)
    node_group: NodeGroup = field(init=False, repr=False)
    mode: AllocationMode = field(init=False, repr=False)
    #: What the stack decided for the group in ``mode`` (:class:`~nvgpu.stackconfig.resolved.GroupPlan`).
    plan: GroupPlan = field(init=False, repr=False)
    scripts: tuple[NodeScript, ...] = field(init=False, repr=False)
    labels: pulumi.Input[dict[str, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        refs = self.platform.refs if isinstance(self.platform, GpuPlatform) else self.platform
        settings = self.cluster or refs.cluster
        if isinstance(self.group, NodeGroup):
            group = self.group
        else:
            try:
                group = NodeGroup.model_validate(self.group)
            except ValidationError as e:
                raise ValueError(validation_problems("GpuNodeGroupArgs.group", e)) from None
        if settings.node_setup is NodeSetupBackend.DECKHOUSE and group.node_group is None:
            raise ValueError(f"GpuNodeGroupArgs.group.nodeGroup: group {group.name!r}: nodeSetup 'deckhouse' "
                             "targets Deckhouse NodeGroups, so set nodeGroup")
        if refs.node_taint_keys is not None and settings.node_setup is NodeSetupBackend.DAEMONSET:
            missing = sorted({t.key for t in desired_node_taints(group)} - {GPU_TAINT_KEY, *refs.node_taint_keys})
            if missing:
                raise ValueError(
                    f"GpuNodeGroupArgs.group.extraTaints: group {group.name!r}: the labeller would set taint key(s) "
                    f"{', '.join(missing)}, which the platform's admission policy does not let it: add them to "
                    "GpuPlatformArgs.node_taint_keys")
        labels = refs.extra_labels if self.extra_labels is None else inputs.labels(
            "GpuNodeGroupArgs.extra_labels", self.extra_labels)
        plan = GroupPlan.of(settings, group, self.allocation_mode)
        mode = plan.allocation_mode
        for name, value in (("refs", refs), ("settings", settings), ("node_group", group), ("mode", mode),
                            ("plan", plan), ("labels", labels)):
            object.__setattr__(self, name, value)
        scripts = node_scripts(plan) if self.node_scripts is None else tuple(self.node_scripts)
        object.__setattr__(self, "scripts", scripts)


def _checked_node_template(group: NodeGroup, metadata: dict[str, Any] | None, spec: dict[str, Any] | None,
                           ours: list[dict[str, str]], manager: str) -> bool:
    """:func:`deckhouse.check_node_template`, its refusal as a ``RunError``: the engine shows its message alone,
    not a Python traceback through the SDK's Output machinery."""
    try:
        return deckhouse.check_node_template(group, metadata, spec, ours, manager)
    except deckhouse.NodeTemplateConflict as e:
        raise pulumi.RunError(str(e)) from None


class GpuNodeGroup(pulumi.ComponentResource):
    # Children are instance attributes, typed where they are set: class-level annotations are what
    # Pulumi's component provider host reads as a component's outputs (nvidia_gpu.package).
    def __init__(self, name: str, args: GpuNodeGroupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        group, cluster, refs = args.node_group, args.settings, args.refs
        field_name = "GpuNodeGroupArgs.extra_labels"

        def register(name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
            return register_object(name, inputs.with_labels(manifest, args.labels, field_name), opts)

        deckhouse_backend = cluster.node_setup is NodeSetupBackend.DECKHOUSE
        ctx = GroupContext(namespace=refs.namespace, cluster=cluster, group=group, plan=args.plan)

        def runs_as(role: AgentRole, *extra: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, depends_on=[*refs.needs(role), *extra])

        self.node_setup: list[pulumi.CustomResource] = []
        self.node_template_checked: pulumi.Output[bool] | None = None
        if deckhouse_backend:
            # The NodeGroup is Deckhouse's (and its users'): read it first, so a missing or mistyped one
            # fails at preview, and a node template whose taints another manager owns is refused there
            # instead of being taken over (``taints`` is an atomic list: applying it replaces theirs).
            assert group.node_group is not None  # the deckhouse backend requires it (stack config)
            live = KubernetesRead(f"{name}-node-group", deckhouse.NODE_GROUP_API, "NodeGroup", group.node_group,
                                  pulumi.ResourceOptions(parent=self))
            ours = [t.as_dict() for t in desired_node_taints(group)]
            manager = inputs.resolve(deckhouse.field_manager(refs.namespace))
            checked = pulumi.Output.all(live.metadata, live.spec, manager).apply(
                lambda ms: _checked_node_template(group, ms[0], ms[1], ours, ms[2]))
            # Removed with the group or the stack: our labels and taints leave the NodeGroup, and
            # Deckhouse takes them off its nodes.
            self.node_setup.append(
                register_patch(
                    f"{name}-node-template",
                    deckhouse.node_group_patch(group, args.plan, refs.namespace),
                    pulumi.ResourceOptions(parent=self, depends_on=[live]),
                )
            )
            self.node_template_checked = checked
            for script in sorted(args.scripts, key=lambda s: (s.weight, s.name)):
                self.node_setup.append(
                    register(
                        f"{name}-{script.name}",
                        deckhouse.node_group_configuration(refs.namespace, group, script),
                        pulumi.ResourceOptions(parent=self),
                    )
                )
        else:
            self.node_setup.append(
                register(f"{name}-setup", workloads.setup_daemonset(ctx), runs_as(AgentRole.NODE_SETUP))
            )

        # NVIDIA's GPU Operator installs this group's driver: its NVIDIADriver object (nvidia_gpu.components.
        # manifests.driver). The driver comes before setup's check can pass; nothing here waits on it.
        self.driver: pulumi.CustomResource | None = None
        if group.gpu.driver.source is DriverSource.GPU_OPERATOR:
            self.driver = register(f"{name}-nvidia-driver", driver.nvidia_driver(refs.namespace, cluster, group),
                                   pulumi.ResourceOptions(parent=self))
        # Or the driver containers themselves, one DaemonSet per OS release (and kernel when precompiled).
        self.driver_daemonsets: list[pulumi.CustomResource] = []
        if group.gpu.driver.source is DriverSource.CONTAINER:
            for manifest in driver.driver_daemonsets(refs.namespace, cluster, group):
                suffix = manifest["metadata"]["name"].removeprefix(f"{driver.COMPONENT}-{group.name}-")
                self.driver_daemonsets.append(register(f"{name}-driver-{suffix}", manifest, pulumi.ResourceOptions(
                    parent=self, depends_on=refs.needs_namespace())))
        # NVIDIA's toolkit container, where the group's nodes have no toolkit of their own (manifests.toolkit).
        self.toolkit: pulumi.CustomResource | None = None
        if group.toolkit.container:
            self.toolkit = register(f"{name}-toolkit", toolkit.toolkit_daemonset(refs.namespace, group, args.plan),
                                    pulumi.ResourceOptions(parent=self, depends_on=refs.needs_namespace()))

        self.sharing: SharingPolicy | None = None
        self.device_plugin: pulumi.CustomResource | None = None
        if args.mode is AllocationMode.DEVICE_PLUGIN:
            self.sharing = SharingPolicy(
                f"{name}-sharing",
                SharingPolicyArgs(namespace=refs.namespace, group=group, depends_on=tuple(refs.needs_namespace()),
                                  extra_labels=args.labels),
                pulumi.ResourceOptions(parent=self),
            )
        # The labeller mounts the device plugin's ConfigMap too (workloads.labeller_args): created after it.
        self.labeller: pulumi.CustomResource = register(f"{name}-labeller", workloads.labeller_daemonset(ctx), runs_as(
            AgentRole.LABELLER, *([self.sharing.config_map] if self.sharing else [])))

        if self.sharing is not None:
            self.device_plugin = register(
                f"{name}-device-plugin",
                workloads.device_plugin_daemonset(ctx),
                runs_as(AgentRole.DEVICE_PLUGIN, self.sharing.config_map),
            )
        # MPS groups: the control daemons in their own DaemonSet (NVIDIA's mps-control-daemon), so a device
        # plugin restart leaves every client's MPS server running; the plugin waits for them to be up.
        self.mps_control_daemon: pulumi.CustomResource | None = None
        if self.sharing is not None and group.gpu.sharing is Sharing.MPS:
            self.mps_control_daemon = register(
                f"{name}-mps-control-daemon",
                workloads.mps_control_daemon_daemonset(ctx),
                runs_as(AgentRole.DEVICE_PLUGIN, self.sharing.config_map),
            )

        #: What the group's nodes must carry: on Deckhouse the node template above applies it, on the
        #: daemonset backend the labeller does (``workloads.labeller_args``); both read ``nvgpu.nodelabels``.
        self.node_labels = desired_node_labels(group, args.plan)
        self.node_taints = [t.as_dict() for t in desired_node_taints(group)]
        self.register_outputs(
            {
                "nodeGroup": group.name,
                "nodeLabels": self.node_labels,
                "nodeTaints": self.node_taints,
                "sharing": group.gpu.sharing.value,
                "allocationMode": args.mode.value,
                "deviceConfigMap": self.sharing.config_map_name if self.sharing else None,
                "nodeSetup": "NodeGroupConfiguration" if deckhouse_backend else "DaemonSet",
                "driverSource": group.gpu.driver.source.value,
                # Awaited by the engine, so a refused node template fails the preview.
                "nodeTemplateChecked": self.node_template_checked,
            }
        )
