"""ResourceClaims as the driver reads them, and the checks made before preparing anything.

The kubelet sends only ``namespace/name/uid``; the driver fetches the claim and refuses to prepare it
unless it is allocated, its UID is the one the kubelet asked for (a different UID means the claim was
deleted and re-created), and every device allocated for this driver lives in this node's pool and is one
this driver publishes. The API server is trusted for shape, so unknown fields are ignored here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ClaimError(ValueError):
    """The claim cannot be prepared on this node; the message says why."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class _Meta(_Lenient):
    name: str = ""
    namespace: str = ""
    uid: str = ""


class DeviceResult(_Lenient):
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = Field(default=None, alias="adminAccess")
    share_id: str | None = Field(default=None, alias="shareID")


class _AllocatedDevices(_Lenient):
    results: list[DeviceResult] = []
    config: list[dict[str, Any]] = []


class _Allocation(_Lenient):
    devices: _AllocatedDevices | None = None


class _Status(_Lenient):
    allocation: _Allocation | None = None


class _Claim(_Lenient):
    metadata: _Meta = _Meta()
    status: _Status = _Status()


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet tells the driver about a claim."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class AllocatedClaim:
    """The parts of an allocated claim this driver acts on."""

    ref: ClaimRef
    results: tuple[DeviceResult, ...]
    configs: tuple[Mapping[str, Any], ...]


def parse_claim(raw: Mapping[str, Any], ref: ClaimRef, *, driver: str, pool: str,
                known_devices: set[str]) -> AllocatedClaim:
    """Validate a fetched claim against the kubelet's reference and this node's devices."""
    try:
        claim = _Claim.model_validate(dict(raw))
    except ValidationError as e:
        raise ClaimError(f"claim {ref}: unreadable ResourceClaim: {e.errors(include_url=False)[0]['msg']}") from None
    if claim.metadata.uid != ref.uid:
        raise ClaimError(f"claim {ref}: UID is {claim.metadata.uid or 'unset'}, expected {ref.uid} "
                         "(the claim was replaced)")
    allocation = claim.status.allocation
    if allocation is None or allocation.devices is None:
        raise ClaimError(f"claim {ref}: not allocated")
    mine = tuple(r for r in allocation.devices.results if r.driver == driver)
    if not mine:
        raise ClaimError(f"claim {ref}: no device is allocated from driver {driver}")
    for r in mine:
        if r.pool != pool:
            raise ClaimError(f"claim {ref}: device {r.device} is in pool {r.pool}, not this node's pool {pool}")
        if r.device not in known_devices:
            raise ClaimError(f"claim {ref}: device {r.device} is not published by this node "
                             "(unknown, unhealthy or reconfigured)")
    return AllocatedClaim(ref=ref, results=mine, configs=tuple(allocation.devices.config))
