"""GPU identities and catalogue lookups for the builders of made-up GPUs (device plugin, DRA).

Each builder makes the production type its component consumes (the device plugin's ``Gpu``, the DRA
plugin's ``GpuInfo``), but they name GPUs alike: a UUID as NVML spells one, a PCI address as NVML or sysfs
spells it, and a MIG profile that must exist on the model. Said once here, so a made-up GPU looks like one
wherever it appears.
"""

from __future__ import annotations

import uuid
import zlib

from nvgpu import catalogue

#: RFC 4122 version-4 and variant bits: UUIDs built on :func:`machine_base` look like the random ones real
#: GPUs report.
_V4_BITS = (0x4000 << 64) | (0x8000 << 48)


def machine_base(machine: str) -> int:
    """A UUID base of its own for each machine name (its CRC-32 in the first group), with the version-4
    bits set: GPUs of different made-up machines never share a UUID."""
    return (zlib.crc32(machine.encode()) << 96) | _V4_BITS


def gpu_uuid(index: int, *, base: int = 0, kind: str = "GPU") -> str:
    """NVML's spelling of a UUID (``GPU-…``, or ``MIG-…`` for a MIG device): ``base + index`` as a UUID."""
    return f"{kind}-{uuid.UUID(int=base + index)}"


def nvml_bus_id(bus: int) -> str:
    """A PCI address as NVML reports it: 8-digit domain, upper-case hex (``00000000:07:00.0``)."""
    return f"00000000:{bus:02X}:00.0"


def sysfs_address(bus: int) -> str:
    """A PCI address as sysfs names it (and Kubernetes' ``pciBusID``): ``0000:07:00.0``."""
    return f"0000:{bus:02x}:00.0"


def mig_profile(model: catalogue.GpuModel, name: str) -> catalogue.MigProfile:
    """The model's MIG profile ``name``; a made-up GPU with a profile its model lacks is a broken test."""
    assert model.mig is not None, f"{model.product_names[0]} has no MIG"
    profile = model.mig.profile(name)
    assert profile is not None, f"{model.product_names[0]} has no MIG profile {name}"
    return profile
