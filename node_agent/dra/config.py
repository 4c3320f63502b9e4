"""Opaque per-claim device configuration: NVIDIA's ``resource.nvidia.com/v1beta1`` config kinds.

Claims and DeviceClasses carry ``opaque.parameters`` for this driver; they are user input, so they are
decoded strictly (unknown fields rejected, errors naming the field and the allowed values), then
normalised (defaults filled in) and validated. Kinds: ``GpuConfig`` for full GPUs, ``MigDeviceConfig`` for
MIG devices, ``VfioDeviceConfig`` for passthrough; a kind that does not match the device type is refused.

Precedence follows NVIDIA's driver: built-in defaults < ``FromClass`` < ``FromClaim``; within a level a later
config wins, and a config naming the request beats one with an empty ``requests`` list. Configs for other
drivers are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from node_agent.dra.devices import DeviceKind

API_VERSION = "resource.nvidia.com/v1beta1"

_BINARY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_DECIMAL_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


class ConfigError(ValueError):
    """An opaque config that cannot be used; the message names the field and what is allowed."""


def parse_quantity(text: str | int) -> int:
    """A Kubernetes quantity (``10Gi``, ``512M``, ``1073741824``) in bytes; fractions are refused."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError("must not be negative")
        return text
    s = str(text).strip()
    for table in (_BINARY_SUFFIX, _DECIMAL_SUFFIX):
        for suffix, mult in sorted(table.items(), key=lambda kv: -len(kv[0])):
            if suffix and s.endswith(suffix):
                number = s[: -len(suffix)]
            elif not suffix:
                number = s
            else:
                continue
            if number.isdigit():
                return int(number) * mult
    raise ValueError(f"{text!r} is not a whole quantity like 10Gi, 512Mi or 1073741824")


class Strategy(StrEnum):
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class TimeSliceInterval(StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"

    @property
    def level(self) -> int:
        """``nvidia-smi compute-policy --set-timeslice`` level."""
        return {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}[self.value]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TimeSlicingConfig(_Strict):
    interval: TimeSliceInterval = TimeSliceInterval.DEFAULT


class MpsConfig(_Strict):
    default_active_thread_percentage: Annotated[int | None, Field(alias="defaultActiveThreadPercentage", ge=0,
                                                                  le=100)] = None
    default_pinned_device_memory_limit: Annotated[str | None, Field(alias="defaultPinnedDeviceMemoryLimit")] = None
    default_per_device_pinned_memory_limit: Annotated[
        dict[str, str] | None, Field(alias="defaultPerDevicePinnedMemoryLimit")
    ] = None

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None:
            parse_quantity(v)
        return v

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _quantities(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for key, q in (v or {}).items():
            try:
                parse_quantity(q)
            except ValueError as e:
                raise ValueError(f"[{key}]: {e}") from None
        return v

    def pinned_limits_mib(self, uuids: Sequence[str]) -> dict[int, int]:
        """Per-visible-device pinned memory limit in MiB (index within the claim's devices -> MiB)."""
        out: dict[int, int] = {}
        if self.default_pinned_device_memory_limit is not None:
            for i in range(len(uuids)):
                out[i] = parse_quantity(self.default_pinned_device_memory_limit) // 2**20
        for key, q in (self.default_per_device_pinned_memory_limit or {}).items():
            index = uuids.index(key) if key in uuids else (int(key) if key.isdigit() else -1)
            if not 0 <= index < len(uuids):
                raise ConfigError(
                    f"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: {key!r} is neither an index below "
                    f"{len(uuids)} nor the UUID of an allocated device"
                )
            out[index] = parse_quantity(q) // 2**20
        return out


class GpuSharing(_Strict):
    strategy: Strategy
    time_slicing_config: Annotated[TimeSlicingConfig | None, Field(alias="timeSlicingConfig")] = None
    mps_config: Annotated[MpsConfig | None, Field(alias="mpsConfig")] = None

    def normalized(self) -> GpuSharing:
        if self.strategy is Strategy.TIME_SLICING:
            if self.mps_config is not None:
                raise ConfigError("sharing.mpsConfig is only allowed with strategy MPS")
            return self.model_copy(update={"time_slicing_config": self.time_slicing_config or TimeSlicingConfig()})
        if self.time_slicing_config is not None:
            raise ConfigError("sharing.timeSlicingConfig is only allowed with strategy TimeSlicing")
        return self.model_copy(update={"mps_config": self.mps_config or MpsConfig()})


class MigSharing(_Strict):
    strategy: Strategy
    mps_config: Annotated[MpsConfig | None, Field(alias="mpsConfig")] = None

    def normalized(self) -> GpuSharing:
        if self.strategy is Strategy.TIME_SLICING and self.mps_config is not None:
            raise ConfigError("sharing.mpsConfig is only allowed with strategy MPS")
        mps = (self.mps_config or MpsConfig()) if self.strategy is Strategy.MPS else None
        return GpuSharing(strategy=self.strategy, mps_config=mps)


class GpuConfig(_Strict):
    api_version: Annotated[Literal["resource.nvidia.com/v1beta1"], Field(alias="apiVersion")]
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None


class MigDeviceConfig(_Strict):
    api_version: Annotated[Literal["resource.nvidia.com/v1beta1"], Field(alias="apiVersion")]
    kind: Literal["MigDeviceConfig"]
    sharing: MigSharing | None = None


class VfioDeviceConfig(_Strict):
    api_version: Annotated[Literal["resource.nvidia.com/v1beta1"], Field(alias="apiVersion")]
    kind: Literal["VfioDeviceConfig"]


_KINDS: dict[str, type[GpuConfig | MigDeviceConfig | VfioDeviceConfig]] = {
    "GpuConfig": GpuConfig, "MigDeviceConfig": MigDeviceConfig, "VfioDeviceConfig": VfioDeviceConfig,
}
_KIND_FOR_DEVICE = {DeviceKind.GPU: "GpuConfig", DeviceKind.MIG: "MigDeviceConfig", DeviceKind.VFIO: "VfioDeviceConfig"}

AnyConfig = GpuConfig | MigDeviceConfig | VfioDeviceConfig


def _format(err: ValidationError, where: str) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            parts.append(f"{where}.{loc}: unknown field")
        elif e["type"] == "literal_error":
            parts.append(f"{where}.{loc}: {e['msg']}")
        elif e["type"] == "enum":
            parts.append(f"{where}.{loc}: allowed: {e.get('ctx', {}).get('expected', '')} (got {e.get('input')!r})")
        else:
            parts.append(f"{where}.{loc}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def decode(parameters: Any, where: str = "parameters") -> AnyConfig:
    """Strictly decode one opaque parameters object."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}: expected an object with apiVersion and kind")
    if parameters.get("apiVersion") != API_VERSION:
        raise ConfigError(f"{where}.apiVersion: must be {API_VERSION} (got {parameters.get('apiVersion')!r})")
    kind = parameters.get("kind")
    model = _KINDS.get(str(kind))
    if model is None:
        raise ConfigError(f"{where}.kind: allowed: {', '.join(_KINDS)} (got {kind!r})")
    try:
        cfg = model.model_validate(dict(parameters))
    except ValidationError as e:
        raise ConfigError(_format(e, where)) from None
    if not isinstance(cfg, VfioDeviceConfig) and cfg.sharing is not None:
        cfg.sharing.normalized()
    return cfg


def default_for(kind: DeviceKind) -> AnyConfig:
    if kind is DeviceKind.GPU:
        return GpuConfig(api_version=API_VERSION, kind="GpuConfig")
    if kind is DeviceKind.MIG:
        return MigDeviceConfig(api_version=API_VERSION, kind="MigDeviceConfig")
    return VfioDeviceConfig(api_version=API_VERSION, kind="VfioDeviceConfig")


def effective_sharing(cfg: AnyConfig) -> GpuSharing | None:
    if isinstance(cfg, VfioDeviceConfig) or cfg.sharing is None:
        return None
    return cfg.sharing.normalized()


def _matches(requests: Sequence[str], request: str) -> bool:
    base = request.split("/", 1)[0]
    return request in requests or base in requests


def resolve(configs: Sequence[Mapping[str, Any]], driver: str, request: str, kind: DeviceKind) -> AnyConfig:
    """The config that applies to one allocated device (``status.allocation.devices.config`` entries)."""
    ranked: list[tuple[int, int, int, Mapping[str, Any]]] = []
    for position, entry in enumerate(configs):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        requests = list(entry.get("requests") or [])
        if requests and not _matches(requests, request):
            continue
        level = 1 if entry.get("source") == "FromClaim" else 0
        ranked.append((level, 1 if requests else 0, position, entry))
    chosen: AnyConfig = default_for(kind)
    for level, _specific, position, entry in sorted(ranked, key=lambda r: r[:3]):
        where = f"{'claim' if level else 'class'} config[{position}].opaque.parameters"
        chosen = decode((entry.get("opaque") or {}).get("parameters"), where)
    expected = _KIND_FOR_DEVICE[kind]
    if chosen.kind != expected:
        raise ConfigError(f"request {request!r}: config kind {chosen.kind} does not apply to a {kind.value} device; "
                          f"use {expected}")
    return chosen
