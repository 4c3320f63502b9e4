"""GPU feature-discovery labels, computed from what NVML reports, in NVIDIA's formats.

A pure function of the inventory, driver versions, MIG profile attributes and sharing settings, so
it is tested from tables. Formats follow NVIDIA's gpu-feature-discovery (k8s-device-plugin v0.20):
products sanitized (``NVIDIA-H100-80GB-HBM3``), memory in MiB, ``-SHARED`` for replicated GPUs,
``nvidia.com/mig-<profile>.*`` per profile with the ``mixed`` strategy and ``nvidia.com/gpu.*``
overridden (or ``-MIG-INVALID``) with ``single``.

Sharing is per resource, as NVIDIA's ``internal/lm/resource.go`` reads the device plugin's config:
a resource the config replicates gets its replicas, the config's strategy and ``-SHARED`` (unless
``renameByDefault`` advertises it as ``<resource>.shared``); every other resource ``replicas=1``,
``none``. ``nvidia.com/gpu.clique`` is ``<cluster UUID>.<clique ID>`` of the GPUs attached to an
NVLink fabric when they all agree (``internal/lm/imex.go``); the ``nvidia.com/vgpu.*`` labels come from
the PCI config space (``node_agent.host.vgpu``) and are left out when it could not be read.

``nvidia.com/gpu.*`` is counted over every GPU under every strategy, MIG mode or not, as NVIDIA's
``internal/lm/mig-strategy.go`` does (checked against its binary on MIG layouts): GPUs that are all in
MIG mode get ``replicas=0`` and no sharing. Where NVIDIA fails the run, this module decides: with MPS on
a node with a GPU in MIG mode ``mps.capable`` is ``false`` (NVIDIA's GFD fails the whole run there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from node_agent.host.vgpu import VgpuDevice
from node_agent.nvml import DriverInfo, FabricInfo, Gpu, GpuInstanceProfile, MigDevice
from nvgpu.catalogue import family_for_compute_capability

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["time-slicing", "mps"]
GPU = "nvidia.com/gpu"
#: When the labels last changed (NVIDIA's GFD: when it last ran); see :func:`label_changes`.
TIMESTAMP = "nvidia.com/gfd.timestamp"

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
class SharedResource:
    """One resource the device plugin shares by replicas (from its config's ``sharing`` section)."""

    name: str  #: ``nvidia.com/gpu`` or ``nvidia.com/mig-1g.10gb``
    replicas: int
    #: Advertised as ``<name>.shared`` (``renameByDefault``): GFD then leaves ``-SHARED`` off the product.
    renamed: bool = False


@dataclass(frozen=True)
class LabelSettings:
    mig_strategy: MigStrategy = "none"
    #: The sharing strategy of the resources in ``shared`` (one per config: time-slicing or MPS).
    sharing_strategy: SharingStrategy = "time-slicing"
    shared: tuple[SharedResource, ...] = ()
    machine: str | None = None  #: /sys/class/dmi/id/product_name
    gpu_mode: str = "compute"  #: compute | graphics | unknown (from the PCI class)
    timestamp: int | None = None
    clique: str | None = None  #: ``nvidia.com/gpu.clique`` (see :func:`fabric_clique`)
    #: vGPUs found in the PCI config space; None when it could not be read (no ``vgpu.*`` label then).
    vgpu: tuple[VgpuDevice, ...] | None = ()

    def sharing_of(self, resource: str) -> tuple[int, str, bool]:
        """(replicas, sharing-strategy label, ``-SHARED`` suffix) of ``resource``."""
        r = next((s for s in self.shared if s.name == resource), None)
        if r is None or r.replicas <= 1:
            return 1, "none", False
        return r.replicas, self.sharing_strategy, not r.renamed

    @property
    def any_shared(self) -> bool:
        return any(s.replicas > 1 for s in self.shared)


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


def fabric_clique(fabric: Mapping[int, FabricInfo | None]) -> tuple[str | None, str | None]:
    """``nvidia.com/gpu.clique`` and, when it is left out for disagreement, why (NVIDIA logs a warning).

    NVIDIA's ``getFabricIDs``: only GPUs attached to a fabric count (registration completed and
    successful, a cluster UUID); with none there is no label; with more than one cluster UUID, or more
    than one clique ID among them, there is none either. Otherwise ``<cluster UUID>.<clique ID>``.
    ``fabric`` maps each GPU's index to its fabric info (None: not in a fabric).
    """
    attached = [(i, f) for i, f in sorted(fabric.items()) if f is not None and f.attached]
    clusters: dict[str, list[int]] = {}
    cliques: dict[str, list[int]] = {}
    for i, f in attached:
        clusters.setdefault(f.cluster_uuid, []).append(i)
        cliques.setdefault(str(f.clique_id), []).append(i)
    if len(clusters) > 1:
        return None, f"no nvidia.com/gpu.clique: the GPUs are in different NVLink fabric clusters ({_by(clusters)})"
    if len(cliques) > 1:
        return None, f"no nvidia.com/gpu.clique: the GPUs are in different NVLink cliques ({_by(cliques)})"
    if not attached:
        return None, None
    return f"{next(iter(clusters))}.{next(iter(cliques))}", None


def _by(groups: Mapping[str, list[int]]) -> str:
    return "; ".join(f"{key}: GPU {','.join(map(str, gpus))}" for key, gpus in groups.items())


def vgpu_labels(devices: Sequence[VgpuDevice] | None) -> dict[str, str]:
    """NVIDIA's vGPU labeller: ``present`` true|false, and the host driver of the last vGPU when there is one."""
    if devices is None:
        return {}
    out = {"nvidia.com/vgpu.present": str(bool(devices)).lower()}
    for d in devices:
        out["nvidia.com/vgpu.host-driver-version"] = d.host_driver_version
        out["nvidia.com/vgpu.host-driver-branch"] = d.host_driver_branch
    return out


def _full_gpu_labels(gpus: Sequence[Gpu], settings: LabelSettings) -> dict[str, str]:
    """``nvidia.com/gpu.*`` as NVIDIA's GFD writes them under every strategy: counted over all GPUs, MIG mode
    or not, described by a full GPU when there is one; the sharing settings apply only when a GPU is a full
    GPU; GPUs that are all in MIG mode get ``replicas=0`` and no sharing (they are not full-GPU resources)."""
    full = [g for g in gpus if not g.mig_enabled]
    reference = (full or list(gpus))[0]
    replicas, strategy, shared = settings.sharing_of(GPU) if full else (0, "none", False)
    product = sanitize(reference.name) + ("-SHARED" if shared else "")
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
        out[TIMESTAMP] = str(settings.timestamp)
    out |= vgpu_labels(settings.vgpu)
    if not gpus or driver is None:
        return out
    out |= _driver_labels(driver)
    out["nvidia.com/gpu.machine"] = sanitize(settings.machine or "") or "unknown"
    out["nvidia.com/gpu.mode"] = settings.gpu_mode
    any_mig_enabled = any(g.mig_enabled for g in gpus)
    out["nvidia.com/mig.capable"] = str(any(g.mig_mode is not None for g in gpus)).lower()
    out["nvidia.com/mps.capable"] = str(settings.sharing_strategy == "mps" and settings.any_shared
                                        and not any_mig_enabled).lower()
    if settings.clique is not None:
        out["nvidia.com/gpu.clique"] = settings.clique

    def profile_of(dev: MigDevice) -> GpuInstanceProfile | None:
        return next((p for p in profiles.get(dev.parent_index, ()) if p.id == dev.gi_profile_id), None)

    strategy = settings.mig_strategy
    if strategy == "none":
        out |= _full_gpu_labels(gpus, settings)
        return out
    out["nvidia.com/mig.strategy"] = strategy
    devices = [d for g in gpus for d in g.mig_devices]
    if strategy == "mixed":
        out |= _full_gpu_labels(gpus, settings)
        by_profile: dict[str, list[MigDevice]] = {}
        for d in devices:
            by_profile.setdefault(d.profile, []).append(d)
        for name, devs in sorted(by_profile.items()):
            prefix = f"nvidia.com/mig-{_resource_suffix(name)}"
            parent = next(g for g in gpus if g.index == devs[0].parent_index)
            replicas, sharing, shared = settings.sharing_of(prefix)
            out[f"{prefix}.product"] = f"{sanitize(parent.name)}-MIG-{name}" + ("-SHARED" if shared else "")
            out[f"{prefix}.count"] = str(len(devs))
            out[f"{prefix}.replicas"] = str(replicas)
            out[f"{prefix}.sharing-strategy"] = sharing
            out |= _mig_attributes(prefix, devs[0], profile_of(devs[0]))
        return out
    # single: with no GPU in MIG mode it labels like ``none`` (as NVIDIA's GFD does); otherwise every GPU
    # MIG-enabled with at least one device, all devices of one profile, or the labels say MIG-INVALID.
    out |= _full_gpu_labels(gpus, settings)
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return out
    valid = (all(g.mig_enabled and g.mig_devices for g in gpus) and len({d.profile for d in devices}) == 1)
    model = sanitize(enabled[0].name)
    if not valid:
        out |= {f"{GPU}.product": f"{model}-MIG-INVALID", f"{GPU}.count": "0", f"{GPU}.replicas": "0",
                f"{GPU}.memory": "0", f"{GPU}.sharing-strategy": ""}
        return out
    replicas, sharing, shared = settings.sharing_of(GPU)
    out |= {f"{GPU}.product": f"{model}-MIG-{devices[0].profile}" + ("-SHARED" if shared else ""),
            f"{GPU}.count": str(len(devices)), f"{GPU}.replicas": str(replicas), f"{GPU}.sharing-strategy": sharing}
    out |= _mig_attributes(GPU, devices[0], profile_of(devices[0]))
    return out


def feature_file(labels: Mapping[str, str]) -> str:
    """NFD's local feature file: one ``key=value`` per line."""
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def parse_feature_file(text: str) -> dict[str, str]:
    """The labels of a feature file :func:`feature_file` wrote (lines without ``=`` are skipped)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def same_but_timestamp(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two label sets differ in nothing but :data:`TIMESTAMP`'s value (its presence counts)."""
    if (TIMESTAMP in a) != (TIMESTAMP in b):
        return False
    return {k: v for k, v in a.items() if k != TIMESTAMP} == {k: v for k, v in b.items() if k != TIMESTAMP}


def label_changes(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """A merge patch that sets ``wanted`` and removes owned labels no longer wanted.

    :data:`TIMESTAMP` rides along only with another change (or when the Node has none yet): it says when
    the labels last changed. Stamping every run, as NVIDIA's GFD does, made every labeller write its Node
    once per interval (at 1,000 nodes, 16 Node writes a second that change nothing a scheduler reads)."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if k != TIMESTAMP and current.get(k) != v}
    changes |= {k: None for k in current if owned(k) and k not in wanted}
    if TIMESTAMP in wanted and (changes or TIMESTAMP not in current):
        changes[TIMESTAMP] = wanted[TIMESTAMP]
    return changes
