"""The typed stack config: everything under the ``nvidia-gpu:`` namespace of ``Pulumi.<stack>.yaml``.

Parsing is validation: an invalid config never exists in memory. Every model forbids unknown keys and
every error is reported as ``nvidia-gpu:<path>: <problem> (got <value>)`` naming what is allowed, so a
typo fails ``pulumi preview`` before any resource is registered.

A MIG group's layout is checked here by :func:`mig_layout_problems`, which the MigProfile manifests
(``mig_config``) run again on the config they render (a caller may hand over groups built past these
validators, and extra configs are only known there): both go through
:func:`nvgpu.migparted.fit_problems`, the one MIG layout check.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from nvgpu import catalogue
from nvgpu.k8snames import check_dns_subdomain, check_key, check_label_value
from nvgpu.migparted import (
    CustomGpuLayout,
    CustomSlice,
    MigConfigSpec,
    MigPartedConfig,
    MigPartedError,
    build_config,
    custom_config_name,
    custom_specs,
    fit_problems,
)
from nvgpu.nodescripts import facts

CONFIG_NAMESPACE = "nvidia-gpu"
#: kubernetes-validate ships schemas for these minors; DRA's resource.k8s.io/v1 needs 1.34.
MIN_KUBERNETES_MINOR = 29
MAX_KUBERNETES_MINOR = 37
DRA_GA_MINOR = 34
#: MPS control daemons accept at most 48 clients per GPU on Volta and newer.
MPS_MAX_CLIENTS = 48

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_PARTED_NAME = re.compile(r"^all-(balanced|disabled|enabled|[0-9]g\.[0-9]+gb(\.me)?)$|^custom$")


class StackConfigError(ValueError):
    """Raised with every problem found, one per line, each naming its config path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack config:\n" + "\n".join(f"  - {p}" for p in problems))


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, use_enum_values=False
    )


class AllocationMode(StrEnum):
    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class NodeSetupBackend(StrEnum):
    DECKHOUSE = "deckhouse"
    DAEMONSET = "daemonset"


class Sharing(StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"
    MIG = "MIG"


class MigStrategy(StrEnum):
    MIXED = "mixed"
    SINGLE = "single"


class AgentImage(_Model):
    """The node-agent image; pinned by tag and/or digest (``latest`` is refused)."""

    repository: Annotated[str, Field(pattern=r"^[a-z0-9]+([._/:-][a-z0-9]+)*$", max_length=255)]
    tag: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")] = None
    digest: Annotated[str | None, Field(pattern=r"^sha256:[0-9a-f]{64}$")] = None
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"

    @model_validator(mode="after")
    def _pinned(self) -> AgentImage:
        if self.tag is None and self.digest is None:
            raise ValueError("set tag or digest: an unpinned image is not allowed")
        if self.tag == "latest":
            raise ValueError("tag 'latest' is not allowed: pin a version or a digest")
        if self.repository.rsplit("/", 1)[-1].count(":"):
            raise ValueError("put the tag in 'tag', not in 'repository'")
        return self

    @property
    def ref(self) -> str:
        ref = self.repository
        if self.tag:
            ref += f":{self.tag}"
        if self.digest:
            ref += f"@{self.digest}"
        return ref


class Monitoring(_Model):
    #: ``prometheus.io/*`` scrape annotations on the device-plugin pods.
    enabled: bool = True


class MigManagerSettings(_Model):
    """The stack-wide MIG manager (one DaemonSet for every MIG-capable group, so the settings are cluster-wide)."""

    #: Reboot the node when a MIG mode change needs a GPU reset that fails (the manager's ``--allow-reboot``);
    #: off, such a change is rolled back and reported as failed.
    allow_reboot: bool = False


#: DeviceClasses the DRA stack publishes (NVIDIA's names, so claims written for its driver keep working).
DRA_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
#: DRADeviceTaints is beta (on by default) from this minor; before it, device taints are dropped.
DRA_DEVICE_TAINTS_MINOR = 36


class ClaimQuota(_Model):
    """A ResourceQuota on DRA claims in one namespace (``count/resourceclaims.resource.k8s.io`` and
    ``<class>.deviceclass.resource.k8s.io/devices``)."""

    namespace: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    #: Most ResourceClaims the namespace may hold.
    claims: Annotated[int | None, Field(ge=0)] = None
    #: Most devices the namespace may request per DeviceClass, e.g. ``{gpu.nvidia.com: 4}``.
    devices: dict[str, Annotated[int, Field(ge=0)]] = {}

    @model_validator(mode="after")
    def _some_limit(self) -> ClaimQuota:
        if self.claims is None and not self.devices:
            raise ValueError("set claims and/or devices: a quota without limits would do nothing")
        unknown = sorted(set(self.devices) - set(DRA_DEVICE_CLASSES))
        if unknown:
            raise ValueError(
                f"devices: unknown DeviceClass {', '.join(unknown)}; allowed: {', '.join(DRA_DEVICE_CLASSES)}"
            )
        return self


class DraSettings(_Model):
    #: ResourceSlice driver (DNS subdomain, at most 63 characters); NVIDIA's name by default.
    driver_name: Annotated[
        str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$", max_length=63)
    ] = "gpu.nvidia.com"
    #: Unhealthy GPUs are withdrawn from the ResourceSlices, or published with a device taint (1.36+).
    health_action: Literal["withdraw", "taint"] = "withdraw"
    claim_quotas: list[ClaimQuota] = []
    #: Off when the cluster already has the DeviceClasses (NVIDIA's DRA driver installed them): they have
    #: fixed names, and the provider would take the existing ones over (and ``destroy`` delete them).
    create_device_classes: bool = True

    @field_validator("claim_quotas")
    @classmethod
    def _unique_namespaces(cls, v: list[ClaimQuota]) -> list[ClaimQuota]:
        names = [q.namespace for q in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"one quota per namespace; repeated: {', '.join(dupes)}")
        return v


class RuntimeClassSettings(_Model):
    """The ``node.k8s.io/v1`` RuntimeClass for the nvidia runtime the node setup registers (pods written from
    NVIDIA's docs ask for ``runtimeClassName: nvidia``)."""

    #: Off when the cluster already has one under that name (NVIDIA's GPU Operator, another stack).
    create: bool = True
    name: Annotated[str, AfterValidator(check_dns_subdomain)] = "nvidia"


def _absolute(v: str, example: str) -> str:
    parts = v.split("/")
    if not v.startswith("/") or ".." in parts or any(c in v for c in "\0\n"):
        raise ValueError(f"must be an absolute path without '..', {example}")
    return "/" + "/".join(p for p in parts if p not in ("", "."))


class Cluster(_Model):
    kubernetes_version: str
    namespace: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)] = "nvidia-gpu"
    allocation_mode: AllocationMode = AllocationMode.DEVICE_PLUGIN
    node_setup: NodeSetupBackend = NodeSetupBackend.DAEMONSET
    agent_image: AgentImage
    monitoring: Monitoring = Monitoring()
    priority_class_name: str = "system-node-critical"
    dra: DraSettings = DraSettings()
    mig: MigManagerSettings = MigManagerSettings()
    runtime_class: RuntimeClassSettings = RuntimeClassSettings()
    #: NVIDIA driver root on the nodes (NVIDIA's ``nvidiaDriverRoot``): ``/`` for a driver installed on
    #: the host, ``/run/nvidia/driver`` for a driver container. Every agent pod mounts it read-only at
    #: ``/driver-root`` and loads NVML from there.
    driver_root: str = "/"
    #: The NVIDIA Container Toolkit's hook program on the nodes (``nvidia-cdi-hook``, or ``nvidia-ctk`` of
    #: toolkits before 1.16), named in the CDI specs the device plugin and the DRA plugin write so that
    #: containers get the driver's soname links and linker cache; ``/usr/local/nvidia/toolkit/nvidia-cdi-hook``
    #: where NVIDIA's GPU Operator installed the toolkit. The plugins use it only where they see it.
    cdi_hook_path: str = facts.CDI_HOOK_PATH
    #: The kubeconfig context the stack's Kubernetes provider uses (default: the current context).
    kube_context: str | None = None

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, v: str) -> str:
        m = re.match(r"^v?1\.(\d+)(\.\d+)?$", v)
        if not m:
            raise ValueError("must look like '1.34' (major.minor, optionally .patch)")
        minor = int(m.group(1))
        if not MIN_KUBERNETES_MINOR <= minor <= MAX_KUBERNETES_MINOR:
            raise ValueError(
                f"Kubernetes 1.{minor} is not supported; "
                f"supported: 1.{MIN_KUBERNETES_MINOR} to 1.{MAX_KUBERNETES_MINOR}"
            )
        return f"1.{minor}"

    @field_validator("driver_root")
    @classmethod
    def _driver_root(cls, v: str) -> str:
        return _absolute(v, "e.g. / or /run/nvidia/driver")

    @field_validator("cdi_hook_path")
    @classmethod
    def _cdi_hook_path(cls, v: str) -> str:
        path = _absolute(v, "e.g. /usr/bin/nvidia-cdi-hook")
        if path.rsplit("/", 1)[1] not in ("nvidia-cdi-hook", "nvidia-ctk"):
            raise ValueError(f"must name nvidia-cdi-hook or nvidia-ctk (got {v!r})")
        return path

    @property
    def kubernetes_minor(self) -> int:
        return int(self.kubernetes_version.split(".")[1])


LabelKey = Annotated[str, AfterValidator(check_key)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]


class LabelSelectorRequirement(_Model):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = []

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class NodeSelector(_Model):
    match_labels: dict[LabelKey, LabelValue] = {}
    match_expressions: list[LabelSelectorRequirement] = []

    @model_validator(mode="after")
    def _non_empty(self) -> NodeSelector:
        if not self.match_labels and not self.match_expressions:
            raise ValueError("an empty selector would match every node; set matchLabels or matchExpressions")
        return self


class Taint(_Model):
    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class TimeSlicing(_Model):
    partition_count: Annotated[int, Field(ge=2, le=100)] = 4


class Mps(_Model):
    partition_count: Annotated[int, Field(ge=2, le=MPS_MAX_CLIENTS)] = 4


class MigSlice(_Model):
    profile: str
    count: Annotated[int, Field(ge=1, le=7)] = 1


class MigCustomConfig(_Model):
    index: Annotated[int, Field(ge=0, le=15)]
    slices: Annotated[list[MigSlice], Field(min_length=1)]


class Mig(_Model):
    parted_config: str = "all-1g.10gb"
    strategy: MigStrategy = MigStrategy.MIXED
    custom_configs: list[MigCustomConfig] = []

    @field_validator("parted_config")
    @classmethod
    def _parted(cls, v: str) -> str:
        if not _PARTED_NAME.match(v):
            raise ValueError(
                "must be all-disabled, all-enabled, all-balanced, all-<profile> (like all-1g.10gb) or custom"
            )
        return v

    @model_validator(mode="after")
    def _custom(self) -> Mig:
        if self.parted_config == "custom" and not self.custom_configs:
            raise ValueError("partedConfig 'custom' needs customConfigs")
        if self.parted_config != "custom" and self.custom_configs:
            raise ValueError("customConfigs is only allowed with partedConfig 'custom'")
        indices = [c.index for c in self.custom_configs]
        if len(indices) != len(set(indices)):
            raise ValueError(f"customConfigs has duplicate GPU indices: {sorted(indices)}")
        return self

    @property
    def custom_layouts(self) -> tuple[CustomGpuLayout, ...]:
        """``customConfigs`` in mig-parted's terms: what the custom config's name and entries are made of."""
        return tuple(
            CustomGpuLayout(c.index, tuple(CustomSlice(s.profile, s.count) for s in c.slices))
            for c in self.custom_configs
        )


class Gpu(_Model):
    model: str | None = None
    sharing: Sharing = Sharing.EXCLUSIVE
    time_slicing: TimeSlicing | None = None
    mps: Mps | None = None
    mig: Mig | None = None
    #: The driver installed on the nodes, when known; checked against the model's minimum.
    driver_version: str | None = None

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        if v is not None and v not in catalogue.MODEL_KEYS:
            raise ValueError(f"unknown GPU model; allowed: {', '.join(catalogue.MODEL_KEYS)}")
        return v

    @field_validator("driver_version")
    @classmethod
    def _driver(cls, v: str | None) -> str | None:
        if v is not None:
            catalogue.parse_driver_version(v)
        return v

    @model_validator(mode="after")
    def _sharing_blocks(self) -> Gpu:
        blocks = {
            Sharing.TIME_SLICING: ("timeSlicing", self.time_slicing),
            Sharing.MPS: ("mps", self.mps),
            Sharing.MIG: ("mig", self.mig),
        }
        for mode, (key, block) in blocks.items():
            if block is not None and self.sharing is not mode:
                raise ValueError(f"'{key}' is only allowed with sharing {mode.value} (sharing is {self.sharing.value})")
        if self.sharing is Sharing.MIG:
            self._check_mig()
        if self.model and self.driver_version:
            model = catalogue.get_model(self.model)
            minimum = model.effective_min_driver
            if self.sharing is Sharing.MIG and model.mig:
                minimum = max(minimum, model.mig.min_driver, key=catalogue.parse_driver_version)
            if not catalogue.driver_at_least(self.driver_version, minimum):
                raise ValueError(f"driverVersion {self.driver_version} is below the {model.key} minimum {minimum}")
        return self

    def _check_mig(self) -> None:
        """The model can do MIG at all; whether the layout fits it is the group's check (it needs the name)."""
        model = self.declared_model
        if model is not None and model.mig is None:
            raise ValueError(f"sharing MIG needs a MIG-capable GPU; {model.key} is not")

    @property
    def declared_model(self) -> catalogue.GpuModel | None:
        """The catalogue entry for ``model``; ``None`` when undeclared, so checks fall back to every model."""
        return catalogue.get_model(self.model) if self.model else None

    @property
    def effective_mig(self) -> Mig:
        return self.mig or Mig()

    @property
    def replicas(self) -> int:
        if self.sharing is Sharing.TIME_SLICING:
            return (self.time_slicing or TimeSlicing()).partition_count
        if self.sharing is Sharing.MPS:
            return (self.mps or Mps()).partition_count
        return 1


class NodeGroup(_Model):
    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=32)]
    #: The Deckhouse NodeGroup whose nodes form this group (selects ``node.deckhouse.io/group=<name>``).
    node_group: Annotated[str | None, Field(pattern=_DNS_LABEL, max_length=63)] = None
    #: An explicit label selector, for clusters without Deckhouse NodeGroups.
    node_selector: NodeSelector | None = None
    gpu: Gpu = Gpu()
    #: Taint GPU nodes ``nvidia.com/gpu=present:NoSchedule`` so only GPU workloads land there.
    gpu_taint: bool = True
    extra_taints: list[Taint] = []
    allocation_mode: AllocationMode | None = None
    #: DRA only: GPUs of this group may be bound to vfio-pci and handed to VMs (IOMMU on, gpu-vfio.sh).
    passthrough: bool = False

    @model_validator(mode="after")
    def _selection(self) -> NodeGroup:
        if (self.node_group is None) == (self.node_selector is None):
            raise ValueError("set exactly one of nodeGroup (a Deckhouse NodeGroup name) or nodeSelector")
        return self

    @model_validator(mode="after")
    def _mig_layout(self) -> NodeGroup:
        problems = mig_layout_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def mig_config_name(self) -> str:
        """The ``nvidia.com/mig.config`` value: the parted config, the custom name, or ``all-disabled``.

        A custom layout is named as Deckhouse names it (:func:`nvgpu.migparted.custom_config_name`).
        """
        if self.gpu.sharing is not Sharing.MIG:
            return "all-disabled"
        mig = self.gpu.effective_mig
        if mig.parted_config == "custom":
            return custom_config_name(self.name, mig.custom_layouts)
        return mig.parted_config

    def custom_mig_configs(self) -> dict[str, list[MigConfigSpec]]:
        """The group's custom layout as mig-parted entries (per GPU index), under its Deckhouse-style name.

        Raises :class:`~nvgpu.migparted.MigPartedError` for a slice whose profile is not spelled like one.
        """
        mig = self.gpu.effective_mig
        if self.gpu.sharing is not Sharing.MIG or mig.parted_config != "custom":
            return {}
        return {self.mig_config_name: custom_specs(mig.custom_layouts, self.gpu.declared_model)}

    @property
    def match_labels(self) -> dict[str, str]:
        if self.node_group is not None:
            return {"node.deckhouse.io/group": self.node_group}
        assert self.node_selector is not None
        return dict(self.node_selector.match_labels)

    @property
    def match_expressions(self) -> list[LabelSelectorRequirement]:
        return [] if self.node_selector is None else list(self.node_selector.match_expressions)


class StackConfig(_Model):
    cluster: Cluster
    node_groups: Annotated[list[NodeGroup], Field(min_length=1)]

    @model_validator(mode="after")
    def _cross(self) -> StackConfig:
        names = [g.name for g in self.node_groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"node group names must be unique; repeated: {', '.join(dupes)}")
        if self.cluster.node_setup is NodeSetupBackend.DECKHOUSE:
            for g in self.node_groups:
                if g.node_group is None:
                    raise ValueError(
                        f"node group {g.name!r}: nodeSetup 'deckhouse' targets Deckhouse NodeGroups, so set nodeGroup"
                    )
        for g in self.node_groups:
            if self.allocation_mode(g) is AllocationMode.DRA and self.cluster.kubernetes_minor < DRA_GA_MINOR:
                raise ValueError(
                    f"node group {g.name!r}: allocationMode 'dra' needs Kubernetes 1.{DRA_GA_MINOR}+ "
                    f"(resource.k8s.io/v1); the cluster is {self.cluster.kubernetes_version}"
                )
        return self

    @model_validator(mode="after")
    def _dra(self) -> StackConfig:
        for g in self.node_groups:
            if g.passthrough and self.allocation_mode(g) is not AllocationMode.DRA:
                raise ValueError(f"node group {g.name!r}: passthrough needs allocationMode 'dra' (VFIO devices "
                                 "are offered through the vfio.gpu.nvidia.com DeviceClass)")
        dra = self.cluster.dra
        if dra.health_action == "taint" and self.cluster.kubernetes_minor < DRA_DEVICE_TAINTS_MINOR:
            raise ValueError(f"cluster.dra.healthAction 'taint' needs DRADeviceTaints, on by default from "
                             f"Kubernetes 1.{DRA_DEVICE_TAINTS_MINOR}; the cluster is "
                             f"{self.cluster.kubernetes_version} (use 'withdraw')")
        if dra.claim_quotas and not self.uses_dra:
            raise ValueError("cluster.dra.claimQuotas is set but no node group uses allocationMode 'dra'")
        return self

    @property
    def uses_dra(self) -> bool:
        return any(self.allocation_mode(g) is AllocationMode.DRA for g in self.node_groups)

    def allocation_mode(self, group: NodeGroup) -> AllocationMode:
        return group.allocation_mode or self.cluster.allocation_mode


def mig_layout_problems(group: NodeGroup, config: MigPartedConfig | None = None) -> list[str]:
    """Why a MIG group's layout cannot be applied, each problem naming the group; empty when it can.

    ``config`` is the mig-parted config its nodes will read (the MigProfile manifests' ``mig_config``
    passes the one it renders, extra configs included); by default the standard sets plus the group's own custom layout,
    which is what the stack config alone can know. The config the group chooses must fit its declared
    model, or some catalogue GPU when it declares none (:func:`nvgpu.migparted.fit_problems`).
    """
    if group.gpu.sharing is not Sharing.MIG:
        return []
    try:
        cfg = config if config is not None else build_config(None, group.custom_mig_configs())
    except MigPartedError as e:
        problems = e.problems
    else:
        problems = fit_problems(cfg, group.mig_config_name, group.gpu.declared_model)
    return [f"node group {group.name!r}: {p}" for p in problems]


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = CONFIG_NAMESPACE + ":"
    first = True
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("" if first else ".") + part
        first = False
    return out


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str] | None:
    """Walk the schema along ``loc`` (minus the last part) to list the keys allowed there."""
    model: Any = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        info = fields.get(part)
        if info is None:
            return None
        model = _model_of(info.annotation)
        if model is None:
            return None
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _problems(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if p not in ("function-after",))
        where = _format_loc(loc)
        kind = e["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_keys(loc)
            hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
            problems.append(f"{where}: unknown key{hint}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if kind == "enum":
            msg = "not an allowed value; allowed: " + e.get("ctx", {}).get("expected", "")
        elif kind == "missing":
            problems.append(f"{where}: required key is missing")
            continue
        value = e.get("input")
        shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
        problems.append(f"{where}: {msg}{shown}")
    return problems


def load_stack_config(values: Mapping[str, Any]) -> StackConfig:
    """Validate the ``nvidia-gpu:`` namespace (keys without the prefix: ``cluster``, ``nodeGroups``)."""
    try:
        return StackConfig.model_validate(dict(values))
    except ValidationError as e:
        raise StackConfigError(_problems(e)) from None


def namespace_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """Pick the ``nvidia-gpu:*`` keys out of a stack file's ``config:`` map; other namespaces are not ours."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        ns, _, short = key.partition(":")
        if ns == CONFIG_NAMESPACE and short:
            out[short] = value
    return out


def load_stack_file(path: Path) -> StackConfig:
    """Read ``Pulumi.<stack>.yaml`` directly (the offline preview and the policy tools use this)."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise StackConfigError([f"{path}: cannot read stack file: {e}"]) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("config", {}), dict):
        raise StackConfigError([f"{path}: expected a mapping with a 'config:' mapping"])
    return load_stack_config(namespace_values(doc.get("config") or {}))
