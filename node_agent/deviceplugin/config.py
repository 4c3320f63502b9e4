"""NVIDIA's device-plugin config file, version v1, as a strict pydantic model plus precedence rules.

A node gets the same file NVIDIA's k8s-device-plugin reads (``version: v1`` with ``flags``,
``resources``, ``sharing`` and ``imex``), so configs written for that plugin keep working. Parsing is
validation: unknown keys and bad values are rejected with the field path named. CLI flags override
environment variables, which override the file (:func:`resolve`), exactly as ``api/config/v1`` does.

The file comes from a ConfigMap anyone with edit rights on it can write, so reading it is bounded:
:func:`nvgpu.yamltext.load` refuses YAML aliases (NVIDIA's format has no use for them; a 523-byte alias
bomb expanded to gigabytes), deep nesting and integers past 32 characters, and every error message is
cut to a fixed length (:mod:`nvgpu.errortext`).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nvgpu import devicelist, hostpaths, yamltext
from nvgpu.devicelist import DeviceListStrategy
from nvgpu.errortext import capped, clip, index_part, listed, path_part, shown

log = logging.getLogger(__name__)

VERSION = "v1"
RESOURCE_PREFIX = "nvidia.com"
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_MPS_ROOT = hostpaths.DEVICE_PLUGIN_MPS_ROOT
#: Both used with ``fullmatch``: ``re.match`` with ``$`` let ``gpu\n`` through as a resource name.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_RESOURCE_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
#: Most replicas of one device (``sharing.*.resources[].replicas``). NVIDIA's plugin has no limit, but
#: every replica is a device object here (about 350 bytes with its share of the kubelet's ListAndWatch
#: answer): 10^9 replicas never finished building, 100,000 on an 8-GPU node took 278 MiB against the
#: plugin's 192 MiB memory limit. At 512, the largest resource one node advertises (16 GPUs x 7 MIG
#: devices under the single strategy) is 57,344 devices: about 20 MiB, and a ListAndWatch answer of
#: about 3.7 MB, within the kubelet's 4 MiB gRPC message limit. It is also more than the pods a node
#: runs (the kubelet's maxPods is 110 by default), so no usable sharing is refused.
MAX_REPLICAS = 512


class ConfigError(ValueError):
    """An invalid device-plugin config; ``problems`` has one ``path: message`` line per error."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = capped(problems, "<root>")
        super().__init__(listed(self.problems, f"invalid device-plugin {clip(source, 200)}:"))


class MigStrategy(StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class DeviceIdStrategy(StrEnum):
    UUID = "uuid"
    INDEX = "index"


class SharingStrategy(StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


class AllocationPolicy(StrEnum):
    DISTRIBUTED = "distributed"
    PACKED = "packed"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PluginFlags(_Strict):
    pass_device_specs: bool | None = Field(default=None, alias="passDeviceSpecs")
    device_list_strategy: list[DeviceListStrategy] | None = Field(default=None, alias="deviceListStrategy")
    device_id_strategy: DeviceIdStrategy | None = Field(default=None, alias="deviceIDStrategy")
    cdi_annotation_prefix: str | None = Field(default=None, alias="cdiAnnotationPrefix")
    nvidia_ctk_path: str | None = Field(default=None, alias="nvidiaCTKPath")
    container_driver_root: str | None = Field(default=None, alias="containerDriverRoot")
    shared_devices_allocation_policy: AllocationPolicy | None = Field(
        default=None, alias="sharedDevicesAllocationPolicy"
    )
    cdi_feature_flags: list[str] | None = Field(default=None, alias="cdiFeatureFlags")

    @field_validator("device_list_strategy", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return devicelist.split(v)

    @field_validator("device_list_strategy")
    @classmethod
    def _non_empty(cls, v: list[DeviceListStrategy] | None) -> list[DeviceListStrategy] | None:
        return None if v is None else devicelist.check(v)

    @field_validator("cdi_annotation_prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        if v is not None and not v.endswith("/"):
            raise ValueError("must end with '/' (for example cdi.k8s.io/)")
        return v


class GfdFlags(_Strict):
    oneshot: bool | None = None
    no_timestamp: bool | None = Field(default=None, alias="noTimestamp")
    sleep_interval: str | None = Field(default=None, alias="sleepInterval")
    output_file: str | None = Field(default=None, alias="outputFile")
    machine_type_file: str | None = Field(default=None, alias="machineTypeFile")


class Flags(_Strict):
    mig_strategy: MigStrategy | None = Field(default=None, alias="migStrategy")
    fail_on_init_error: bool | None = Field(default=None, alias="failOnInitError")
    mps_root: str | None = Field(default=None, alias="mpsRoot")
    nvidia_driver_root: str | None = Field(default=None, alias="nvidiaDriverRoot")
    nvidia_dev_root: str | None = Field(default=None, alias="nvidiaDevRoot")
    gdrcopy_enabled: bool | None = Field(default=None, alias="gdrcopyEnabled")
    gds_enabled: bool | None = Field(default=None, alias="gdsEnabled")
    mofed_enabled: bool | None = Field(default=None, alias="mofedEnabled")
    use_node_feature_api: bool | None = Field(default=None, alias="useNodeFeatureAPI")
    device_discovery_strategy: Literal["auto", "nvml", "tegra"] | None = Field(
        default=None, alias="deviceDiscoveryStrategy"
    )
    plugin: PluginFlags | None = None
    gfd: GfdFlags | None = None


class NamedPattern(_Strict):
    pattern: str
    name: str


class Resources(_Strict):
    """``resources.gpus`` / ``resources.mig``: accepted for compatibility, ignored like NVIDIA does."""

    gpus: list[NamedPattern] = []
    mig: list[NamedPattern] = []


def normalize_resource_name(name: str) -> str:
    """``gpu`` → ``nvidia.com/gpu``; a name with a prefix must use ``nvidia.com``."""
    if "/" not in name:
        name = f"{RESOURCE_PREFIX}/{name}"
    prefix, _, part = name.partition("/")
    if prefix != RESOURCE_PREFIX:
        raise ValueError(f"resource name {shown(name)} must be in the {RESOURCE_PREFIX}/ domain")
    if len(name) > 63 or not _RESOURCE_PART.fullmatch(part) or not _DNS_SUBDOMAIN.fullmatch(part.lower()):
        raise ValueError(f"resource name {shown(name)} must be at most 63 characters and a DNS subdomain")
    return name


class ReplicatedResource(_Strict):
    name: str
    rename: str | None = None
    devices: Literal["all"] | Annotated[int, Field(gt=0)] | list[str | int] = "all"
    #: 2 to :data:`MAX_REPLICAS` (a bound of memory, not of NVIDIA's format: see there).
    replicas: int

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return normalize_resource_name(v)

    @field_validator("rename")
    @classmethod
    def _rename(cls, v: str | None) -> str | None:
        return None if v is None else normalize_resource_name(v)

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v: int) -> int:
        if not 2 <= v <= MAX_REPLICAS:
            raise ValueError(f"must be from 2 to {MAX_REPLICAS}: each replica is a device the plugin builds and "
                             "advertises to the kubelet, and more than a node's pods could use cost memory only")
        return v


class ReplicatedResources(_Strict):
    rename_by_default: bool = Field(default=False, alias="renameByDefault")
    fail_requests_greater_than_one: bool | None = Field(default=None, alias="failRequestsGreaterThanOne")
    resources: list[ReplicatedResource] = []

    @model_validator(mode="after")
    def _unique(self) -> ReplicatedResources:
        counts = Counter(r.name for r in self.resources)
        dup = sorted(n for n, c in counts.items() if c > 1)
        if dup:
            raise ValueError(f"resource {shown(dup[0])} is listed twice")
        return self


class Sharing(_Strict):
    time_slicing: ReplicatedResources | None = Field(default=None, alias="timeSlicing")
    mps: ReplicatedResources | None = None


class Imex(_Strict):
    channel_ids: list[int] = Field(default=[], alias="channelIDs")
    required: bool = False

    @field_validator("channel_ids")
    @classmethod
    def _channels(cls, v: list[int]) -> list[int]:
        if v not in ([], [0]):
            raise ValueError("only [] or [0] are supported")
        return v


class ConfigFile(_Strict):
    version: str = VERSION
    flags: Flags = Flags()
    resources: Resources | None = None
    sharing: Sharing = Sharing()
    imex: Imex = Imex()

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v in ("", VERSION):
            return VERSION
        raise ValueError(f"unsupported version {shown(v)}; supported: {VERSION}")


def _problems(err: ValidationError) -> list[str]:
    """``path: why (got value)`` per error; the value and every key of the path are bounded
    (:func:`nvgpu.errortext.shown`): a 5,000-digit integer cannot even be written by ``repr``."""
    out = []
    for e in err.errors(include_url=False):
        path = ".".join(index_part(p) if isinstance(p, int) else path_part(p) for p in e["loc"]).replace(".[", "[")
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        suffix = f" (got {shown(got)})" if e["type"] != "missing" and not isinstance(got, dict | list) else ""
        out.append(f"{path or '<root>'}: {msg}{suffix}")
    return out


def parse_config_text(text: str, source: str = "config") -> ConfigFile:
    """Parse YAML or JSON text; an empty document is the default config. YAML aliases are refused (the
    format does not need them), as are documents past :func:`nvgpu.yamltext.load`'s limits."""
    try:
        data: Any = yamltext.load(text, source, aliases=False) if text.strip() else {}
    except yamltext.YamlLoadError as e:
        raise ConfigError([f"{e.where or '<root>'}: {e.problem}"], source) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"<root>: must be a mapping (got {type(data).__name__})"], source)
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_problems(e), source) from None


# ---------------------------------------------------------------------------------------------------------
# Resolved config: every value concrete, precedence applied.


@dataclass(frozen=True)
class SharedResource:
    """One resource shared by replicas after normalization."""

    name: str  #: the physical resource (``nvidia.com/gpu`` or ``nvidia.com/mig-1g.10gb``)
    advertised_as: str  #: the resource kubelet sees (``name`` or its rename, e.g. ``nvidia.com/gpu.shared``)
    replicas: int


@dataclass(frozen=True)
class SharingConfig:
    strategy: SharingStrategy = SharingStrategy.NONE
    resources: tuple[SharedResource, ...] = ()
    fail_requests_greater_than_one: bool = False

    def for_resource(self, name: str) -> SharedResource | None:
        for r in self.resources:
            if r.name == name:
                return r
        return None


@dataclass(frozen=True)
class Settings:
    """The plugin's effective settings (NVIDIA's defaults where unset)."""

    mig_strategy: MigStrategy = MigStrategy.NONE
    fail_on_init_error: bool = True
    mps_root: str = ""
    nvidia_driver_root: str = "/"
    nvidia_dev_root: str = "/"
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    pass_device_specs: bool = False
    device_list_strategy: tuple[DeviceListStrategy, ...] = (DeviceListStrategy.ENVVAR,)
    device_id_strategy: DeviceIdStrategy = DeviceIdStrategy.UUID
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    nvidia_ctk_path: str = "/usr/bin/nvidia-ctk"
    container_driver_root: str = "/driver-root"
    shared_devices_allocation_policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED
    sharing: SharingConfig = field(default_factory=SharingConfig)
    imex_channel_ids: tuple[int, ...] = ()
    imex_required: bool = False

    @property
    def only_cdi(self) -> bool:
        return all(s.is_cdi for s in self.device_list_strategy)

    @property
    def uses_cdi(self) -> bool:
        return any(s.is_cdi for s in self.device_list_strategy)


class Overrides(BaseModel):
    """Values from CLI flags or environment variables; ``None`` means unset (the file decides)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mig_strategy: MigStrategy | None = None
    fail_on_init_error: bool | None = None
    mps_root: str | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None
    gdrcopy_enabled: bool | None = None
    gds_enabled: bool | None = None
    mofed_enabled: bool | None = None
    pass_device_specs: bool | None = None
    device_list_strategy: list[DeviceListStrategy] | None = None
    device_id_strategy: DeviceIdStrategy | None = None
    cdi_annotation_prefix: str | None = None
    nvidia_ctk_path: str | None = None
    container_driver_root: str | None = None
    shared_devices_allocation_policy: AllocationPolicy | None = None
    imex_channel_ids: list[int] | None = None
    imex_required: bool | None = None

    @field_validator("device_list_strategy", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v

    @field_validator("imex_channel_ids", mode="before")
    @classmethod
    def _ints(cls, v: object) -> object:
        return [int(s) for s in v.split(",") if s.strip()] if isinstance(v, str) else v


#: Environment variables NVIDIA's plugin reads, mapped to override fields.
ENV_VARS: dict[str, str] = {
    "MIG_STRATEGY": "mig_strategy",
    "FAIL_ON_INIT_ERROR": "fail_on_init_error",
    "MPS_ROOT": "mps_root",
    "NVIDIA_DRIVER_ROOT": "nvidia_driver_root",
    "NVIDIA_DEV_ROOT": "nvidia_dev_root",
    "GDRCOPY_ENABLED": "gdrcopy_enabled",
    "GDS_ENABLED": "gds_enabled",
    "MOFED_ENABLED": "mofed_enabled",
    "PASS_DEVICE_SPECS": "pass_device_specs",
    "DEVICE_LIST_STRATEGY": "device_list_strategy",
    "DEVICE_ID_STRATEGY": "device_id_strategy",
    "CDI_ANNOTATION_PREFIX": "cdi_annotation_prefix",
    "NVIDIA_CTK_PATH": "nvidia_ctk_path",
    "CONTAINER_DRIVER_ROOT": "container_driver_root",
    "SHARED_DEVICES_ALLOCATION_POLICY": "shared_devices_allocation_policy",
    "IMEX_CHANNEL_IDS": "imex_channel_ids",
    "IMEX_REQUIRED": "imex_required",
}


def overrides_from_env(env: Mapping[str, str]) -> Overrides:
    values = {fld: env[var] for var, fld in ENV_VARS.items() if env.get(var, "") != ""}
    try:
        return Overrides.model_validate(values)
    except ValidationError as e:
        by_field = {v: k for k, v in ENV_VARS.items()}
        problems = []
        for p in _problems(e):
            fld, _, rest = p.partition(":")
            problems.append(f"{by_field.get(fld.split('[')[0], fld)}:{rest}")
        raise ConfigError(problems, "environment") from None


def _sharing(cfg: ConfigFile, mig_strategy: MigStrategy, problems: list[str], plugin_checks: bool = True
             ) -> SharingConfig:
    ts, mps = cfg.sharing.time_slicing, cfg.sharing.mps
    if mps is not None and mps.resources:
        strategy, chosen, where = SharingStrategy.MPS, mps, "sharing.mps"
    elif ts is not None and ts.resources:
        strategy, chosen, where = SharingStrategy.TIME_SLICING, ts, "sharing.timeSlicing"
    else:
        return SharingConfig()
    if plugin_checks and strategy is SharingStrategy.MPS and mig_strategy is MigStrategy.MIXED:
        problems.append("sharing.mps: MPS sharing is not supported with migStrategy mixed")
    shared = []
    for i, r in enumerate(chosen.resources):
        if r.devices != "all":
            log.warning("event=config-ignored field=%s[%d].devices reason=only-all-supported", where, i)
        rename = r.rename
        if rename is not None:
            log.warning("event=config-ignored field=%s[%d].rename reason=custom-rename-unsupported", where, i)
            rename = None
        if plugin_checks and strategy is SharingStrategy.MPS and r.name != f"{RESOURCE_PREFIX}/gpu":
            problems.append(f"{where}.resources[{i}].name: MPS sharing only supports nvidia.com/gpu (got {r.name!r})")
        advertised = f"{r.name}.shared" if chosen.rename_by_default else r.name
        shared.append(SharedResource(name=r.name, advertised_as=advertised, replicas=r.replicas))
    fail = chosen.fail_requests_greater_than_one
    if fail is None:
        # NVIDIA forces this on for MPS (one client per replica); time-slicing defaults to off.
        fail = strategy is SharingStrategy.MPS
    return SharingConfig(strategy=strategy, resources=tuple(shared), fail_requests_greater_than_one=fail)


def resolve(cfg: ConfigFile, env: Overrides | None = None, cli: Overrides | None = None, *,
            plugin_checks: bool = True) -> Settings:
    """Apply precedence CLI > env > file > defaults and check the cross-field rules.

    ``plugin_checks=False`` leaves out the rules only the plugin itself enforces at start (MPS with the
    ``mixed`` MIG strategy, MPS on a resource other than ``nvidia.com/gpu``): NVIDIA's GFD reads the very
    same file without them, and so does the labeller.
    """
    f = cfg.flags
    p = f.plugin or PluginFlags()
    from_file: dict[str, Any] = {
        "mig_strategy": f.mig_strategy,
        "fail_on_init_error": f.fail_on_init_error,
        "mps_root": f.mps_root,
        "nvidia_driver_root": f.nvidia_driver_root,
        "nvidia_dev_root": f.nvidia_dev_root,
        "gdrcopy_enabled": f.gdrcopy_enabled,
        "gds_enabled": f.gds_enabled,
        "mofed_enabled": f.mofed_enabled,
        "pass_device_specs": p.pass_device_specs,
        "device_list_strategy": p.device_list_strategy,
        "device_id_strategy": p.device_id_strategy,
        "cdi_annotation_prefix": p.cdi_annotation_prefix,
        "nvidia_ctk_path": p.nvidia_ctk_path,
        "container_driver_root": p.container_driver_root,
        "shared_devices_allocation_policy": p.shared_devices_allocation_policy,
        "imex_channel_ids": cfg.imex.channel_ids or None,
        "imex_required": cfg.imex.required or None,
    }
    merged = dict(from_file)
    for layer in (env, cli):
        if layer is not None:
            for k, v in layer.model_dump(exclude_none=True).items():
                merged[k] = v
    defaults = Settings()
    values = {k: v for k, v in merged.items() if v is not None}
    if "device_list_strategy" in values:
        values["device_list_strategy"] = tuple(DeviceListStrategy(s) for s in values["device_list_strategy"])
    if "imex_channel_ids" in values:
        values["imex_channel_ids"] = tuple(values["imex_channel_ids"])
    if "nvidia_dev_root" not in values:
        values["nvidia_dev_root"] = values.get("nvidia_driver_root", defaults.nvidia_driver_root)
    settings = replace(defaults, **values)
    if cfg.resources is not None and (cfg.resources.gpus or cfg.resources.mig):
        log.warning("event=config-ignored field=resources reason=renaming-disabled-upstream")
    problems: list[str] = []
    sharing = _sharing(cfg, settings.mig_strategy, problems, plugin_checks)
    if sharing.strategy is SharingStrategy.MPS and not settings.mps_root:
        settings = replace(settings, mps_root=DEFAULT_MPS_ROOT)
    if problems:
        raise ConfigError(problems)
    return replace(settings, sharing=sharing)


def load(text: str | None, env: Mapping[str, str] | None = None, cli: Overrides | None = None,
         source: str = "config", *, plugin_checks: bool = True) -> Settings:
    """Parse a config file's text (``None`` = no file) and resolve it against env and CLI overrides."""
    cfg = parse_config_text(text or "", source)
    return resolve(cfg, overrides_from_env(env or {}), cli, plugin_checks=plugin_checks)


def dump_settings(s: Settings) -> str:
    """A stable JSON rendering (for logs and ``--print-config``)."""
    def conv(o: object) -> object:
        if isinstance(o, StrEnum):
            return o.value
        if isinstance(o, tuple | list):
            return [conv(x) for x in o]
        if hasattr(o, "__dataclass_fields__"):
            return {k: conv(getattr(o, k)) for k in o.__dataclass_fields__}
        return o
    return json.dumps(conv(s), sort_keys=True)
