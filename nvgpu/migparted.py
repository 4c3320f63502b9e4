"""mig-parted's ``version: v1`` config format: the model, the standard sets and validation per GPU model.

The MIG ConfigMap the components render, the file operators pass to ``node_agent mig`` and NVIDIA's
own shipped ``config-default.yaml`` are all this format, so one strict model parses all three. Parsing
follows mig-parted v0.15's rules (``pkg/config/v1``): ``version`` must be ``v1``; every named config
holds at least one entry; an entry needs ``devices`` (``all`` or GPU indices) and ``mig-enabled``;
``mig-devices`` is required when MIG is enabled (``{}`` means enabled but empty), must be empty when
it is disabled, and may not be all zeros; ``device-filter`` is one PCI ID or a list of them, each
``0xDDDDVVVV`` optionally followed by ``:0xSSSSVVVV`` (subsystem); unknown keys are rejected.

Semantic checks against the catalogue (does this layout fit on an H100?) are separate from parsing,
because a valid file may carry layouts for GPUs this project does not know (NVIDIA's file covers
Blackwell parts): :func:`validate_for_model` answers for one declared model, naming the config, the
GPU, the profile and why. :func:`fit_problems` is the project's one MIG layout check built on it: the
stack config runs it on each MIG group's layout, the MigProfile component on the config it renders and
the policy pack on the ConfigMaps and ``nvidia.com/mig.config`` choices it sees, so the three cannot
disagree. Generation of the standard sets uses the same placement search (:mod:`nvgpu.mig`), so a
generated config always validates.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nvgpu import catalogue, yamltext
from nvgpu.catalogue import NVIDIA_PCI_VENDOR, GpuModel
from nvgpu.errortext import MESSAGE_CHARS, capped, clip, path_part, shown
from nvgpu.mig import MigLayoutError, all_profile_layout, balanced_layout, normalize_profile_name, place_layout

VERSION = "v1"
ALL_DISABLED = "all-disabled"
ALL_ENABLED = "all-enabled"
ALL_BALANCED = "all-balanced"
#: mig-parted profile names: ``[<C>c.]<G>g.<GB>gb`` plus ``+attr[,attr]`` or ``-attr`` (me, me.all, gfx).
#: Patterns validate with ``fullmatch``: ``re.match`` with ``$`` also accepts a trailing newline, so
#: ``1g.10gb\n`` passed here and failed on the node.
_PROFILE_RE = re.compile(r"([0-9]+c\.)?[0-9]+g\.[0-9]+gb((\+(me|me\.all|gfx))(,(me|me\.all|gfx))*|-(me|me\.all|gfx))?")
_PCI_ID_RE = re.compile(r"0x([0-9A-Fa-f]{4})([0-9A-Fa-f]{4})(?::0x([0-9A-Fa-f]{4})([0-9A-Fa-f]{4}))?")
#: A config name: a label value (``nvidia.com/mig.config`` selects it).
_CONFIG_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
#: Longest value of a Kubernetes label; the custom-config name must fit (Deckhouse's limit).
_MAX_LABEL = 63
_HASH_LEN = 8


class MigPartedError(ValueError):
    """A config that does not parse, or does not apply to a model; ``problems`` names each path."""

    def __init__(self, problems: Sequence[str]):
        self.problems = capped(list(problems), "mig-parted config")
        super().__init__(clip("; ".join(self.problems), MESSAGE_CHARS))


@dataclass(frozen=True)
class PciFilter:
    """One ``device-filter`` ID: matches device and vendor, and the subsystem too when given."""

    device: int
    vendor: int
    subsystem_device: int | None = None
    subsystem_vendor: int | None = None

    @classmethod
    def parse(cls, text: str) -> PciFilter:
        m = _PCI_ID_RE.fullmatch(text)
        if m is None:
            raise ValueError(
                f"device-filter {shown(text)} is not 0xDDDDVVVV or 0xDDDDVVVV:0xSSSSVVVV (hex device then vendor)"
            )
        sub_dev = int(m.group(3), 16) if m.group(3) else None
        sub_ven = int(m.group(4), 16) if m.group(4) else None
        return cls(int(m.group(1), 16), int(m.group(2), 16), sub_dev, sub_ven)

    def matches(self, device: int, vendor: int = NVIDIA_PCI_VENDOR, subsystem: int | None = None) -> bool:
        """``subsystem`` is NVML's ``pciSubSystemId`` (``0xSSSSVVVV``) when known."""
        if (device, vendor) != (self.device, self.vendor):
            return False
        if self.subsystem_device is None:
            return True
        if subsystem is None:
            return False
        return subsystem == (self.subsystem_device << 16 | (self.subsystem_vendor or 0))


class MigConfigSpec(BaseModel):
    """One entry of a named config: which GPUs, MIG on or off, and which instances."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    device_filter: str | list[str] | None = Field(default=None, alias="device-filter")
    devices: Literal["all"] | list[Annotated[int, Field(ge=0)]]
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, Annotated[int, Field(ge=0)]] | None = Field(default=None, alias="mig-devices")

    @field_validator("device_filter")
    @classmethod
    def _filters(cls, v: str | list[str] | None) -> str | list[str] | None:
        for text in [v] if isinstance(v, str) else v or []:
            PciFilter.parse(text)
        if isinstance(v, list) and not v:
            raise ValueError("device-filter list is empty; omit the key to match every GPU")
        return v

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, v: Any) -> Any:
        if isinstance(v, str) and v != "all":
            raise ValueError(f"devices must be 'all' or a list of GPU indices, got {shown(v)}")
        if isinstance(v, list):
            if not v:
                raise ValueError("devices list is empty; use 'all' or list GPU indices")
            bad = [i for i in v if isinstance(i, bool) or not isinstance(i, int)]
            if bad:
                raise ValueError(f"devices must be 'all' or a list of GPU indices (integers), got {shown(bad[0])}")
            seen: set[int] = set()
            for i in v:
                if i in seen:
                    raise ValueError(f"devices lists GPU index {shown(i)} twice")
                seen.add(i)
        return v

    @field_validator("mig_devices")
    @classmethod
    def _profiles(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        for name in v or {}:
            if not _PROFILE_RE.fullmatch(name):
                raise ValueError(
                    f"mig-devices profile {shown(name)} is not a MIG profile name like 1g.10gb, 1g.10gb+me or "
                    "1c.2g.20gb"
                )
        return v

    @model_validator(mode="after")
    def _enabled(self) -> MigConfigSpec:
        if self.mig_enabled and self.mig_devices is None:
            raise ValueError("mig-devices is required when mig-enabled is true (use {} for no instances)")
        if not self.mig_enabled and self.mig_devices:
            raise ValueError("mig-devices must be empty when mig-enabled is false")
        if self.mig_devices and all(c == 0 for c in self.mig_devices.values()):
            raise ValueError("mig-devices counts are all zero; use {} for MIG enabled without instances")
        return self

    @property
    def filters(self) -> tuple[PciFilter, ...]:
        if self.device_filter is None:
            return ()
        texts = [self.device_filter] if isinstance(self.device_filter, str) else self.device_filter
        return tuple(PciFilter.parse(t) for t in texts)

    @property
    def layout(self) -> dict[str, int]:
        """The instances to create, zero counts dropped."""
        return {p: c for p, c in (self.mig_devices or {}).items() if c}

    def matches(
        self, index: int, pci_device: int, vendor: int = NVIDIA_PCI_VENDOR, subsystem: int | None = None
    ) -> bool:
        """Does this entry select GPU ``index`` with PCI device ID ``pci_device``?"""
        if self.devices != "all" and index not in self.devices:
            return False
        fs = self.filters
        return not fs or any(f.matches(pci_device, vendor, subsystem) for f in fs)

    def matches_model(self, model: GpuModel) -> bool:
        fs = self.filters
        return not fs or any(f.matches(d) for f in fs for d in model.pci_device_ids)

    def to_yaml_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class MigPartedConfig(BaseModel):
    """A whole file: ``version: v1`` and ``mig-configs: {name: [entry, ...]}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    version: Literal["v1"]
    mig_configs: dict[str, Annotated[list[MigConfigSpec], Field(min_length=1)]] = Field(alias="mig-configs")

    @field_validator("mig_configs")
    @classmethod
    def _names(cls, v: dict[str, list[MigConfigSpec]]) -> dict[str, list[MigConfigSpec]]:
        for name in v:
            if len(name) > _MAX_LABEL or not _CONFIG_NAME_RE.fullmatch(name):
                raise ValueError(f"config name {shown(name)} is not usable as a label value (nvidia.com/mig.config): "
                                 f"at most {_MAX_LABEL} letters, digits, '-', '_' or '.', starting and ending with a "
                                 "letter or digit")
        return v

    def get(self, name: str) -> list[MigConfigSpec]:
        try:
            return self.mig_configs[name]
        except KeyError:
            raise MigPartedError(
                [f"unknown MIG config {shown(name)}; the config defines: "
                 + clip(", ".join(sorted(self.mig_configs)), 300)]
            ) from None

    def to_yaml_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "mig-configs": {n: [s.to_yaml_dict() for s in specs] for n, specs in self.mig_configs.items()},
        }

    def to_yaml(self) -> str:
        # The text ``yaml.safe_dump(..., sort_keys=False)`` writes (single quotes included), several times faster.
        return yamltext.dump(self.to_yaml_dict(), single_quotes=True)


#: pydantic's names for the members of a union, which are no part of a config path.
_UNION_MEMBERS = ("function-after", "function-before", "str", "list[str]", "list[int]", "literal['all']",
                  "list[constrained-int]")


def _problems(err: ValidationError, source: str) -> list[str]:
    """One ``<source>: <path>: <why> (got <value>)`` line per error, each bounded (a 5,000-digit integer,
    a 1 MiB string or a key with a newline is shown cut, never written out or failing to be)."""
    out = []
    for e in err.errors(include_url=False):
        # mig-parted's own spelling of a path: ``mig-configs.x.0.devices`` (an index too large to write
        # is described).
        path = ".".join(shown(p) if isinstance(p, int) else path_part(p) for p in e["loc"] if p not in _UNION_MEMBERS)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "literal_error" and e["loc"] == ("version",):
            msg = f"version must be {VERSION!r}"
        got = e.get("input")
        value_error = e["type"] == "value_error"
        shown_value = "" if value_error or e["type"] == "missing" or isinstance(got, dict | list) \
            else f" (got {shown(got)})"
        out.append(clip(f"{source}: {path or '<root>'}: {clip(msg)}{shown_value}"))
    return out


def parse_config(data: Mapping[str, Any] | None, source: str = "mig-parted config") -> MigPartedConfig:
    """Validate a decoded document; an empty document is an empty config, as in mig-parted."""
    if not data:
        return MigPartedConfig(version=VERSION, mig_configs={})
    if not isinstance(data, Mapping):
        raise MigPartedError([f"{source}: <root>: expected a mapping with version and mig-configs (got {shown(data)})"])
    try:
        return MigPartedConfig.model_validate(dict(data))
    except ValidationError as e:
        raise MigPartedError(_problems(e, source)) from None


def load_config_text(text: str, source: str = "mig-parted config") -> MigPartedConfig:
    """Parse a mig-parted config file's text.

    YAML aliases are refused: mig-parted's format has no use for them (NVIDIA's own file has none), and
    a 523-byte alias bomb expanded to gigabytes here (:func:`nvgpu.yamltext.load` also bounds the size,
    the nesting and the integers).
    """
    try:
        data = yamltext.load(text, source, aliases=False)
    except yamltext.YamlLoadError as e:
        raise MigPartedError([f"{source}: {e.where or '<root>'}: {e.problem}"]) from None
    return parse_config(data, source)


# --- validation against a model -------------------------------------------------------------------


def validate_for_model(
    config: MigPartedConfig, name: str, model: GpuModel
) -> list[tuple[MigConfigSpec, dict[str, int]]]:
    """Check that config ``name`` applies to ``model`` and every matching entry can be placed.

    Returns the matching entries with their layouts. Raises :class:`MigPartedError` when the config is
    unknown, when no entry selects this model (a layout for another GPU), or when a layout does not fit,
    naming the config, the GPU, the profile and why.
    """
    hint = _standard_name_hint(name, model)
    if hint and name not in config.mig_configs:
        raise MigPartedError([f"unknown MIG config {shown(name)}: {hint}"])
    specs = config.get(name)
    matching = [s for s in specs if s.matches_model(model)]
    if not matching:
        why = hint or "its device-filters select other GPUs"
        raise MigPartedError([f"MIG config {shown(name)} has no entry for the {model.key} ({why})"])
    problems: list[str] = []
    out: list[tuple[MigConfigSpec, dict[str, int]]] = []
    for spec in matching:
        gpus = "every GPU" if spec.devices == "all" else "GPU " + clip(",".join(shown(i) for i in spec.devices), 120)
        if not spec.mig_enabled:
            out.append((spec, {}))
            continue
        if model.mig is None:
            problems.append(f"MIG config {shown(name)}: {gpus}: the {model.key} does not support MIG")
            continue
        try:
            place_layout(model, spec.layout, gpu=f"MIG config {shown(name)}: {gpus}")
        except MigLayoutError as e:
            problems.append(str(e))
            continue
        out.append((spec, spec.layout))
    if problems:
        raise MigPartedError(problems)
    return out


def _standard_name_hint(name: str, model: GpuModel) -> str | None:
    """Why a standard-looking name (``all-<profile>``) cannot mean anything on ``model``, when it cannot.

    A layout written as ``partedConfig: all-1g.5gb`` for an H100 is a profile of another GPU: saying so,
    with the profiles the model has, beats "no entry for the H100-80GB".
    """
    if not name.startswith("all-") or name in (ALL_DISABLED, ALL_ENABLED):
        return None
    if model.mig is None:
        return f"the {model.key} does not support MIG"
    if name == ALL_BALANCED:
        return None
    profile = name.removeprefix("all-")
    if model.mig.profile(normalize_profile_name(profile)) is not None:
        return None
    return f"profile {shown(profile)} is unknown for {model.key}; allowed: {', '.join(model.mig.profile_names)}"


def fit_problems(config: MigPartedConfig, name: str, model: GpuModel | None, *, chosen: bool = True) -> list[str]:
    """Why config ``name`` cannot be applied to the GPUs it is for, one problem per line; empty when it can.

    With ``model`` (the GPU declared for the nodes) this is :func:`validate_for_model`: the config exists,
    has an entry for the model, and every such entry's layout can be placed (profile known, instance
    counts, compute and memory slices, one media extension, a legal placement). Without a model, every
    catalogue model an entry's ``device-filter`` selects must hold it, and entries without a filter must
    use profiles some catalogue GPU has.

    ``chosen`` says nodes are told to apply the config (a group's ``nvidia.com/mig.config``), not merely
    that a file defines it: with no declared model a chosen config must also fit at least one catalogue
    GPU, since nothing else can be verified before the nodes try. A defined config aimed only at GPUs the
    catalogue does not know (NVIDIA's file covers Blackwell parts) is left to mig-parted on the node.
    """
    try:
        if model is not None:
            validate_for_model(config, name, model)
            return []
        specs = config.get(name)
    except MigPartedError as e:
        return list(e.problems)
    targets = [m for m in catalogue.MODELS if any(s.filters and s.matches_model(m) for s in specs)]
    problems = [p for m in targets for p in fit_problems(config, name, m)]
    if not targets and any(not s.filters for s in specs):
        known = {p for m in catalogue.MODELS if m.mig for p in m.mig.profile_names}
        problems += [
            f"MIG config {shown(name)}: profile {shown(profile)} is not a MIG profile of any catalogue GPU"
            for s in specs if not s.filters
            for profile in s.layout if normalize_profile_name(profile) not in known
        ]
    if chosen and not problems and not models_for_config(config, name):
        problems.append(f"MIG config {shown(name)} fits none of the catalogue's GPU models")
    return problems


def models_for_config(config: MigPartedConfig, name: str) -> tuple[GpuModel, ...]:
    """Catalogue models on which config ``name`` validates (used to check NVIDIA's shipped file)."""
    ok = []
    for model in catalogue.MODELS:
        try:
            validate_for_model(config, name, model)
        except MigPartedError:
            continue
        ok.append(model)
    return tuple(ok)


# --- generation -------------------------------------------------------------------------------------


def mig_models(models: Iterable[GpuModel] | None = None) -> tuple[GpuModel, ...]:
    return tuple(m for m in (catalogue.MODELS if models is None else models) if m.mig is not None)


def config_name_for_profile(profile: str) -> str:
    """``all-<profile>`` with ``+`` spelled ``.`` as in NVIDIA's file (``all-1g.10gb.me``)."""
    return "all-" + profile.replace("+", ".")


def standard_configs(models: Iterable[GpuModel] | None = None) -> dict[str, list[MigConfigSpec]]:
    """``all-disabled``, ``all-enabled``, ``all-<profile>`` and ``all-balanced`` for each MIG model.

    Per-model entries carry the model's PCI IDs as ``device-filter``, so one name (``all-1g.10gb``) can
    mean 7 instances on an H100 and 4 on an A100-40GB, exactly as NVIDIA's shipped file does.
    """
    out: dict[str, list[MigConfigSpec]] = {
        ALL_DISABLED: [MigConfigSpec(devices="all", mig_enabled=False)],
        ALL_ENABLED: [MigConfigSpec(devices="all", mig_enabled=True, mig_devices={})],
    }
    for model in mig_models(models):
        assert model.mig is not None
        filters = list(model.mig_parted_filters)
        for profile in model.mig.profiles:
            layout = all_profile_layout(model, profile.name)
            out.setdefault(config_name_for_profile(profile.name), []).append(
                MigConfigSpec(device_filter=filters, devices="all", mig_enabled=True, mig_devices=layout)
            )
        out.setdefault(ALL_BALANCED, []).append(
            MigConfigSpec(device_filter=filters, devices="all", mig_enabled=True, mig_devices=balanced_layout(model))
        )
    return out


@dataclass(frozen=True)
class CustomSlice:
    profile: str
    count: int = 1


@dataclass(frozen=True)
class CustomGpuLayout:
    """One GPU of a Deckhouse-style custom layout (``mig.customConfigs[]``)."""

    index: int
    slices: tuple[CustomSlice, ...]

    @property
    def layout(self) -> dict[str, int]:
        """``{profile: count}`` in mig-parted's spelling (``1g.10gb.me`` becomes ``1g.10gb+me``, as
        :func:`nvgpu.mig.normalize_profile_name` accepts both), counts of a profile listed twice summed."""
        out: dict[str, int] = {}
        for s in self.slices:
            profile = normalize_profile_name(s.profile)
            out[profile] = out.get(profile, 0) + s.count
        return out


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_LEN]


def custom_config_name(node_group: str, layouts: Sequence[CustomGpuLayout]) -> str:
    """Deckhouse's name for a custom layout: ``custom-<ng>-<8 hex of sha256(JSON)>``.

    The JSON is Go's ``json.Marshal`` of the configs sorted by index with slices sorted by profile and
    counts defaulted to 1 (``hooks/gpu/mig_custom_config_name.go``), so the same layout gets the same
    name as on a Deckhouse cluster. Long node-group names are cut to a prefix plus their own hash so the
    name fits a label value.
    """
    if not layouts:
        raise ValueError("a custom MIG layout needs at least one GPU")
    norm = [
        {"index": g.index, "slices": [{"profile": s.profile, "count": s.count} for s in sorted(g.slices, key=_by_prof)]}
        for g in sorted(layouts, key=lambda g: g.index)
    ]
    digest = _short_hash(json.dumps(norm, separators=(",", ":")))
    available = _MAX_LABEL - len("custom-") - 1 - _HASH_LEN
    name_part = node_group
    if len(node_group) > available:
        prefix = max(1, available - (_HASH_LEN + 1))
        name_part = f"{node_group[:prefix]}-{_short_hash(node_group)}"
    return f"custom-{name_part}-{digest}"


def _by_prof(s: CustomSlice) -> str:
    return s.profile


def custom_specs(layouts: Sequence[CustomGpuLayout], model: GpuModel | None = None) -> list[MigConfigSpec]:
    """mig-parted entries for a per-GPU-index layout (GPUs not listed are left as they are).

    A slice whose profile is not even spelled like one is a :class:`MigPartedError` naming the GPU, as
    every other layout problem is, rather than a bare pydantic error.
    """
    filters = list(model.mig_parted_filters) if model is not None else None
    out = []
    for g in sorted(layouts, key=lambda g: g.index):
        try:
            out.append(MigConfigSpec(device_filter=filters, devices=[g.index], mig_enabled=True, mig_devices=g.layout))
        except ValidationError as e:
            raise MigPartedError(_problems(e, f"GPU {g.index}")) from None
    return out


def build_config(
    models: Iterable[GpuModel] | None = None,
    custom: Mapping[str, Sequence[MigConfigSpec]] | None = None,
) -> MigPartedConfig:
    """The standard sets for ``models`` plus named custom configs; a name clash is an error."""
    configs = standard_configs(models)
    for name, specs in (custom or {}).items():
        if name in configs:
            raise MigPartedError([f"custom MIG config {shown(name)} clashes with a standard config of that name"])
        configs[name] = list(specs)
    try:
        return MigPartedConfig(version=VERSION, mig_configs=configs)
    except ValidationError as e:
        raise MigPartedError(_problems(e, "generated MIG config")) from None
