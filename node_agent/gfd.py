"""GPU feature-discovery labels, computed from what NVML reports, in NVIDIA's formats.

A pure function of the inventory, driver versions, MIG profile attributes and sharing settings, so
it is tested from tables. Formats follow NVIDIA's gpu-feature-discovery (k8s-device-plugin v0.20):
products sanitized (``NVIDIA-H100-80GB-HBM3``), memory in MiB, ``-SHARED`` for replicated GPUs,
``nvidia.com/mig-<profile>.*`` per profile with the ``mixed`` strategy and ``nvidia.com/gpu.*``
overridden (or ``-MIG-INVALID``) with ``single``.

Where NVIDIA's docs are silent this module decides: with ``mixed``, ``nvidia.com/gpu.*`` describes
the GPUs whose MIG mode is off (``count=0``, ``replicas=0`` when every GPU is in MIG mode, with the
first GPU's product and memory); MIG resources are never shared (``replicas=1``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from node_agent.nvml import DriverInfo, Gpu, GpuInstanceProfile, MigDevice
from nvgpu.catalogue import family_for_compute_capability

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["time-slicing", "mps"]
GPU = "nvidia.com/gpu"

#: Labels this labeller owns (and so removes when they no longer apply).
OWNED_PREFIXES = ("nvidia.com/gfd.", "nvidia.com/cuda.", "nvidia.com/gpu.", "nvidia.com/mig-", "nvidia.com/vgpu.")
OWNED_KEYS = frozenset({"nvidia.com/mig.capable", "nvidia.com/mig.strategy", "nvidia.com/mps.capable"})
#: ...except these, which belong to the GPU operator / MIG manager flow.
NOT_OWNED_PREFIXES = ("nvidia.com/gpu.deploy.", "nvidia.com/gpu.present")


def owned(key: str) -> bool:
    if key.startswith(NOT_OWNED_PREFIXES):
        return False
    return key in OWNED_KEYS or key.startswith(OWNED_PREFIXES)


@dataclass(frozen=True)
class LabelSettings:
    mig_strategy: MigStrategy = "none"
    replicas: int = 1
    sharing_strategy: SharingStrategy = "time-slicing"
    machine: str | None = None  #: /sys/class/dmi/id/product_name
    gpu_mode: str = "compute"  #: compute | graphics | unknown (from the PCI class)
    timestamp: int | None = None


_INVALID = re.compile(r"[^A-Za-z0-9\-_. ]")


def sanitize(value: str) -> str:
    """GFD's label-value form: drop characters outside ``[A-Za-z0-9-_. ]``, spaces to ``-``, <= 63 chars."""
    out = "-".join(_INVALID.sub("", value).split())
    return out[:63].rstrip("-_.")


def _driver_labels(driver: DriverInfo) -> dict[str, str]:
    parts = driver.driver_version.split(".")
    major, minor = parts[0], parts[1] if len(parts) > 1 else ""
    rev = parts[2] if len(parts) > 2 else ""
    cmaj, cmin = (str(x) for x in driver.cuda_driver_version)
    return {
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": driver.driver_version,
        "nvidia.com/cuda.runtime-version.major": cmaj,
        "nvidia.com/cuda.runtime-version.minor": cmin,
        "nvidia.com/cuda.runtime-version.full": f"{cmaj}.{cmin}",
        # Deprecated spellings GFD still writes.
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime.major": cmaj,
        "nvidia.com/cuda.runtime.minor": cmin,
    }


def _sharing(settings: LabelSettings) -> tuple[int, str]:
    if settings.replicas > 1:
        return settings.replicas, settings.sharing_strategy
    return 1, "none"


def _full_gpu_labels(gpus: Sequence[Gpu], reference: Gpu, settings: LabelSettings) -> dict[str, str]:
    replicas, strategy = _sharing(settings)
    if not gpus:
        replicas = 0
    product = sanitize(reference.name) + ("-SHARED" if replicas > 1 else "")
    major, minor = reference.compute_capability
    return {
        f"{GPU}.product": product,
        f"{GPU}.count": str(len(gpus)),
        f"{GPU}.replicas": str(replicas),
        f"{GPU}.sharing-strategy": strategy,
        f"{GPU}.memory": str(reference.memory_mib),
        f"{GPU}.family": family_for_compute_capability(major, minor),
        f"{GPU}.compute.major": str(major),
        f"{GPU}.compute.minor": str(minor),
    }


def _mig_attributes(prefix: str, dev: MigDevice, profile: GpuInstanceProfile | None) -> dict[str, str]:
    gi_slices = profile.slice_count if profile else 0
    partial = re.match(r"^(\d+)c\.", dev.profile)  # 1c.3g.40gb: a compute instance smaller than its GI
    out = {
        f"{prefix}.memory": str(dev.memory_mib),
        f"{prefix}.multiprocessors": str(dev.multiprocessors),
        f"{prefix}.slices.gi": str(gi_slices),
        f"{prefix}.slices.ci": partial.group(1) if partial else str(gi_slices),
    }
    if profile is not None:
        out |= {
            f"{prefix}.engines.copy": str(profile.copy_engines),
            f"{prefix}.engines.decoder": str(profile.decoders),
            f"{prefix}.engines.encoder": str(profile.encoders),
            f"{prefix}.engines.jpeg": str(profile.jpegs),
            f"{prefix}.engines.ofa": str(profile.ofas),
        }
    return out


def _resource_suffix(profile: str) -> str:
    return profile.replace("+", ".")


def compute_labels(
    gpus: Sequence[Gpu],
    driver: DriverInfo | None,
    profiles: Mapping[int, Sequence[GpuInstanceProfile]],
    settings: LabelSettings,
) -> dict[str, str]:
    """The label set for a node. ``profiles`` maps a GPU index to its GPU-instance profiles."""
    out: dict[str, str] = {}
    if settings.timestamp is not None:
        out["nvidia.com/gfd.timestamp"] = str(settings.timestamp)
    out["nvidia.com/vgpu.present"] = "false"
    if not gpus or driver is None:
        return out
    out |= _driver_labels(driver)
    out["nvidia.com/gpu.machine"] = sanitize(settings.machine or "") or "unknown"
    out["nvidia.com/gpu.mode"] = settings.gpu_mode
    any_mig_enabled = any(g.mig_enabled for g in gpus)
    out["nvidia.com/mig.capable"] = str(any(g.mig_mode is not None for g in gpus)).lower()
    out["nvidia.com/mps.capable"] = str(settings.sharing_strategy == "mps" and settings.replicas > 1
                                        and not any_mig_enabled).lower()

    def profile_of(dev: MigDevice) -> GpuInstanceProfile | None:
        return next((p for p in profiles.get(dev.parent_index, ()) if p.id == dev.gi_profile_id), None)

    strategy = settings.mig_strategy
    if strategy == "none":
        out |= _full_gpu_labels(gpus, gpus[0], settings)
        return out
    out["nvidia.com/mig.strategy"] = strategy
    full = [g for g in gpus if not g.mig_enabled]
    devices = [d for g in gpus for d in g.mig_devices]
    if strategy == "mixed":
        out |= _full_gpu_labels(full, (full or list(gpus))[0], settings)
        by_profile: dict[str, list[MigDevice]] = {}
        for d in devices:
            by_profile.setdefault(d.profile, []).append(d)
        for name, devs in sorted(by_profile.items()):
            prefix = f"nvidia.com/mig-{_resource_suffix(name)}"
            parent = next(g for g in gpus if g.index == devs[0].parent_index)
            out[f"{prefix}.product"] = f"{sanitize(parent.name)}-MIG-{name}"
            out[f"{prefix}.count"] = str(len(devs))
            out[f"{prefix}.replicas"] = "1"
            out[f"{prefix}.sharing-strategy"] = "none"
            out |= _mig_attributes(prefix, devs[0], profile_of(devs[0]))
        return out
    # single: with no GPU in MIG mode it labels like ``none`` (as NVIDIA's GFD does); otherwise every GPU
    # MIG-enabled with at least one device, all devices of one profile, or the labels say MIG-INVALID.
    out |= _full_gpu_labels(list(gpus), gpus[0], settings)
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return out
    valid = (all(g.mig_enabled and g.mig_devices for g in gpus) and len({d.profile for d in devices}) == 1)
    model = sanitize(enabled[0].name)
    if not valid:
        out |= {f"{GPU}.product": f"{model}-MIG-INVALID", f"{GPU}.count": "0", f"{GPU}.replicas": "0",
                f"{GPU}.memory": "0", f"{GPU}.sharing-strategy": ""}
        return out
    replicas, sharing = _sharing(settings)
    out |= {f"{GPU}.product": f"{model}-MIG-{devices[0].profile}" + ("-SHARED" if replicas > 1 else ""),
            f"{GPU}.count": str(len(devices)), f"{GPU}.replicas": str(replicas), f"{GPU}.sharing-strategy": sharing}
    out |= _mig_attributes(GPU, devices[0], profile_of(devices[0]))
    return out


def feature_file(labels: Mapping[str, str]) -> str:
    """NFD's local feature file: one ``key=value`` per line."""
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def label_changes(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """A merge patch that sets ``wanted`` and removes owned labels no longer wanted."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    changes |= {k: None for k in current if owned(k) and k not in wanted}
    return changes
