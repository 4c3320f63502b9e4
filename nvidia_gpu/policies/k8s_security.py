"""Kubernetes security: what a security review of a GPU stack would reject.

Host access (privileged containers, hostPath volumes, host namespaces) is allowed only for the agent
roles that need it, by explicit allow-list in each policy's config; a workload's role is its
``app.kubernetes.io/component`` label (the components set one per agent role). Images are pinned,
every container declares requests and limits, RBAC names every verb and resource and never reaches
Secrets, namespaces carry Pod Security labels, and (advisory) device-plugin configs do not hand out GPUs
through an environment variable any pod can set itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

from nvgpu import devicelist
from nvgpu.devicelist import DeviceListStrategy
from nvidia_gpu.policies.manifests import (
    Kind,
    as_list,
    as_map,
    as_str,
    config_documents,
    containers,
    kind_of,
    labels_of,
    name_of,
    pod_spec,
    workload_role,
)

#: Agent roles that may run privileged: the device plugin (GPU device nodes, kubelet's socket
#: directory), the node-setup agent (``/proc/sys``, kernel modules, containerd) and the DRA kubelet plugin
#: (GPU device nodes for sharing changes, kubelet's plugin directories with Bidirectional propagation) and
#: the MIG manager (``/dev/nvidia-caps`` for MIG changes, the host's nvidia-smi reset and its journal).
#: NVIDIA's dcgm-exporter (``cluster.monitoring.exporter: dcgm``) needs SYS_ADMIN for DCGM's profiling fields.
#: NVIDIA's driver container (``gpu.driver.source: container``) loads the kernel modules; NVIDIA's toolkit
#: container (``toolkit.source: container``) installs the toolkit into a host directory. An MPS group's
#: control daemon (``mps-control-daemon``) sets the GPUs' compute mode, privileged as NVIDIA's is.
DEFAULT_PRIVILEGED_ROLES = ("device-plugin", "gpu-setup", "dra-kubelet-plugin", "mig-manager", "dcgm-exporter",
                            "nvidia-driver", "nvidia-container-toolkit", "mps-control-daemon")
#: Agent roles that may mount host paths: the five above plus the labeller (NFD's features.d) and the agent's
#: metrics exporter (kubelet's PodResources socket, the driver root, the GPUs' device list).
DEFAULT_HOST_PATH_ROLES = ("device-plugin", "gpu-labeller", "gpu-setup", "dra-kubelet-plugin", "mig-manager",
                           "gpu-exporter", "dcgm-exporter", "nvidia-driver", "nvidia-container-toolkit",
                           "mps-control-daemon")
#: Two share the host's PID namespace: NVIDIA's driver container (unloading the modules looks for the host's
#: processes holding the GPUs) and the MPS control daemon (NVIDIA's DRA driver runs it with ``hostPID``,
#: ``templates/mps-control-daemon.tmpl.yaml``: its server then lives where a restarted container finds it and
#: sees its clients' PIDs). No agent needs the host's network or IPC.
DEFAULT_HOST_NAMESPACE_ROLES: dict[str, tuple[str, ...]] = {"hostPID": ("nvidia-driver", "mps-control-daemon"),
                                                            "hostNetwork": (), "hostIPC": ()}
HOST_NAMESPACES = ("hostPID", "hostNetwork", "hostIPC")
#: Roles that read NVML on MIG nodes and may add CAP_SYS_ADMIN, and nothing else, in a container that asks
#: the NVIDIA runtime for the MIG monitor capability (``NVIDIA_MIG_MONITOR_DEVICES=all``): without it NVML
#: refuses a GPU in MIG mode's memory and MIG devices (NVIDIA/gpu-feature-discovery#6), and the runtime
#: honours the variable only in a container with CAP_SYS_ADMIN (nvidia-container-toolkit
#: ``TestMigCapsValidate``). Not privileged, no other capability.
MIG_MONITOR_ROLES = ("gpu-labeller", "gpu-exporter")
DEFAULT_REQUIRED = ("cpu", "memory")
PSA_PREFIX = "pod-security.kubernetes.io/"
PSA_LEVELS = ("privileged", "baseline", "restricted")
DEFAULT_PSA_MODES = ("enforce",)
RBAC_GROUP = "rbac.authorization.k8s.io"
#: Searched at the end of the reference with ``\Z``: ``$`` also matched before a trailing newline, so an
#: image ``repo@sha256:<hex>\n``, which no runtime pulls, counted as pinned.
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}\Z")


def _who(kind: Kind, props: Mapping[str, Any]) -> str:
    return f"{kind.kind} {name_of(props)!r} (role {workload_role(kind, props)!r})"


def privileged_problems(kind: Kind, props: Mapping[str, Any], allowed_roles: Sequence[str]) -> list[str]:
    """Privileged containers (or privilege escalation turned on) outside the allow-listed roles."""
    spec = pod_spec(kind, props)
    if spec is None or workload_role(kind, props) in allowed_roles:
        return []
    out = []
    for c in containers(spec):
        sc = as_map(c.spec.get("securityContext"))
        if sc.get("privileged") is True:
            out.append(f"{_who(kind, props)}: {c.where} is privileged")
        caps = [str(x) for x in as_list(as_map(sc.get("capabilities")).get("add"))]
        if caps == ["SYS_ADMIN"] and workload_role(kind, props) in MIG_MONITOR_ROLES and _asks_mig_monitor(c.spec):
            continue
        if "SYS_ADMIN" in caps or "ALL" in caps:
            out.append(f"{_who(kind, props)}: {c.where} adds capability {', '.join(sorted(caps))}")
    return out


def _asks_mig_monitor(container: Mapping[str, Any]) -> bool:
    """The container sets ``NVIDIA_MIG_MONITOR_DEVICES=all`` (the only value the runtime accepts)."""
    return any(as_map(e).get("name") == "NVIDIA_MIG_MONITOR_DEVICES" and as_map(e).get("value") == "all"
               for e in as_list(container.get("env")))


def host_path_problems(kind: Kind, props: Mapping[str, Any], allowed_roles: Sequence[str]) -> list[str]:
    spec = pod_spec(kind, props)
    if spec is None or workload_role(kind, props) in allowed_roles:
        return []
    out = []
    for v in as_list(spec.get("volumes")):
        volume = as_map(v)
        host_path = as_map(volume.get("hostPath"))
        if host_path:
            path = as_str(host_path.get("path")) or "?"
            out.append(f"{_who(kind, props)}: volume {as_str(volume.get('name')) or '?'!r} mounts host path {path}")
    return out


def host_namespace_problems(
    kind: Kind, props: Mapping[str, Any], allowed: Mapping[str, Sequence[str]]
) -> list[str]:
    """hostPID / hostNetwork / hostIPC only for the roles listed under each key."""
    spec = pod_spec(kind, props)
    if spec is None:
        return []
    role = workload_role(kind, props)
    return [
        f"{_who(kind, props)} sets {field}: true"
        for field in HOST_NAMESPACES
        if spec.get(field) is True and role not in allowed.get(field, ())
    ]


def image_problem(image: str, require_digest: bool = False) -> str | None:
    """Why an image reference is not pinned, or ``None``."""
    if _DIGEST.search(image):
        return None
    if require_digest:
        return "is not pinned by digest (@sha256:...)"
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (Kubernetes pulls latest)"
    tag = last.rsplit(":", 1)[1]
    if tag == "latest":
        return "uses the tag latest"
    return None


def image_problems(kind: Kind, props: Mapping[str, Any], require_digest: bool = False) -> list[str]:
    spec = pod_spec(kind, props)
    if spec is None:
        return []
    out = []
    for c in containers(spec):
        image = as_str(c.spec.get("image"))
        if not image:
            out.append(f"{kind.kind} {name_of(props)!r}: {c.where} has no image")
            continue
        problem = image_problem(image, require_digest)
        if problem:
            out.append(f"{kind.kind} {name_of(props)!r}: {c.where} image {image} {problem}")
    return out


def resource_problems(
    kind: Kind,
    props: Mapping[str, Any],
    requests: Sequence[str] = DEFAULT_REQUIRED,
    limits: Sequence[str] = DEFAULT_REQUIRED,
) -> list[str]:
    """Every container (init containers too) declares the required requests and limits."""
    spec = pod_spec(kind, props)
    if spec is None:
        return []
    out = []
    for c in containers(spec):
        if c.section == "ephemeralContainers":
            continue  # the API forbids resources on ephemeral containers
        res = as_map(c.spec.get("resources"))
        missing = [f"requests.{r}" for r in requests if r not in as_map(res.get("requests"))]
        missing += [f"limits.{r}" for r in limits if r not in as_map(res.get("limits"))]
        if missing:
            out.append(f"{kind.kind} {name_of(props)!r}: {c.where} has no {', '.join(missing)}")
    return out


def rbac_wildcard_problems(kind: Kind, props: Mapping[str, Any]) -> list[str]:
    if kind.group != RBAC_GROUP or kind.kind not in ("Role", "ClusterRole"):
        return []
    out = []
    if as_map(props.get("aggregationRule")):
        out.append(f"{kind.kind} {name_of(props)!r} uses an aggregationRule (its permissions are not spelled out)")
    for i, raw in enumerate(as_list(props.get("rules"))):
        rule = as_map(raw)
        for field in ("apiGroups", "resources", "verbs", "nonResourceURLs", "resourceNames"):
            values = [str(v) for v in as_list(rule.get(field))]
            if any("*" in v for v in values):
                out.append(f"{kind.kind} {name_of(props)!r} rules[{i}].{field} has a wildcard: {', '.join(values)}")
    return out


def rbac_secret_problems(kind: Kind, props: Mapping[str, Any]) -> list[str]:
    """No rule may reach Secrets (core group ``""`` or any group through ``*``)."""
    if kind.group != RBAC_GROUP or kind.kind not in ("Role", "ClusterRole"):
        return []
    out = []
    for i, raw in enumerate(as_list(props.get("rules"))):
        rule = as_map(raw)
        groups = [str(g) for g in as_list(rule.get("apiGroups"))]
        resources = [str(r) for r in as_list(rule.get("resources"))]
        if not ("" in groups or "*" in groups):
            continue
        if any(r in {"*", "secrets"} or r.startswith("secrets/") for r in resources):
            out.append(f"{kind.kind} {name_of(props)!r} rules[{i}] grants access to secrets")
    return out


#: Built-in ClusterRoles whose rules carry wildcards or Secrets access; binding them bypasses the rule checks.
BROAD_BUILTIN_ROLES = ("cluster-admin", "admin", "edit")


def rbac_binding_problems(kind: Kind, props: Mapping[str, Any]) -> list[str]:
    """Bindings must not hand out the built-in roles that reach everything (or Secrets)."""
    if kind.group != RBAC_GROUP or kind.kind not in ("RoleBinding", "ClusterRoleBinding"):
        return []
    ref = as_map(props.get("roleRef"))
    role = as_str(ref.get("name")) or ""
    if as_str(ref.get("kind")) == "ClusterRole" and (role in BROAD_BUILTIN_ROLES or role.startswith("system:")):
        return [f"{kind.kind} {name_of(props)!r} binds the built-in ClusterRole {role!r} (wildcards or Secrets)"]
    return []


def pod_security_problems(
    kind: Kind, props: Mapping[str, Any], modes: Sequence[str] = DEFAULT_PSA_MODES, levels: Sequence[str] = PSA_LEVELS
) -> list[str]:
    if kind.kind != "Namespace" or kind.api_version != "v1":
        return []
    lbls = labels_of(props)
    out = []
    for mode in modes:
        key = PSA_PREFIX + mode
        level = as_str(lbls.get(key))
        if level is None:
            out.append(f"Namespace {name_of(props)!r} has no {key} label")
        elif level not in levels:
            out.append(f"Namespace {name_of(props)!r} {key}={level} is not one of {', '.join(levels)}")
    return out


# ---------------------------------------------------------------- policies


def _strings(value: Any, default: Iterable[str]) -> list[str]:
    if value is None:
        return list(default)
    return [v for v in as_list(value) if isinstance(v, str)]


def _run(args: ResourceValidationArgs, report: ReportViolation, rule: Any, *extra: Any) -> None:
    kind = kind_of(args.resource_type, args.props)
    if kind is not None:
        for message in rule(kind, args.props, *extra):
            report(message, None)


def _validate_privileged(args: ResourceValidationArgs, report: ReportViolation) -> None:
    roles = _strings(args.get_config().get("privilegedRoles"), DEFAULT_PRIVILEGED_ROLES)
    _run(args, report, privileged_problems, roles)


def _validate_host_path(args: ResourceValidationArgs, report: ReportViolation) -> None:
    roles = _strings(args.get_config().get("hostPathRoles"), DEFAULT_HOST_PATH_ROLES)
    _run(args, report, host_path_problems, roles)


def _validate_host_namespaces(args: ResourceValidationArgs, report: ReportViolation) -> None:
    config = args.get_config()
    allowed = {field: _strings(config.get(field), DEFAULT_HOST_NAMESPACE_ROLES[field]) for field in HOST_NAMESPACES}
    _run(args, report, host_namespace_problems, allowed)


def _validate_images(args: ResourceValidationArgs, report: ReportViolation) -> None:
    _run(args, report, image_problems, args.get_config().get("requireDigest") is True)


def _validate_resources(args: ResourceValidationArgs, report: ReportViolation) -> None:
    config = args.get_config()
    requests = _strings(config.get("requests"), DEFAULT_REQUIRED)
    limits = _strings(config.get("limits"), DEFAULT_REQUIRED)
    _run(args, report, resource_problems, requests, limits)


def _validate_rbac_wildcards(args: ResourceValidationArgs, report: ReportViolation) -> None:
    _run(args, report, rbac_wildcard_problems)


def _validate_rbac_secrets(args: ResourceValidationArgs, report: ReportViolation) -> None:
    _run(args, report, rbac_secret_problems)


def _validate_rbac_bindings(args: ResourceValidationArgs, report: ReportViolation) -> None:
    _run(args, report, rbac_binding_problems)


def _validate_pod_security(args: ResourceValidationArgs, report: ReportViolation) -> None:
    config = args.get_config()
    modes = _strings(config.get("modes"), DEFAULT_PSA_MODES)
    levels = _strings(config.get("allowedLevels"), PSA_LEVELS)
    _run(args, report, pod_security_problems, modes, levels)


def device_list_problems(kind: Kind, props: Mapping[str, Any]) -> list[str]:
    """Device-plugin configs that hand out GPUs through ``NVIDIA_VISIBLE_DEVICES`` (``envvar``, also what a config
    that names no strategy gets): node setup must then let the toolkit honour that variable in unprivileged
    containers, and any pod that sets ``NVIDIA_VISIBLE_DEVICES=all`` gets every GPU of its node."""
    if kind.kind != "ConfigMap":
        return []
    said: dict[str, list[str]] = {}  # one advisory per ConfigMap, naming every config it applies to
    for key, doc in config_documents(props):
        flags = as_map(doc.get("flags"))
        if not flags and not doc.get("sharing"):
            continue  # not a device-plugin config
        plugin = as_map(flags.get("plugin"))
        names = devicelist.split(plugin.get("deviceListStrategy", DeviceListStrategy.ENVVAR.value))
        if DeviceListStrategy.ENVVAR.value not in {str(n) for n in as_list(names)}:
            continue
        why = "deviceListStrategy includes envvar" if "deviceListStrategy" in plugin else \
            "no deviceListStrategy, so envvar"
        said.setdefault(why, []).append(f"data[{key}]")
    return [f"ConfigMap {name_of(props)!r} {', '.join(keys)}: {why}: the NVIDIA toolkit must then honour "
            "NVIDIA_VISIBLE_DEVICES in unprivileged containers, so any pod on these nodes can take every GPU "
            "by setting NVIDIA_VISIBLE_DEVICES=all; use volume-mounts or cdi-cri (gpu.deviceListStrategy)"
            for why, keys in said.items()]


def _validate_device_lists(args: ResourceValidationArgs, report: ReportViolation) -> None:
    _run(args, report, device_list_problems)


def _roles_schema(default: Sequence[str], what: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "default": list(default),
            "description": f"Agent roles (app.kubernetes.io/component) allowed {what}."}


_RESOURCE_NAMES = {"type": "array", "items": {"type": "string", "enum": ["cpu", "memory", "ephemeral-storage"]}}

POLICIES: list[ResourceValidationPolicy] = [
    ResourceValidationPolicy(
        name="host-access-allow-listed",
        description="Privileged containers, hostPath volumes and host namespaces only for allow-listed agent roles.",
        validate=[_validate_privileged, _validate_host_path, _validate_host_namespaces],
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema({
            "privilegedRoles": _roles_schema(DEFAULT_PRIVILEGED_ROLES, "privileged containers or SYS_ADMIN"),
            "hostPathRoles": _roles_schema(DEFAULT_HOST_PATH_ROLES, "hostPath volumes"),
            **{field: _roles_schema(DEFAULT_HOST_NAMESPACE_ROLES[field], f"{field}: true")
               for field in HOST_NAMESPACES},
        }),
    ),
    ResourceValidationPolicy(
        name="pinned-images",
        description="Container images must be pinned by tag or digest, never latest or untagged.",
        validate=_validate_images,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema({"requireDigest": {
            "type": "boolean", "default": False, "description": "Require @sha256 digests, not just tags.",
        }}),
    ),
    ResourceValidationPolicy(
        name="container-resources",
        description="Every container must declare resource requests and limits.",
        validate=_validate_resources,
        enforcement_level=EnforcementLevel.ADVISORY,
        config_schema=PolicyConfigSchema({
            "requests": {**_RESOURCE_NAMES, "default": list(DEFAULT_REQUIRED)},
            "limits": {**_RESOURCE_NAMES, "default": list(DEFAULT_REQUIRED)},
        }),
    ),
    ResourceValidationPolicy(
        name="rbac-least-privilege",
        description="RBAC rules must name their groups, resources and verbs (no wildcards) and never reach Secrets.",
        validate=[_validate_rbac_wildcards, _validate_rbac_secrets, _validate_rbac_bindings],
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
    ResourceValidationPolicy(
        name="gpus-only-as-allocated",
        description="Device-plugin configs should not use deviceListStrategy envvar: it lets any pod take every GPU "
                    "of its node by setting NVIDIA_VISIBLE_DEVICES.",
        validate=_validate_device_lists,
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
    ResourceValidationPolicy(
        name="namespace-pod-security",
        description="Namespaces must carry Pod Security Admission labels.",
        validate=_validate_pod_security,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema({
            "modes": {"type": "array", "items": {"type": "string", "enum": ["enforce", "warn", "audit"]},
                      "default": list(DEFAULT_PSA_MODES)},
            "allowedLevels": {"type": "array", "items": {"type": "string", "enum": list(PSA_LEVELS)},
                              "default": list(PSA_LEVELS)},
        }),
    ),
]
