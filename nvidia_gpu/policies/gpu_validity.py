"""GPU-config validity: what would otherwise fail hours later on a node.

Each rule is a pure function over camelCase manifests (or, for rules that span objects, over the
stack's resources) that returns violation messages; the ``Policy`` objects at the bottom only read
their config and report. GPU facts (models, MIG profiles, driver minima) come from :mod:`nvgpu.catalogue`;
whether a MIG layout fits is :func:`nvgpu.migparted.fit_problems`, the check the stack config and the
MigProfile component run too; sharing limits come from :mod:`nvgpu.stackconfig`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from nvgpu import catalogue, labels, migparted
from nvgpu import driver as driverspec
from nvgpu import toolkit as toolkitspec
from nvgpu.catalogue import GpuModel
from nvgpu.stackconfig import DRA_GA_MINOR, MPS_MAX_CLIENTS, DraSettings
from nvidia_gpu.policies import stack_facts
from nvidia_gpu.policies.manifests import (
    Kind,
    Resource,
    annotations_of,
    as_int,
    as_list,
    as_map,
    as_str,
    config_documents,
    containers,
    kind_of,
    kubernetes_resources,
    labels_of,
    name_of,
    pod_labels,
    pod_spec,
    workload_role,
)
from nvidia_gpu.policies.node_selection import (
    NodeSelection,
    candidate_pairs,
    label_selection,
    node_selection,
    overlap,
)

GPU_MODEL_KEY = labels.GPU_MODEL
DRIVER_VERSION_KEY = labels.DRIVER_VERSION
DRA_GROUP = "resource.k8s.io"
#: First Kubernetes minor serving each DRA API version (v1 on by default; the betas need gates).
DRA_API_SINCE = {"resource.k8s.io/v1": DRA_GA_MINOR, "resource.k8s.io/v1beta2": 33, "resource.k8s.io/v1beta1": 32}
DRA_FEATURE_GATE = "DynamicResourceAllocation"
#: DaemonSets that run before node setup's gate opens: node setup itself, and NVIDIA's driver container
#: (``gpu.driver.source: container``), whose driver the setup check waits for.
#: Node setup itself, the driver container and NVIDIA's toolkit container (node setup waits for the toolkit
#: it installs), none of which can wait for the gate it opens.
DEFAULT_SETUP_ROLES = ("gpu-setup", driverspec.CONTAINER_COMPONENT, toolkitspec.COMPONENT)
_DRIVER_TEST = re.compile(r"device\.driver\s*==\s*[\"']([^\"']+)[\"']|[\"']([^\"']+)[\"']\s*==\s*device\.driver")


@dataclass(frozen=True)
class Violation:
    message: str
    urn: str | None = None


def _meta_value(props: Mapping[str, Any], key: str) -> str | None:
    return as_str(labels_of(props).get(key)) or as_str(annotations_of(props).get(key))


# ---------------------------------------------------------------- MIG configs (mig-parted ConfigMaps)


def mig_parted_documents(props: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """``(data key, document)`` for every mig-parted config file (``mig-configs``) in a ConfigMap."""
    for key, doc in config_documents(props):
        if "mig-configs" in doc:
            yield key, doc


def mig_config_problems(kind: Kind, props: Mapping[str, Any], node_fitted: Iterable[str] = ()) -> list[str]:
    """mig-parted configs that do not parse or whose layouts do not fit the GPUs they target.

    The target is the ConfigMap's ``gpu.nvidia-gpu.io/gpu-model`` when set, else every catalogue model
    an entry's ``device-filter`` selects; entries with no filter and no declared model must at least
    use profiles some catalogue GPU has. Filters naming only GPUs the catalogue does not know, and configs
    for a declared model it lacks, are left to the MIG manager on the node (NVML's own profiles). The check
    is the shared core's (:func:`nvgpu.migparted.fit_problems`, for a config that is defined, not chosen),
    the one the stack config and the MigProfile component run. ``node_fitted``: configs chosen only by
    node groups of such a model (:func:`node_fitted_configs`), likewise left to the node.
    """
    skip = frozenset(node_fitted)
    if kind.kind != "ConfigMap":
        return []
    declared = _meta_value(props, GPU_MODEL_KEY)
    declared_model = _model_or_none(declared)
    problems: list[str] = []
    for key, doc in mig_parted_documents(props):
        try:
            config = migparted.parse_config(doc, source=f"data[{key}]")
        except migparted.MigPartedError as e:
            problems.extend(e.problems)
            continue
        if declared and declared_model is None:
            continue  # a model the catalogue lacks: its layouts are fitted on the node, to NVML's own profiles
        for name in config.mig_configs:
            if name in skip:
                continue
            found = migparted.fit_problems(config, name, declared_model, chosen=False)
            problems.extend(f"data[{key}]: {p}" for p in found)
    return problems


def _unlisted(key: str | None) -> bool:
    """A declared model the catalogue lacks (allowed: what only the catalogue knows is checked on the node)."""
    return bool(key) and key not in catalogue.MODEL_KEYS


def _model_or_none(key: str | None) -> GpuModel | None:
    if not key:
        return None
    try:
        return catalogue.get_model(key)
    except catalogue.UnknownModelError:
        return None


@dataclass(frozen=True)
class MigSelection:
    """A ``nvidia.com/mig.config`` value some object chooses for a group's nodes."""

    config: str
    model: GpuModel | None
    source: str  #: the object choosing it, for messages
    urn: str | None
    #: The group declares a model the catalogue lacks: the fit is the node's (NVML's profiles), not the preview's.
    unlisted: bool = False


def node_label_args(container: Mapping[str, Any]) -> dict[str, str]:
    """Labels the agent's labeller applies to its node: ``--node-label KEY=VALUE`` in the container args."""
    args = [a for a in as_list(container.get("args")) if isinstance(a, str)]
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        value = None
        if arg == "--node-label" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--node-label="):
            value = arg.removeprefix("--node-label=")
        if value and "=" in value:
            key, _, val = value.partition("=")
            out[key] = val
    return out


def node_label_sets(kind: Kind, props: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Labels an object puts on nodes, with where they sit: a Deckhouse NodeGroup's node template, a Node's
    own labels, or the ``--node-label`` arguments of the agent's labeller containers."""
    if kind.kind == "NodeGroup" and kind.group == "deckhouse.io":
        template = as_map(as_map(props.get("spec")).get("nodeTemplate"))
        return [("spec.nodeTemplate.labels", as_map(template.get("labels")))]
    if kind.kind == "Node":
        return [("metadata.labels", labels_of(props))]
    if kind.kind == "DaemonSet":
        return [(f"{c.where} --node-label", node_label_args(c.spec)) for c in containers(pod_spec(kind, props) or {})]
    return []


def _mig_selections(resources: Sequence[Resource], values: Mapping[str, Any]) -> list[MigSelection]:
    """Where the stack sets node labels: Deckhouse node templates, Node objects and the labeller's args."""
    group_models = {
        as_str(g.get("name")) or "": _model_or_none(as_str(as_map(g.get("gpu")).get("model")))
        for g in stack_facts.node_groups(values)
    }
    unlisted_groups = {as_str(g.get("name")) or "" for g in stack_facts.node_groups(values)
                       if _unlisted(as_str(as_map(g.get("gpu")).get("model")))}
    out: list[MigSelection] = []
    for r in resources:
        for where, lbls in node_label_sets(r.kind, r.props):
            value = as_str(lbls.get(labels.MIG_CONFIG))
            if not value:
                continue
            declared = _meta_value(r.props, GPU_MODEL_KEY) or as_str(lbls.get(GPU_MODEL_KEY))
            model = _model_or_none(declared)
            group = as_str(lbls.get(labels.NODE_GROUP)) or _group_of(r.kind, r.props)
            unlisted = _unlisted(declared) or (not declared and group in unlisted_groups)
            if model is None and group in group_models:
                model = group_models[group]
            out.append(MigSelection(value, model, f"{r.title} {where}", r.urn, unlisted))
    return out


def _emitted_configs(resources: Sequence[Resource]) -> list[migparted.MigPartedConfig]:
    out = []
    for r in resources:
        if r.kind.kind == "ConfigMap":
            for key, doc in mig_parted_documents(r.props):
                try:
                    out.append(migparted.parse_config(doc, source=f"data[{key}]"))
                except migparted.MigPartedError:
                    continue  # reported by mig-config-fits-gpu
    return out


def mig_selection_problems(resources: Sequence[Resource], values: Mapping[str, Any]) -> list[Violation]:
    """Every chosen ``nvidia.com/mig.config`` names a config that exists and fits the group's GPU.

    With mig-parted ConfigMaps in the stack the name must be defined there; without them mig-manager
    uses the configs it generates per GPU (:func:`nvgpu.migparted.standard_configs`). The fit is
    :func:`nvgpu.migparted.fit_problems` for a chosen config: against the group's model when known,
    else it must fit some catalogue GPU, as the MigProfile component requires.
    """
    emitted = _emitted_configs(resources)
    out: list[Violation] = []
    for sel in _mig_selections(resources, values):
        label = f"{sel.source}: {labels.MIG_CONFIG}={sel.config}"
        defining = [c for c in emitted if sel.config in c.mig_configs]
        if emitted and not defining:
            names = ", ".join(sorted({n for c in emitted for n in c.mig_configs}))
            out.append(Violation(f"{label}: no mig-parted config of that name; the stack defines: {names}", sel.urn))
            continue
        if sel.unlisted:
            continue  # the catalogue lacks the model: the MIG manager fits the layout to NVML's profiles
        if not emitted:
            standard = migparted.standard_configs(None if sel.model is None else [sel.model])
            if sel.config not in standard:
                gpu = f"the {sel.model.key}" if sel.model else "any catalogue GPU"
                out.append(Violation(f"{label}: not a config mig-parted generates for {gpu}", sel.urn))
                continue
            defining = [migparted.MigPartedConfig(version=migparted.VERSION, mig_configs=standard)]
        out.extend(Violation(f"{label}: {p}", sel.urn)
                   for c in defining for p in migparted.fit_problems(c, sel.config, sel.model))
    return out


# ---------------------------------------------------------------- sharing (device-plugin config files)


def _sharing_blocks(props: Mapping[str, Any], mode: str) -> Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """``(data key, whole document, sharing.<mode>)`` for device-plugin config files in a ConfigMap."""
    for key, doc in config_documents(props):
        block = as_map(as_map(doc.get("sharing")).get(mode))
        if block:
            yield key, doc, block


def time_slicing_problems(kind: Kind, props: Mapping[str, Any]) -> list[str]:
    """``sharing.timeSlicing`` replicas must be integers of at least 2 (the device plugin refuses less)."""
    if kind.kind != "ConfigMap":
        return []
    problems = []
    for key, _, block in _sharing_blocks(props, "timeSlicing"):
        for i, res in enumerate(as_list(block.get("resources"))):
            res_map = as_map(res)
            replicas = as_int(res_map.get("replicas"))
            if replicas is None or replicas < 2:
                name = as_str(res_map.get("name")) or "?"
                problems.append(
                    f"data[{key}] sharing.timeSlicing.resources[{i}] ({name}): replicas must be an integer >= 2 "
                    f"(got {res_map.get('replicas')!r})"
                )
    return problems


def _is_mig_device(device: Any) -> bool:
    text = str(device)
    return ":" in text or text.startswith("MIG-")


def mps_problems(kind: Kind, props: Mapping[str, Any], max_replicas: int = MPS_MAX_CLIENTS) -> list[str]:
    """MPS replicas within 2..max clients, and never MPS together with MIG (strategy or MIG devices)."""
    if kind.kind != "ConfigMap":
        return []
    problems = []
    for key, doc, block in _sharing_blocks(props, "mps"):
        strategy = as_str(as_map(doc.get("flags")).get("migStrategy"))
        if strategy in ("single", "mixed"):
            problems.append(
                f"data[{key}]: sharing.mps cannot be combined with flags.migStrategy {strategy!r} "
                "(the device plugin refuses MPS on MIG devices)"
            )
        for i, res in enumerate(as_list(block.get("resources"))):
            res_map = as_map(res)
            name = as_str(res_map.get("name")) or "?"
            where = f"data[{key}] sharing.mps.resources[{i}] ({name})"
            replicas = as_int(res_map.get("replicas"))
            if replicas is None or not 2 <= replicas <= max_replicas:
                problems.append(
                    f"{where}: replicas must be an integer from 2 to {max_replicas} (got {res_map.get('replicas')!r})"
                )
            devices = res_map.get("devices")
            mig_devices = [d for d in as_list(devices) if _is_mig_device(d)]
            if name.removeprefix("nvidia.com/").startswith("mig-") or mig_devices:
                problems.append(f"{where}: MPS cannot share MIG devices")
    return problems


def mps_on_mig_label_problems(kind: Kind, props: Mapping[str, Any]) -> list[str]:
    """Nodes labelled for MPS sharing must not also be asked to carve MIG instances."""
    out = []
    for where, lbls in node_label_sets(kind, props):
        mode, mig = as_str(lbls.get(labels.DEVICE_GPU_CONFIG)), as_str(lbls.get(labels.MIG_CONFIG))
        if mode == "MPS" and mig and mig != migparted.ALL_DISABLED:
            out.append(f"{kind.kind} {name_of(props)!r} {where}: {labels.DEVICE_GPU_CONFIG}=MPS with "
                       f"{labels.MIG_CONFIG}={mig}: MPS cannot share MIG devices")
    return out


# ---------------------------------------------------------------- DRA


def dra_version_problems(
    resources: Sequence[Resource],
    version: stack_facts.KubernetesVersion,
    feature_gates: Iterable[str] = (),
    runtime_config: Iterable[str] = (),
) -> list[Violation]:
    """DRA objects must use an API version the cluster serves: v1 from 1.34, betas only behind gates."""
    gates, runtime = set(feature_gates), set(runtime_config)
    out = []
    for r in resources:
        if r.kind.group != DRA_GROUP or version.minor >= DRA_GA_MINOR:
            continue
        api = r.kind.api_version
        on = f"Kubernetes {version.text} ({version.source})"
        since = DRA_API_SINCE.get(api)
        if since is None:
            out.append(Violation(f"{r.title} uses {api}, which {on} does not serve", r.urn))
        elif since >= DRA_GA_MINOR or version.minor < since:
            out.append(Violation(f"{r.title} uses {api}, served from Kubernetes 1.{since}; the cluster is {on}", r.urn))
        else:
            missing = []
            if DRA_FEATURE_GATE not in gates:
                missing.append(f"the {DRA_FEATURE_GATE} feature gate")
            if api not in runtime:
                missing.append(f"--runtime-config={api}=true")
            if missing:
                out.append(Violation(
                    f"{r.title} uses {api} on {on} without {' and '.join(missing)} "
                    "(declare them in this policy's featureGates and runtimeConfig)",
                    r.urn,
                ))
    return out


def device_class_problems(kind: Kind, props: Mapping[str, Any], drivers: Sequence[str]) -> list[str]:
    """A DeviceClass must pin the driver in CEL, or it hands out every vendor's devices."""
    if kind.kind != "DeviceClass" or kind.group != DRA_GROUP:
        return []
    name = name_of(props)
    spec = as_map(props.get("spec"))
    expressions = [
        as_str(as_map(as_map(s).get("cel")).get("expression")) or "" for s in as_list(spec.get("selectors"))
    ]
    wanted = " or ".join(f'device.driver == "{d}"' for d in drivers)
    if not any(expressions):
        return [f"DeviceClass {name!r} has no CEL selector, so it matches every device of every driver; add {wanted}"]
    named = [m.group(1) or m.group(2) for e in expressions for m in _DRIVER_TEST.finditer(e)]
    if not named:
        return [f"DeviceClass {name!r}: no CEL selector tests device.driver; add {wanted}"]
    foreign = sorted({d for d in named if d not in drivers})
    if foreign and not any(d in drivers for d in named):
        return [f"DeviceClass {name!r} selects driver {', '.join(foreign)}, not {' or '.join(drivers)}"]
    return []


# ---------------------------------------------------------------- node groups and GPU DaemonSets


def _group_of(kind: Kind, props: Mapping[str, Any]) -> str | None:
    return as_str(labels_of(props).get(labels.NODE_GROUP)) or as_str(pod_labels(kind, props).get(labels.NODE_GROUP))


def _config_selection(group: Mapping[str, Any]) -> NodeSelection | None:
    deckhouse = as_str(group.get("nodeGroup"))
    if deckhouse:
        return label_selection({labels.DECKHOUSE_NODE_GROUP: deckhouse})
    selector = as_map(group.get("nodeSelector"))
    if selector:
        return label_selection(as_map(selector.get("matchLabels")), as_list(selector.get("matchExpressions")))
    return None


def overlapping_groups(resources: Sequence[Resource], values: Mapping[str, Any]) -> list[Violation]:
    """Two node groups must never claim the same node (their DaemonSets and configs would fight)."""
    claims: dict[str, list[tuple[str, NodeSelection, str | None]]] = {}
    for g in stack_facts.node_groups(values):
        name, selection = as_str(g.get("name")), _config_selection(g)
        if name and selection is not None:
            claims.setdefault(name, []).append((f"nvidia-gpu:nodeGroups[{name}]", selection, None))
    for r in resources:
        if r.kind.kind != "DaemonSet":
            continue
        group = _group_of(r.kind, r.props)
        spec = pod_spec(r.kind, r.props)
        if group and spec is not None:
            claims.setdefault(group, []).append((r.title, node_selection(spec), r.urn))
    for name, group_claims in claims.items():  # a group's DaemonSets usually share one selection
        distinct: dict[NodeSelection, tuple[str, NodeSelection, str | None]] = {}
        for claim in group_claims:
            distinct.setdefault(claim[1], claim)
        claims[name] = list(distinct.values())
    out = []
    for a, b in candidate_pairs({name: [c[1] for c in group_claims] for name, group_claims in claims.items()}):
        hit = next(((sa, sb) for sa in claims[a] for sb in claims[b] if overlap(sa[1], sb[1])), None)
        if hit is not None:
            (wa, sel_a, _), (wb, sel_b, urn) = hit
            out.append(Violation(
                f"node groups {a!r} and {b!r} can claim the same nodes: {wa} selects {sel_a.describe()}, "
                f"{wb} selects {sel_b.describe()}",
                urn,
            ))
    return out


_GPU_SELECTION_KEYS = frozenset(
    {labels.GPU_NODE, labels.NODE_GROUP, labels.GPU_SETUP_COMPLETE, labels.DEVICE_GPU_CONFIG}
)


def is_gpu_daemonset(kind: Kind, props: Mapping[str, Any]) -> bool:
    """A DaemonSet meant for GPU nodes: a node group's, one selecting GPU labels, or one using GPUs."""
    if kind.kind != "DaemonSet":
        return False
    if _group_of(kind, props):
        return True
    spec = pod_spec(kind, props) or {}
    for term in node_selection(spec).terms:
        for req in term:
            if req.key in _GPU_SELECTION_KEYS or req.key.startswith("nvidia.com/"):
                return True
    for c in containers(spec):
        for section in ("requests", "limits"):
            if any(str(k).startswith("nvidia.com/") for k in as_map(as_map(c.spec.get("resources")).get(section))):
                return True
    return False


def tolerates_gpu_taint(spec: Mapping[str, Any]) -> bool:
    for raw in as_list(spec.get("tolerations")):
        t = as_map(raw)
        key, op = as_str(t.get("key")) or "", as_str(t.get("operator")) or "Equal"
        effect = as_str(t.get("effect")) or ""
        if effect not in ("", labels.GPU_TAINT_EFFECT):
            continue
        if not key and op == "Exists":
            return True
        if key == labels.GPU_TAINT_KEY and (op == "Exists" or as_str(t.get("value")) == labels.GPU_TAINT_VALUE):
            return True
    return False


def taint_toleration_problems(kind: Kind, props: Mapping[str, Any]) -> list[str]:
    """GPU DaemonSets must tolerate ``nvidia.com/gpu=present:NoSchedule`` or they never start on GPU nodes."""
    if not is_gpu_daemonset(kind, props):
        return []
    if tolerates_gpu_taint(pod_spec(kind, props) or {}):
        return []
    taint = f"{labels.GPU_TAINT_KEY}={labels.GPU_TAINT_VALUE}:{labels.GPU_TAINT_EFFECT}"
    return [f"DaemonSet {name_of(props)!r} does not tolerate the GPU taint {taint}"]


def setup_gate_problems(kind: Kind, props: Mapping[str, Any], setup_roles: Sequence[str]) -> list[str]:
    """GPU DaemonSets (except the setup role itself) run only where ``gpu-setup-complete`` is set."""
    if not is_gpu_daemonset(kind, props):
        return []
    if workload_role(kind, props) in setup_roles:
        return []
    selection = node_selection(pod_spec(kind, props) or {})
    if selection.requires(labels.GPU_SETUP_COMPLETE):
        return []
    return [
        f"DaemonSet {name_of(props)!r} does not wait for node setup: every node selector term must require "
        f"{labels.GPU_SETUP_COMPLETE} (it selects {selection.describe()})"
    ]


# ---------------------------------------------------------------- driver minimum


def driver_problem(model_key: str, driver: str, mig: bool, where: str) -> str | None:
    """The declared driver against the catalogue minimum for the model (raised further for MIG)."""
    model = _model_or_none(model_key)
    if model is None:  # a model the catalogue lacks: the global floor, as the node's check applies it
        try:
            ok = driverspec.parse_version(driver).at_least(catalogue.GLOBAL_MIN_DRIVER)
        except (ValueError, catalogue.DriverVersionError) as e:
            return f"{where}: {e}"
        return None if ok else (f"{where}: driver {driver} is below the global minimum {catalogue.GLOBAL_MIN_DRIVER} "
                                f"({model_key} is not in the catalogue)")
    minimum = model.effective_min_driver
    if mig and model.mig is not None:
        minimum = max(minimum, model.mig.min_driver, key=catalogue.parse_driver_version)
    try:  # a release, or a branch (gpu.driver.version), compared by its number
        ok = driverspec.parse_version(driver).at_least(minimum)
    except (ValueError, catalogue.DriverVersionError) as e:
        return f"{where}: {e}"
    if ok:
        return None
    return f"{where}: driver {driver} is below the {model.key} minimum {minimum}{' for MIG' if mig else ''}"


def driver_minimum_problems(resources: Sequence[Resource], values: Mapping[str, Any]) -> list[Violation]:
    out = []
    for g in stack_facts.node_groups(values):
        gpu = as_map(g.get("gpu"))
        declared = as_str(as_map(gpu.get("driver")).get("version"))
        key = "driver.version" if declared else "driverVersion"
        model, driver = as_str(gpu.get("model")), declared or as_str(gpu.get("driverVersion"))
        if model and driver:
            where = f"nvidia-gpu:nodeGroups[{as_str(g.get('name')) or '?'}].gpu.{key}"
            problem = driver_problem(model, driver, as_str(gpu.get("sharing")) == "MIG", where)
            if problem:
                out.append(Violation(problem))
    for r in resources:
        model, driver = _meta_value(r.props, GPU_MODEL_KEY), _meta_value(r.props, DRIVER_VERSION_KEY)
        if model and driver:
            mig = _meta_value(r.props, labels.DEVICE_GPU_CONFIG) == "MIG"
            problem = driver_problem(model, driver, mig, f"{r.title} {DRIVER_VERSION_KEY}")
            if problem:
                out.append(Violation(problem, r.urn))
    return out


# ---------------------------------------------------------------- policies


def _stack_resources(args: StackValidationArgs) -> list[Resource]:
    return kubernetes_resources(iter([(r.resource_type, r.urn, r.props) for r in args.resources]))


def _kind(args: ResourceValidationArgs) -> Kind | None:
    return kind_of(args.resource_type, args.props)


def _report_all(report: ReportViolation, messages: Iterable[str]) -> None:
    for m in messages:
        report(m, None)


def _report_violations(report: ReportViolation, violations: Iterable[Violation]) -> None:
    for v in violations:
        report(v.message, v.urn)


def node_fitted_configs(resources: Sequence[Resource], values: Mapping[str, Any]) -> frozenset[str]:
    """The mig-parted configs only nodes of a model the catalogue lacks are told to apply: their layouts are
    fitted on the node by the MIG manager, to the profiles NVML reports, not by the preview."""
    selections = _mig_selections(resources, values)
    return frozenset(s.config for s in selections if s.unlisted) - {s.config for s in selections if not s.unlisted}


def _validate_mig_configs(args: StackValidationArgs, report: ReportViolation) -> None:
    """Both MIG rules: every mig-parted ConfigMap on its own, then every config choice against them."""
    resources = _stack_resources(args)
    values = stack_facts.config_values()
    node_fitted = node_fitted_configs(resources, values)
    for r in resources:
        for message in mig_config_problems(r.kind, r.props, node_fitted):
            report(message, r.urn)
    _report_violations(report, mig_selection_problems(resources, values))


def _validate_time_slicing(args: ResourceValidationArgs, report: ReportViolation) -> None:
    kind = _kind(args)
    if kind is not None:
        _report_all(report, time_slicing_problems(kind, args.props))


def _validate_mps(args: ResourceValidationArgs, report: ReportViolation) -> None:
    kind = _kind(args)
    if kind is not None:
        limit = as_int(args.get_config().get("mpsMaxReplicas")) or MPS_MAX_CLIENTS
        _report_all(report, mps_problems(kind, args.props, min(limit, MPS_MAX_CLIENTS)))


def _validate_mps_on_mig(args: ResourceValidationArgs, report: ReportViolation) -> None:
    kind = _kind(args)
    if kind is not None:
        _report_all(report, mps_on_mig_label_problems(kind, args.props))


def _stack_driver_name() -> str:
    values = stack_facts.config_values()
    dra = as_map(as_map(values.get("cluster")).get("dra"))
    return as_str(dra.get("driverName")) or DraSettings().driver_name


def _validate_dra(args: StackValidationArgs, report: ReportViolation) -> None:
    """Both DRA rules: DeviceClass CEL per object, then API versions against the stack's Kubernetes."""
    config = args.get_config()
    resources = _stack_resources(args)
    drivers = [d for d in as_list(config.get("driverNames")) if isinstance(d, str)] or [_stack_driver_name()]
    for r in resources:
        for message in device_class_problems(r.kind, r.props, drivers):
            report(message, r.urn)
    declared = as_str(config.get("kubernetesVersion"))
    minor = stack_facts.parse_minor(declared) if declared else None
    version = stack_facts.kubernetes_version(((r.type, r.props) for r in resources), stack_facts.config_values())
    if version is None and minor is not None:
        version = stack_facts.KubernetesVersion(minor, "policy config kubernetesVersion")
    if version is None:
        if any(r.kind.group == DRA_GROUP for r in resources):
            args.not_applicable("the stack's Kubernetes version is unknown")
        return
    gates = [g for g in as_list(config.get("featureGates")) if isinstance(g, str)]
    runtime = [g for g in as_list(config.get("runtimeConfig")) if isinstance(g, str)]
    _report_violations(report, dra_version_problems(resources, version, gates, runtime))


def _validate_node_groups(args: StackValidationArgs, report: ReportViolation) -> None:
    _report_violations(report, overlapping_groups(_stack_resources(args), stack_facts.config_values()))


def _validate_taint(args: ResourceValidationArgs, report: ReportViolation) -> None:
    kind = _kind(args)
    if kind is not None:
        _report_all(report, taint_toleration_problems(kind, args.props))


def _validate_setup_gate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    kind = _kind(args)
    if kind is None:
        return
    roles = args.get_config().get("setupRoles")
    setup_roles = [r for r in as_list(roles) if isinstance(r, str)] if roles is not None else list(DEFAULT_SETUP_ROLES)
    _report_all(report, setup_gate_problems(kind, args.props, setup_roles))


def _validate_driver(args: StackValidationArgs, report: ReportViolation) -> None:
    _report_violations(report, driver_minimum_problems(_stack_resources(args), stack_facts.config_values()))


_STRINGS = {"type": "array", "items": {"type": "string"}}
MANDATORY = EnforcementLevel.MANDATORY

POLICIES: list[ResourceValidationPolicy | StackValidationPolicy] = [
    StackValidationPolicy(
        name="mig-config-fits-gpu",
        description=f"mig-parted configs and every {labels.MIG_CONFIG} choice must fit the GPU they target "
                    "(known profiles, instance limits, placement).",
        validate=_validate_mig_configs,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="sharing-parameters-valid",
        description=f"Time-slicing needs at least 2 replicas; MPS 2 to {MPS_MAX_CLIENTS} clients per GPU and no MIG.",
        validate=[_validate_time_slicing, _validate_mps, _validate_mps_on_mig],
        enforcement_level=MANDATORY,
        config_schema=PolicyConfigSchema(
            properties={"mpsMaxReplicas": {
                "type": "integer", "minimum": 2, "maximum": MPS_MAX_CLIENTS, "default": MPS_MAX_CLIENTS,
                "description": "Most MPS clients per GPU this stack allows.",
            }},
        ),
    ),
    StackValidationPolicy(
        name="dra-objects-valid",
        description=f"DRA objects need {DRA_GROUP}/v1 (Kubernetes 1.{DRA_GA_MINOR}+) or the beta API with its gates; "
                    "DeviceClass CEL must test device.driver.",
        validate=_validate_dra,
        enforcement_level=MANDATORY,
        config_schema=PolicyConfigSchema(
            properties={
                "kubernetesVersion": {
                    "type": "string", "pattern": r"^v?1\.[0-9]+(\.[0-9]+)?$",
                    "description": "Used when neither the stack config nor the Namespace declares the version.",
                },
                "featureGates": {**_STRINGS, "description": "Feature gates enabled on the cluster."},
                "runtimeConfig": {**_STRINGS, "description": "API versions enabled with --runtime-config."},
                "driverNames": {
                    **_STRINGS, "description": "DRA driver names a DeviceClass may select (default: the stack's).",
                },
            },
        ),
    ),
    StackValidationPolicy(
        name="node-groups-disjoint",
        description="Node groups must not claim the same nodes.",
        validate=_validate_node_groups,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="gpu-daemonset-scheduling",
        description=f"GPU DaemonSets must tolerate the {labels.GPU_TAINT_KEY} taint and run only on nodes labelled "
                    f"{labels.GPU_SETUP_COMPLETE}.",
        validate=[_validate_taint, _validate_setup_gate],
        enforcement_level=MANDATORY,
        config_schema=PolicyConfigSchema(
            properties={"setupRoles": {
                **_STRINGS, "default": list(DEFAULT_SETUP_ROLES),
                "description": "Roles (app.kubernetes.io/component) that perform node setup themselves.",
            }},
        ),
    ),
    StackValidationPolicy(
        name="driver-meets-gpu-minimum",
        description="A declared NVIDIA driver must meet the GPU model's minimum.",
        validate=_validate_driver,
        enforcement_level=MANDATORY,
    ),
]
