"""``GpuNodeGroup``: everything one GPU node group runs, in device-plugin mode.

Children: the ``SharingPolicy`` (device-plugin configs), the device-plugin and feature-labelling
DaemonSets, and node setup for the cluster's backend: the Deckhouse NodeGroup's node template plus
``NodeGroupConfiguration`` scripts, or the setup DaemonSet elsewhere. A group whose allocation mode is
``dra`` gets node setup and labels only; its DRA driver is a separate component.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from nvgpu.nodelabels import desired_node_labels, desired_node_taints
from nvgpu.nodescripts import NodeScript
from nvgpu.stackconfig import AllocationMode, Cluster, NodeGroup, NodeSetupBackend
from nvidia_gpu.components.manifests import deckhouse, workloads
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvidia_gpu.components.platform import PlatformRefs
from nvidia_gpu.components.register import KubernetesRead, register, register_patch
from nvidia_gpu.components.sharing_policy import SharingPolicy, SharingPolicyArgs

TYPE = "nvidia-gpu:index:GpuNodeGroup"


@dataclass(frozen=True)
class GpuNodeGroupArgs:
    cluster: Cluster
    group: NodeGroup
    allocation_mode: AllocationMode
    platform: PlatformRefs
    #: The deckhouse backend's bashible steps, in weight order (empty for the daemonset backend).
    node_scripts: Sequence[NodeScript] = ()


class GpuNodeGroup(pulumi.ComponentResource):
    device_plugin: pulumi.CustomResource | None
    labeller: pulumi.CustomResource
    node_setup: list[pulumi.CustomResource]
    sharing: SharingPolicy | None

    def __init__(self, name: str, args: GpuNodeGroupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        group, cluster, refs = args.group, args.cluster, args.platform
        deckhouse_backend = cluster.node_setup is NodeSetupBackend.DECKHOUSE
        ctx = GroupContext(namespace=refs.namespace, cluster=cluster, group=group)

        def runs_as(role: AgentRole, *extra: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, depends_on=[*refs.needs(role), *extra])

        self.node_setup = []
        self.node_template_checked: pulumi.Output[bool] | None = None
        if deckhouse_backend:
            # The NodeGroup is Deckhouse's (and its users'): read it first, so a missing or mistyped one
            # fails at preview, and a node template whose taints another manager owns is refused there
            # instead of being taken over (``taints`` is an atomic list: applying it replaces theirs).
            assert group.node_group is not None  # the deckhouse backend requires it (stack config)
            live = KubernetesRead(f"{name}-node-group", deckhouse.NODE_GROUP_API, "NodeGroup", group.node_group,
                                  pulumi.ResourceOptions(parent=self))
            ours = [t.as_dict() for t in desired_node_taints(group)]
            manager = deckhouse.field_manager(refs.namespace)
            checked = pulumi.Output.all(live.metadata, live.spec).apply(
                lambda ms: deckhouse.check_node_template(group, ms[0], ms[1], ours, manager))
            # Removed with the group or the stack: our labels and taints leave the NodeGroup, and
            # Deckhouse takes them off its nodes.
            self.node_setup.append(
                register_patch(
                    f"{name}-node-template",
                    deckhouse.node_group_patch(group, refs.namespace),
                    pulumi.ResourceOptions(parent=self, depends_on=[live]),
                )
            )
            self.node_template_checked = checked
            for script in sorted(args.node_scripts, key=lambda s: (s.weight, s.name)):
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

        self.sharing = None
        self.device_plugin = None
        if args.allocation_mode is AllocationMode.DEVICE_PLUGIN:
            self.sharing = SharingPolicy(
                f"{name}-sharing",
                SharingPolicyArgs(namespace=refs.namespace, group=group, depends_on=(refs.namespace_resource,)),
                pulumi.ResourceOptions(parent=self),
            )
        # The labeller mounts the device plugin's ConfigMap too (workloads.labeller_args): created after it.
        self.labeller = register(f"{name}-labeller", workloads.labeller_daemonset(ctx), runs_as(
            AgentRole.LABELLER, *([self.sharing.config_map] if self.sharing else [])))

        if self.sharing is not None:
            self.device_plugin = register(
                f"{name}-device-plugin",
                workloads.device_plugin_daemonset(ctx),
                runs_as(AgentRole.DEVICE_PLUGIN, self.sharing.config_map),
            )

        #: What the group's nodes must carry: on Deckhouse the node template above applies it, on the
        #: daemonset backend the labeller does (``workloads.labeller_args``); both read ``nvgpu.nodelabels``.
        self.node_labels = desired_node_labels(group)
        self.node_taints = [t.as_dict() for t in desired_node_taints(group)]
        self.register_outputs(
            {
                "nodeGroup": group.name,
                "nodeLabels": self.node_labels,
                "nodeTaints": self.node_taints,
                "sharing": group.gpu.sharing.value,
                "allocationMode": args.allocation_mode.value,
                "deviceConfigMap": self.sharing.config_map_name if self.sharing else None,
                "nodeSetup": "NodeGroupConfiguration" if deckhouse_backend else "DaemonSet",
                # Awaited by the engine, so a refused node template fails the preview.
                "nodeTemplateChecked": self.node_template_checked,
            }
        )
