"""What the MIG manager needs from NVML, as a protocol, plus the snapshot of a node's MIG state.

The manager never touches pynvml: it talks to this narrow protocol, implemented over the agent's NVML
facade in :mod:`node_agent.mig.nvmlbackend` and by a small in-memory fake in tests. Keeping the
surface this small is what lets the state machine and the executor be tested without hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nvgpu import catalogue
from nvgpu.catalogue import GpuModel, MigProfile


class MigHardwareError(RuntimeError):
    """An NVML call failed; the message names the GPU and the operation."""


class ResetUnavailable(MigHardwareError):
    """The GPUs could not be reset (in use, or reset unsupported): a reboot is needed."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    pci_device_id: int  #: PCI device ID (vendor 0x10de implied), e.g. 0x2330
    bus_id: str
    pci_subsystem_id: int | None = None  #: NVML pciSubSystemId ``0xSSSSVVVV`` when known
    #: A model the catalogue lacks, described by NVML itself: its MIG profiles from the GPU's own profile
    #: info and possible-placement queries (filled by the backend). A new board is planned from what its
    #: hardware reports, as NVIDIA's mig-parted generates its config from NVML, rather than refused.
    nvml_model: GpuModel | None = None

    @property
    def model(self) -> GpuModel | None:
        return catalogue.identify_model(self.pci_device_id, self.name) or self.nvml_model


@dataclass(frozen=True)
class InstanceInfo:
    """One GPU instance: its NVML profile ID (``nvidia-smi mig -lgip`` ID) and placement.

    ``gi_profile`` is the profile's NVML enum when the backend knows it (NVML does): the profile is then
    identified by what it is, not by the driver's numbering, which the catalogue records for real drivers
    but another driver (or NVIDIA's mock NVML) may number otherwise."""

    gi_id: int
    profile_id: int
    start: int
    size: int
    gi_profile: int | None = None


class MigBackend(Protocol):
    """The NVML operations the MIG manager performs, each raising :class:`MigHardwareError`."""

    def gpus(self) -> Sequence[GpuInfo]: ...

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        """``(current, pending)``; ``(False, False)`` for a GPU without MIG support."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> None: ...

    def reset_gpus(self, indices: Sequence[int]) -> None:
        """Reset GPUs so a pending mode takes effect; :class:`ResetUnavailable` when it cannot."""
        ...

    def gpu_instances(self, index: int) -> Sequence[InstanceInfo]: ...

    def create_instance(self, index: int, profile: MigProfile, start: int) -> None:
        """Create a GPU instance of ``profile`` at ``start`` and one compute instance spanning it."""
        ...

    def destroy_all_instances(self, index: int) -> None:
        """Destroy every compute instance, then every GPU instance, of a GPU."""
        ...

    def gpu_processes(self, index: int) -> Sequence[int]:
        """PIDs of processes holding the GPU (compute and graphics).

        Raises :class:`MigHardwareError` when NVML cannot tell (no process-listing symbol answered,
        GPU lost or wedged); the manager then counts the GPU as busy and changes nothing.
        """
        ...


@dataclass(frozen=True)
class PlacedInstance:
    profile: str  #: catalogue profile name, e.g. ``1g.10gb+me``
    start: int


def count_profiles(instances: Sequence[PlacedInstance]) -> dict[str, int]:
    """``{profile: instances}``: what mig-parted compares (placements may differ)."""
    out: dict[str, int] = {}
    for i in instances:
        out[i.profile] = out.get(i.profile, 0) + 1
    return out


@dataclass(frozen=True)
class GpuState:
    """What one GPU looks like now (or looked like before a change, in the journal)."""

    index: int
    uuid: str
    mig_enabled: bool
    mig_pending: bool  #: the mode it will have after a reset
    instances: tuple[PlacedInstance, ...]

    @property
    def profile_counts(self) -> dict[str, int]:
        return count_profiles(self.instances)


def profile_by_id(model: GpuModel | None, profile_id: int) -> MigProfile | None:
    if model is None or model.mig is None:
        return None
    for p in model.mig.profiles:
        if p.profile_id == profile_id:
            return p
    return None


def profile_of(model: GpuModel | None, inst: InstanceInfo) -> MigProfile | None:
    """The catalogue profile of an instance: by its NVML enum when known, else by profile ID."""
    if inst.gi_profile is None:
        return profile_by_id(model, inst.profile_id)
    if model is None or model.mig is None:
        return None
    return next((p for p in model.mig.profiles if p.gi_profile == inst.gi_profile), None)


def snapshot(backend: MigBackend, gpus: Sequence[GpuInfo] | None = None) -> tuple[GpuState, ...]:
    """Read every GPU's mode and instances. Instances of unknown profiles are kept as ``id:<n>``."""
    out = []
    for gpu in gpus if gpus is not None else backend.gpus():
        current, pending = backend.mig_mode(gpu.index)
        placed: list[PlacedInstance] = []
        if current:
            for inst in backend.gpu_instances(gpu.index):
                p = profile_of(gpu.model, inst)
                placed.append(PlacedInstance(p.name if p else f"id:{inst.profile_id}", inst.start))
        placed.sort(key=lambda i: (i.start, i.profile))
        out.append(GpuState(gpu.index, gpu.uuid, current, pending, tuple(placed)))
    return tuple(out)
