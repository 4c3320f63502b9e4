"""The components as a Pulumi package, for programs in any language: YAML, TypeScript, Go, C#, Java.

``provider/PulumiPlugin.yaml`` makes this repository a source-based component package
(``pulumi package add <repository>/provider``); the engine runs ``provider/__main__.py``, which calls
:func:`serve`. Pulumi's component provider host (reached through :mod:`nvidia_gpu.sdk.componenthost`)
serves the classes below and infers the package's schema from their annotations: each ``...Inputs``
TypedDict is a component's input properties (camelCased), the class annotations its outputs.

Each class *is* the Python component of the same name (same ``nvidia-gpu:index:<Name>`` token, same
children and names), taking its settings the way a stack config spells them, so there is one schema
to learn: ``cluster`` is the ``nvidia-gpu:cluster`` object and ``group``/``groups`` entries of
``nvidia-gpu:nodeGroups`` (docs/configuration.md). They are validated by the same models, together (a
DRA group on a cluster below 1.34 is refused as in a stack), and an error names the component, its
resource name and the field. Those objects are plain (known at preview); ``namespace``, ``agentImage``
and ``extraLabels`` may come from other resources, as in the Python API.

Ordering across components is the program's, as across any two resources: a ``GpuNodeGroup``,
``MigProfile`` or ``DraStack`` ``dependsOn`` its ``GpuPlatform``, whose ServiceAccounts and RBAC its
agents run under. The components find the platform's objects by the names the shared ``cluster``
settings give them (:meth:`PlatformRefs.deployed`).
"""

# No ``from __future__ import annotations``: the component provider host reads these annotations at
# run time and needs them as types, not strings.

import dataclasses
import sys
from typing import Any, NotRequired, TypedDict

import pulumi

from nvgpu.driver import DriverSource
from nvgpu.protostruct import integral
from nvgpu.stackconfig import AllocationMode, NodeGroup, StackConfig, StackConfigError, load_stack_config
from nvgpu.version import VERSION
from nvidia_gpu.components import dra_stack, driver_upgrade, mig_profile, monitoring, node_group, platform
from nvidia_gpu.components.manifests import driverupgrade as driverupgrade_manifests
from nvidia_gpu.sdk import componenthost

#: The package name: the first part of every type token.
PACKAGE = "nvidia-gpu"


class GpuPlatformInputs(TypedDict):
    cluster: dict[str, Any]
    """The cluster settings: the ``nvidia-gpu:cluster`` stack-config object (``kubernetesVersion``,
    ``agentImage``, ``nodeSetup``, ``namespace``, ...)."""
    namespace: NotRequired[pulumi.Input[str]]
    """The namespace the agents run in, when it comes from another resource (default
    ``cluster.namespace``)."""
    agent_image: NotRequired[pulumi.Input[str]]
    """The node-agent image, ``repository:tag`` and/or ``@sha256:...`` (default ``cluster.agentImage``)."""
    extra_labels: NotRequired[pulumi.Input[dict[str, pulumi.Input[str]]]]
    """Labels added to every object the component creates."""


class PlatformInputs(GpuPlatformInputs):
    node_taint_keys: NotRequired[list[str]]
    """The taint keys the node groups declare (``extraTaints``): the labeller may set these on its node
    and no others (``nvidia.com/gpu`` is always allowed), so it cannot lift an administrator's taint."""


class GpuNodeGroupInputs(GpuPlatformInputs):
    group: dict[str, Any]
    """The node group: one entry of the ``nvidia-gpu:nodeGroups`` stack-config list (``name``,
    ``nodeGroup`` or ``nodeSelector``, ``gpu``, ``allocationMode``, ...)."""


class GroupsInputs(GpuPlatformInputs):
    groups: list[dict[str, Any]]
    """The stack's node groups, as the ``nvidia-gpu:nodeGroups`` stack-config list."""


class InputsError(ValueError):
    """A component's inputs are invalid: one ``(property path, reason)`` per problem, paths in the package's
    spelling (``group.gpu.timeSlicing.partitionCount``). :func:`serve` reports them to the engine as
    input-property errors, which every language shows against the resource, without a Python traceback."""

    def __init__(self, component: str, name: str, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__(f"{component} {name!r}: " + "; ".join(f"{path}: {reason}" for path, reason in problems))


def _split(lines: list[str], renames: tuple[tuple[str, str], ...], whole: str) -> list[tuple[str, str]]:
    """``path: reason`` lines (the Python API's and the stack config's errors) as pairs, renamed; a check of
    the whole config (no path of its own) is reported against ``whole``."""
    out = []
    for line in lines:
        path, _, reason = line.strip().partition(": ")
        for old, new in renames:
            if path == old or path.startswith((f"{old}.", f"{old}[")):
                path = new + path[len(old):]
                break
        out.append((path.lstrip(".") or whole, reason or line))
    return out


def _platform_args(component: str, name: str, args: GpuPlatformInputs) -> platform.GpuPlatformArgs:
    """The platform args (cluster settings, namespace, image, labels checked), or :class:`InputsError`."""
    try:
        return platform.GpuPlatformArgs(
            cluster=integral(args["cluster"]), namespace=args.get("namespace"), agent_image=args.get("agent_image"),
            extra_labels=args.get("extra_labels"))
    except ValueError as e:
        renames: tuple[tuple[str, str], ...] = (
            ("GpuPlatformArgs.agent_image", "agentImage"), ("GpuPlatformArgs.extra_labels", "extraLabels"),
            ("GpuPlatformArgs", ""))
        raise InputsError(component, name, _split(str(e).splitlines(), renames, "cluster")) from None


def _stack_config(component: str, name: str, platform_args: platform.GpuPlatformArgs,
                  groups: list[dict[str, Any]]) -> StackConfig:
    """The cluster settings as validated (the namespace and image overrides folded in, an Output as its
    stand-in) and ``groups``, validated as one stack config, so the stack-wide checks see what the
    components will use; problems raise :class:`InputsError` in this package's terms."""
    settings = platform_args.settings.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    try:
        return load_stack_config({"cluster": settings, "nodeGroups": integral(groups)})
    except StackConfigError as e:
        group = "group" if component == "GpuNodeGroup" else "groups[0]"
        renames = (("nvidia-gpu:nodeGroups[0]", group), ("nvidia-gpu:nodeGroups", "groups"),
                   ("nvidia-gpu:cluster", "cluster"), ("nvidia-gpu:", ""))
        raise InputsError(component, name, _split(e.problems, renames, group.partition("[")[0])) from None


def _validated(component: str, name: str, args: GpuPlatformInputs,
               groups: list[dict[str, Any]]) -> tuple[platform.GpuPlatformArgs, StackConfig]:
    platform_args = _platform_args(component, name, args)
    return platform_args, _stack_config(component, name, platform_args, groups)


class GpuPlatform(platform.GpuPlatform):
    """The cluster-wide part of nvidia-gpu: the agents' namespace, ServiceAccounts and least-privilege
    RBAC, and the ``nvidia`` RuntimeClass for users' GPU pods."""

    # The outputs, spelled again here as types (the Python component's module defers its annotations).
    namespace: pulumi.Output[str]
    """The namespace the agents run in."""
    service_accounts: dict[str, str]
    """The agents' ServiceAccounts, by role."""

    def __init__(self, name: str, args: PlatformInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args = _platform_args("GpuPlatform", name, args)
        super().__init__(name, dataclasses.replace(platform_args, node_taint_keys=tuple(args.get("node_taint_keys")
                                                                                        or ())), opts)


class GpuNodeGroup(node_group.GpuNodeGroup):
    """One group of GPU nodes: node setup (Deckhouse NodeGroupConfigurations or the setup DaemonSet), the
    labeller, and in device-plugin mode the device plugin with its sharing configs (exclusive,
    time-slicing, MPS, MIG). Depends on its ``GpuPlatform`` (``dependsOn``)."""

    node_labels: dict[str, str]
    """The labels the group's nodes carry (GPU model, sharing, the deploy gates)."""
    node_taints: list[dict[str, str]]
    """The taints the group's nodes carry (``key``, ``value``, ``effect``)."""

    def __init__(self, name: str, args: GpuNodeGroupInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("GpuNodeGroup", name, args, [args["group"]])
        group: NodeGroup = config.node_groups[0]
        super().__init__(name, node_group.GpuNodeGroupArgs(
            platform=platform.PlatformRefs.deployed(platform_args), group=group,
            allocation_mode=config.allocation_mode(group)), opts)


class MigProfile(mig_profile.MigProfile):
    """The stack's MIG layouts as a mig-parted ConfigMap, and the MIG manager DaemonSet that applies them
    on every group that can have MIG GPUs. One per cluster; depends on its ``GpuPlatform``."""

    config_map_name: pulumi.Output[str]
    """The mig-parted ConfigMap's name."""
    config_names: pulumi.Output[dict[str, str]]
    """The ``nvidia.com/mig.config`` value of each MIG node group."""

    def __init__(self, name: str, args: GroupsInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("MigProfile", name, args, args["groups"])
        super().__init__(name, mig_profile.MigProfileArgs(cluster=platform_args.settings, groups=config.node_groups),
                         opts)


class DraStack(dra_stack.DraStack):
    """DRA mode (Kubernetes 1.34+) for the groups whose ``allocationMode`` is ``dra``: the DeviceClasses,
    the kubelet plugin DaemonSets, their RBAC and the admission policy that confines each plugin to its
    own node's ResourceSlices. Depends on its ``GpuPlatform``."""

    def __init__(self, name: str, args: GroupsInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("DraStack", name, args, args["groups"])
        dra_groups = [g for g in config.node_groups if config.allocation_mode(g) is AllocationMode.DRA]
        if not dra_groups:
            raise ValueError(f"DraStack {name!r}: groups: none has allocationMode 'dra' (nor does the cluster)")
        super().__init__(name, dra_stack.DraStackArgs(
            cluster=platform_args.settings, groups=dra_groups, platform=platform.PlatformRefs.deployed(platform_args)),
            opts)


class GpuMonitoring(monitoring.GpuMonitoring):
    """GPU metrics and their use, as ``cluster.monitoring`` says: an exporter DaemonSet per group (the agent's
    NVML exporter or NVIDIA's dcgm-exporter), ServiceMonitors or PodMonitors, the alert rules and the Grafana
    dashboards. One per cluster; depends on its ``GpuPlatform`` and, for the exporters, on the groups."""

    metrics_exporter: str
    """Who serves the GPU metrics: ``agent``, ``dcgm`` or ``none``."""
    alert_rules: bool
    """Whether the alert rules were created."""
    dashboard_count: int
    """How many dashboard ConfigMaps were created."""

    def __init__(self, name: str, args: GroupsInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("GpuMonitoring", name, args, args["groups"])
        super().__init__(name, monitoring.GpuMonitoringArgs(
            platform=platform.PlatformRefs.deployed(platform_args), groups=config.node_groups,
            cluster=platform_args.settings), opts)
        settings = platform_args.settings.monitoring
        self.metrics_exporter = settings.exporter.value if settings.enabled else "none"
        self.alert_rules = self.rules is not None
        self.dashboard_count = len(self.dashboards)


class DriverUpgrade(driver_upgrade.DriverUpgrade):
    """The driver upgrade controller for the groups whose ``gpu.driver.source`` is ``container``: it rolls a
    driver change through their nodes one at a time (cordon, drain, new driver, check, uncordon), honouring
    Deckhouse disruption windows. One per cluster; depends on its ``GpuPlatform``."""

    drain_mode: str
    """How nodes are drained: ``deckhouse`` (NodeGroup disruptions) or ``evict``."""

    def __init__(self, name: str, args: GroupsInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("DriverUpgrade", name, args, args["groups"])
        if not any(g.gpu.driver.source is DriverSource.CONTAINER for g in config.node_groups):
            raise InputsError("DriverUpgrade", name, [(
                "groups", "none has gpu.driver.source 'container': there is no driver for the controller to roll")])
        super().__init__(name, driver_upgrade.DriverUpgradeArgs(cluster=platform_args.settings,
                                                                groups=config.node_groups), opts)
        self.drain_mode = driverupgrade_manifests.drain_mode(platform_args.settings)


COMPONENTS: list[type[pulumi.ComponentResource]] = [GpuPlatform, GpuNodeGroup, MigProfile, DraStack, GpuMonitoring,
                                                    DriverUpgrade]


def schema() -> str:
    """The package's schema as the engine receives it (``pulumi package get-schema``), without an engine: what
    a release publishes (``tools/release.py``), for ``pulumi package gen-sdk`` in languages the user picks."""
    return componenthost.schema(COMPONENTS, PACKAGE, VERSION)


def _input_problems(error: Exception) -> list[tuple[str, str]] | None:
    """A component's :class:`InputsError` as input-property problems; any other exception stays unexpected."""
    return error.problems if isinstance(error, InputsError) else None


def serve() -> None:
    """Serve the components to the engine (``provider/__main__.py``); returns when the engine is done.

    Pulumi's component provider host, with one change: a component's :class:`InputsError` reaches the
    engine as input-property errors (the host would report any exception from a constructor as an
    unexpected one, with its traceback).
    """
    # As component_provider_host does: the engine passes the plugin's directory, then its own address.
    # The schema's version is the release's (nvgpu.version), not the installed distribution's metadata: an
    # editable install keeps the version it was installed with.
    componenthost.serve(COMPONENTS, PACKAGE, VERSION, sys.argv[1:], _input_problems)
