"""``SharingPolicy``: one node group's device-plugin configuration (all named sharing configs) as a ConfigMap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi

from nvgpu.stackconfig import NodeGroup
from nvidia_gpu.components import inputs
from nvidia_gpu.components.manifests import sharing as manifests
from nvidia_gpu.components.register import register_config_map

TYPE = "nvidia-gpu:index:SharingPolicy"


@dataclass(frozen=True)
class SharingPolicyArgs:
    #: The namespace (a stand-in for an Output is bound by ``register``: see :mod:`~nvidia_gpu.components.inputs`).
    namespace: str
    group: NodeGroup
    depends_on: Sequence[pulumi.Resource] = field(default=())
    #: Labels added to the ConfigMap, checked (see ``GpuPlatformArgs.extra_labels``).
    extra_labels: pulumi.Input[dict[str, str]] = field(default_factory=dict)


class SharingPolicy(pulumi.ComponentResource):
    config_map_name: pulumi.Output[str]
    #: The config the agent falls back to when a node has no (or an unknown) config label.
    default_config: pulumi.Output[str]

    def __init__(self, name: str, args: SharingPolicyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        #: The ConfigMap's data patch (``register_config_map``): the device plugin and labeller wait for it.
        self.config_map: pulumi.CustomResource = register_config_map(
            f"{name}-config",
            inputs.with_labels(manifests.config_map(args.namespace, args.group), args.extra_labels,
                               "GpuPlatformArgs.extra_labels"),
            pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)),
        )
        self.config_map_name = pulumi.Output.from_input(manifests.config_map_name(args.group))
        self.default_config = pulumi.Output.from_input(args.group.gpu.sharing.value)
        self.register_outputs({"configMapName": self.config_map_name, "defaultConfig": self.default_config})
