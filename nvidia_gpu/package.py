"""The components as a Pulumi package, for programs in any language: YAML, TypeScript, Go, C#, Java.

``provider/PulumiPlugin.yaml`` makes this repository a source-based component package
(``pulumi package add <repository>/provider``); the engine runs ``provider/__main__.py``, which calls
:func:`serve`. Pulumi's component provider host (reached through :mod:`nvidia_gpu.sdk.componenthost`)
serves the classes below and infers the package's schema from their annotations: each ``...Inputs``
TypedDict is a component's input properties (camelCased), the class annotations its outputs. The classes
are the registry's (:mod:`nvidia_gpu.components.registry`: every component, described as it says).

The schema served types ``cluster``, ``group`` and ``groups`` as object types made from the stack config's
models (:func:`_typed`: enums for the sharing and allocation modes and the rest, every field described from
the models' docs), so TypeScript, Go and Pulumi YAML know every key; the constructors still take them as
plain dicts and validate them with those models (:mod:`nvidia_gpu.sdk.schematypes` says why).

Each class *is* the Python component of the same name (same ``nvidia-gpu:index:<Name>`` token, same
children and names), taking its settings the way a stack config spells them, so there is one schema
to learn: ``cluster`` is the ``nvidia-gpu:cluster`` object and ``group``/``groups`` entries of
``nvidia-gpu:nodeGroups`` (docs/reference/components.md). They are validated by the same models, together (a
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

import copy
import dataclasses
import inspect
import sys
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict, TypeVar

import pulumi
from pydantic.alias_generators import to_camel

from nvgpu import attrdocs
from nvgpu.driver import DriverSource
from nvgpu.protostruct import integral
from nvgpu.stackconfig import (
    AllocationMode,
    Cluster,
    NodeGroup,
    StackConfig,
    StackConfigError,
    jsonschema,
    load_stack_config,
)
from nvgpu.version import VERSION
from nvidia_gpu.components import (
    dra_stack,
    driver_upgrade,
    mig_profile,
    monitoring,
    node_group,
    platform,
    registry,
    sharing_policy,
)
from nvidia_gpu.components.manifests import driverupgrade as driverupgrade_manifests
from nvidia_gpu.sdk import componenthost, schematypes

#: The package name: the first part of every type token.
PACKAGE = registry.PACKAGE

_C = TypeVar("_C", bound=pulumi.ComponentResource)


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


class SharingPolicyInputs(TypedDict):
    cluster: dict[str, Any]
    """The cluster settings: the ``nvidia-gpu:cluster`` stack-config object (its ``namespace`` is the
    ConfigMap's unless ``namespace`` is given)."""
    group: dict[str, Any]
    """The node group: one entry of the ``nvidia-gpu:nodeGroups`` stack-config list."""
    namespace: NotRequired[pulumi.Input[str]]
    """The ConfigMap's namespace, when it comes from another resource (default ``cluster.namespace``)."""
    extra_labels: NotRequired[pulumi.Input[dict[str, pulumi.Input[str]]]]
    """Labels added to the ConfigMap."""


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


def _platform_args(component: str, name: str, args: Mapping[str, Any]) -> platform.GpuPlatformArgs:
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
        group = "group" if "group" in registry.BY_NAME[component].settings else "groups[0]"
        renames = (("nvidia-gpu:nodeGroups[0]", group), ("nvidia-gpu:nodeGroups", "groups"),
                   ("nvidia-gpu:cluster", "cluster"), ("nvidia-gpu:", ""))
        raise InputsError(component, name, _split(e.problems, renames, group.partition("[")[0])) from None


def _validated(component: str, name: str, args: Mapping[str, Any],
               groups: list[dict[str, Any]]) -> tuple[platform.GpuPlatformArgs, StackConfig]:
    platform_args = _platform_args(component, name, args)
    return platform_args, _stack_config(component, name, platform_args, groups)


def _served(cls: type[_C]) -> type[_C]:
    """A served component: described as its registry entry says (the schema's description of the resource)."""
    entry = registry.BY_NAME[cls.__name__]
    inputs = inspect.get_annotations(cls.__init__)["args"]
    if not set(entry.settings) <= inputs.__required_keys__:  # the registry's word on what the component takes
        raise TypeError(f"{cls.__name__}: {inputs.__name__} lacks the settings {entry.settings}")
    cls.__doc__ = entry.doc
    return cls


@_served
class GpuPlatform(platform.GpuPlatform):
    # The outputs, spelled again here as types (the Python component's module defers its annotations).
    namespace: pulumi.Output[str]
    """The namespace the agents run in."""
    service_accounts: dict[str, str]
    """The agents' ServiceAccounts, by role."""

    def __init__(self, name: str, args: PlatformInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args = _platform_args("GpuPlatform", name, args)
        super().__init__(name, dataclasses.replace(platform_args, node_taint_keys=tuple(args.get("node_taint_keys")
                                                                                        or ())), opts)


@_served
class GpuNodeGroup(node_group.GpuNodeGroup):
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


@_served
class SharingPolicy(sharing_policy.SharingPolicy):
    config_map_name: pulumi.Output[str]
    """The ConfigMap's name (``device-plugin-config-<group>``), for a device plugin's config."""
    default_config: pulumi.Output[str]
    """The config a node without (or with an unknown) ``node.deckhouse.io/device-gpu.config`` label gets:
    the group's ``gpu.sharing``."""

    def __init__(self, name: str, args: SharingPolicyInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("SharingPolicy", name, args, [args["group"]])
        super().__init__(name, sharing_policy.SharingPolicyArgs(
            namespace=platform_args.settings.namespace, group=config.node_groups[0], extra_labels=platform_args.labels),
            opts)


@_served
class MigProfile(mig_profile.MigProfile):
    config_map_name: pulumi.Output[str]
    """The mig-parted ConfigMap's name."""
    config_names: pulumi.Output[dict[str, str]]
    """The ``nvidia.com/mig.config`` value of each MIG node group."""

    def __init__(self, name: str, args: GroupsInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("MigProfile", name, args, args["groups"])
        super().__init__(name, mig_profile.MigProfileArgs(cluster=platform_args.settings, groups=config.node_groups),
                         opts)


@_served
class DraStack(dra_stack.DraStack):
    def __init__(self, name: str, args: GroupsInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        platform_args, config = _validated("DraStack", name, args, args["groups"])
        dra_groups = [g for g in config.node_groups if config.allocation_mode(g) is AllocationMode.DRA]
        if not dra_groups:
            raise ValueError(f"DraStack {name!r}: groups: none has allocationMode 'dra' (nor does the cluster)")
        super().__init__(name, dra_stack.DraStackArgs(
            cluster=platform_args.settings, groups=dra_groups, platform=platform.PlatformRefs.deployed(platform_args)),
            opts)


@_served
class GpuMonitoring(monitoring.GpuMonitoring):
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


@_served
class DriverUpgrade(driver_upgrade.DriverUpgrade):
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


#: The served components, in the registry's order (every component of :mod:`nvidia_gpu.components.registry`).
COMPONENTS: list[type[pulumi.ComponentResource]] = [globals()[c.name] for c in registry.COMPONENTS]


def _typed(inferred: dict[str, Any]) -> dict[str, Any]:
    """The inferred schema with ``cluster``, ``group`` and ``groups`` typed by the stack config's models (object
    and enum types, descriptions from the models' docs): what the engine and the generated SDKs see. The
    components still take them as plain dicts and validate them with the same models."""
    (cluster, group), defs = jsonschema.json_schemas([Cluster, NodeGroup])
    # The components' own take on the cluster object: the agent image may come as the agentImage input, and
    # the preview identity is a whole stack's (a component refuses it: its role is derived from every object).
    settings = copy.deepcopy(defs["Cluster"])
    settings["properties"].pop("previewIdentity")
    settings["required"] = [k for k in settings["required"] if k not in ("agentImage", "previewIdentity")]
    image = settings["properties"]["agentImage"]
    image["description"] += " Required unless the component's `agentImage` input is given."
    typed = {"cluster": cluster, "group": group, "groups": {"type": "array", "items": group}}
    refined = schematypes.typed_inputs(inferred, typed, {**defs, "Cluster": settings}, jsonschema.markdown)
    # The analyzer reads an input's description from its own TypedDict's source, not from the one it derives
    # from (GpuNodeGroupInputs' cluster is GpuPlatformInputs'): each input gets its documented one.
    for cls in COMPONENTS:
        inputs = inspect.get_annotations(cls.__init__)["args"]
        docs = {to_camel(name): jsonschema.markdown(text) for name, text in attrdocs.attribute_docs(inputs).items()}
        properties = refined["resources"][registry.BY_NAME[cls.__name__].token]["inputProperties"]
        for key, prop in properties.items():
            prop.setdefault("description", docs[key])
    return refined


def schema() -> str:
    """The package's schema as the engine receives it (``pulumi package get-schema``), without an engine: what
    a release publishes (``tools/release.py``), for ``pulumi package gen-sdk`` in languages the user picks."""
    return componenthost.schema(COMPONENTS, PACKAGE, VERSION, refine=_typed)


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
    componenthost.serve(COMPONENTS, PACKAGE, VERSION, sys.argv[1:], _input_problems, refine=_typed)
