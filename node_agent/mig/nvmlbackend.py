""":class:`~node_agent.mig.hardware.MigBackend` over the agent's NVML facade, and the GPU reset.

NVML has no public call that resets a GPU; NVIDIA's mig-parted runs ``nvidia-smi -r -i <bus IDs>``
after a MIG mode change stays pending. The reset is therefore its own small protocol
(:class:`GpuResetter`): ``nvidia-smi`` on a real node, the simulator's reset on a simulated one (which,
like a real GPU, refuses while processes hold the GPU or a reset is blocked), reached through the registered
``node_agent.nvml.simulator.Simulator``, never by importing the simulator.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from node_agent.mig.hardware import GpuInfo, InstanceInfo, MigHardwareError, ResetUnavailable
from node_agent.nvml import Gpu, GpuInstanceProfile, NvmlError, NvmlSession, Placement, simulator
from nvgpu import catalogue
from nvgpu.catalogue import GpuModel, MigProfile, MigSpec

log = logging.getLogger(__name__)

#: nvidia-smi's reset waits for the driver; minutes means it is stuck.
RESET_TIMEOUT_S = 120.0


class GpuResetter(Protocol):
    def reset(self, gpus: Sequence[GpuInfo]) -> None:
        """Reset the GPUs; raise :class:`ResetUnavailable` when that is not possible now."""
        ...


#: Runs a host command with a timeout; returns the exit status and the command's message.
Runner = Callable[[list[str], float], tuple[int, str]]


@dataclass
class NvidiaSmiReset:
    """``nvidia-smi -r -i <bus,...>`` (what mig-parted does), run on the host, bounded by a timeout."""

    run: Runner
    nvidia_smi: str = "nvidia-smi"
    timeout_s: float = RESET_TIMEOUT_S

    def reset(self, gpus: Sequence[GpuInfo]) -> None:
        argv = [self.nvidia_smi, "-r", "-i", ",".join(g.bus_id for g in gpus)]
        code, message = self.run(argv, self.timeout_s)
        if code != 0:
            detail = message.strip().splitlines()
            raise ResetUnavailable(f"{' '.join(argv)} exited {code}: {detail[-1] if detail else ''}")


@dataclass
class SimulatedReset:
    """The simulator's ``nvidia-smi -r``, refusing like the driver does while the GPU is held: processes on
    it, a host GPU client running, any process with NVML initialised (this one's own session included)."""

    machine: str
    state_file: Path | None = None

    def reset(self, gpus: Sequence[GpuInfo]) -> None:
        try:
            simulator.get().reset(self.machine, self.state_file, [g.index for g in gpus])
        except simulator.ResetRefused as e:
            raise ResetUnavailable(f"GPU {', '.join(str(g.index) for g in gpus)} reset failed: {e}") from e


class GpuClients(Protocol):
    def stopped(self) -> AbstractContextManager[tuple[str, ...]]:
        """The host's GPU clients stopped for the ``with`` block (raise :class:`ResetUnavailable` when one
        cannot be), started again after it."""
        ...


class NoGpuClients:
    """No host GPU clients to stop (a node without them, the tests' in-memory machines)."""

    @contextlib.contextmanager
    def stopped(self) -> Iterator[tuple[str, ...]]:
        yield ()


class NvmlMigBackend:
    """The MIG manager's NVML operations, each failure raised as :class:`MigHardwareError`.

    A GPU reset is done as NVIDIA's mig-parted does it: the host's GPU clients stopped (``hooks.sh``),
    NVML shut down (``apply/mode.go``), ``nvidia-smi -r``, then NVML initialised again and the clients
    started again; a driver refuses the reset while any of them holds the GPUs."""

    def __init__(self, session: NvmlSession, resetter: GpuResetter, clients: GpuClients | None = None) -> None:
        self.nvml = session
        self.resetter = resetter
        self.clients: GpuClients = clients if clients is not None else NoGpuClients()

    def gpus(self) -> Sequence[GpuInfo]:
        try:
            inventory = self.nvml.inventory()
        except NvmlError as e:
            raise MigHardwareError(f"listing GPUs: {e}") from e
        if inventory.lost:
            lost = ", ".join(f"GPU {g.index} ({g.reason})" for g in inventory.lost)
            raise MigHardwareError(f"GPUs unusable: {lost}")
        return [
            GpuInfo(g.index, g.uuid, g.name, g.pci_device_id, g.pci_bus_id, g.pci_subsystem_id,
                    nvml_model=None if catalogue.identify_model(g.pci_device_id, g.name) else self._nvml_model(g))
            for g in inventory.gpus
        ]

    def _nvml_model(self, gpu: Gpu) -> GpuModel | None:
        """A GPU the catalogue lacks, as NVML describes it: its MIG profiles are what the GPU reports
        (``nvmlDeviceGetGpuInstanceProfileInfo`` per profile enum, ``...PossiblePlacements`` per profile);
        None when it has no MIG (or NVML lists no profile)."""
        if gpu.mig_mode is None:
            return None
        try:
            placements = {p.id: self.nvml.possible_placements(gpu.index, p.id) for p in self._profiles(gpu.index)}
        except NvmlError as e:
            raise MigHardwareError(f"GPU {gpu.index}: reading GPU-instance placements: {e}") from e
        return model_from_nvml(gpu, self._profiles(gpu.index), placements)

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        try:
            mode = self.nvml.mig_mode(index)
        except NvmlError as e:
            raise MigHardwareError(f"GPU {index}: reading MIG mode: {e}") from e
        return (False, False) if mode is None else (mode.current, mode.pending)

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        try:
            self.nvml.set_mig_mode(index, enabled)
        except NvmlError as e:
            raise MigHardwareError(f"GPU {index}: setting MIG mode {'on' if enabled else 'off'}: {e}") from e

    def reset_gpus(self, indices: Sequence[int]) -> None:
        by_index = {g.index: g for g in self.gpus()}
        targets = [by_index[i] for i in indices]
        with self.clients.stopped() as stopped:
            if stopped:
                log.info("event=host-gpu-clients-stopped units=%s", ",".join(stopped))
            try:
                with self.nvml.released():
                    self.resetter.reset(targets)
            except NvmlError as e:  # NVML did not come back after the reset
                raise MigHardwareError(f"NVML after resetting GPU {', '.join(map(str, indices))}: {e}") from e

    def gpu_instances(self, index: int) -> Sequence[InstanceInfo]:
        try:
            gis = self.nvml.gpu_instances(index)
        except NvmlError as e:
            raise MigHardwareError(f"GPU {index}: listing GPU instances: {e}") from e
        enums = {p.id: p.profile for p in self._profiles(index)}
        return [InstanceInfo(gi.id, gi.profile_id, gi.placement.start, gi.placement.size, enums.get(gi.profile_id))
                for gi in gis]

    def _profiles(self, index: int) -> Sequence[GpuInstanceProfile]:
        try:
            return self.nvml.gpu_instance_profiles(index)
        except NvmlError as e:
            raise MigHardwareError(f"GPU {index}: listing GPU-instance profiles: {e}") from e

    def _nvml_profile_id(self, index: int, profile: MigProfile) -> int:
        """The driver's ID for a catalogue profile, found by the profile's NVML enum (what NVML numbers is
        the driver's business; the catalogue's ``profile_id`` is what real drivers use)."""
        for p in self._profiles(index):
            if p.profile == profile.gi_profile:
                return p.id
        raise MigHardwareError(f"GPU {index}: NVML lists no GPU-instance profile {profile.name} "
                               f"(NVML_GPU_INSTANCE_PROFILE enum {profile.gi_profile})")

    def create_instance(self, index: int, profile: MigProfile, start: int) -> None:
        profile_id = self._nvml_profile_id(index, profile)
        try:
            gi = self.nvml.create_gpu_instance(index, profile_id, start)
        except NvmlError as e:
            raise MigHardwareError(f"GPU {index}: creating {profile.name} at slice {start}: {e}") from e
        try:
            self.nvml.create_compute_instance(index, gi.id)
        except NvmlError as e:
            # Never leave a GPU instance without its compute instance behind.
            try:
                self.nvml.destroy_gpu_instance(index, gi.id)
            except NvmlError as cleanup:
                log.warning("event=gi-cleanup-failed gpu=%d gi=%d error=%s", index, gi.id, cleanup)
            raise MigHardwareError(f"GPU {index}: creating the compute instance of {profile.name}: {e}") from e

    def destroy_all_instances(self, index: int) -> None:
        last: NvmlError | None = None
        for _ in range(2):  # mig-parted retries a clear once: CIs can linger a moment after destroy
            try:
                for gi in self.nvml.gpu_instances(index):
                    for ci in self.nvml.compute_instances(index, gi.id):
                        self.nvml.destroy_compute_instance(index, gi.id, ci.id)
                    self.nvml.destroy_gpu_instance(index, gi.id)
                return
            except NvmlError as e:
                last = e
        raise MigHardwareError(f"GPU {index}: destroying MIG instances: {last}") from last

    def mig_caps(self) -> list[str]:
        """The ``mig-minors`` keys of every GPU and compute instance there is now (``gpu<minor>/gi<id>/access``,
        ``gpu<minor>/gi<id>/ci<id>/access``, NVIDIA's ``internal/nvcaps``): whose caps nodes must exist."""
        caps: list[str] = []
        try:
            for g in self.nvml.gpus():
                mode = self.nvml.mig_mode(g.index)
                if mode is None or not mode.current:
                    continue
                for gi in self.nvml.gpu_instances(g.index):
                    caps.append(f"gpu{g.minor}/gi{gi.id}/access")
                    caps += [f"gpu{g.minor}/gi{gi.id}/ci{ci.id}/access"
                             for ci in self.nvml.compute_instances(g.index, gi.id)]
        except NvmlError as e:
            raise MigHardwareError(f"listing MIG instances for their device nodes: {e}") from e
        return caps

    def gpu_processes(self, index: int) -> Sequence[int]:
        try:
            return [p.pid for p in self.nvml.processes(index)]
        except NvmlError as e:
            raise MigHardwareError(f"GPU {index}: listing processes: {e}") from e


def model_from_nvml(gpu: Gpu, profiles: Sequence[GpuInstanceProfile],
                    placements: dict[int, tuple[Placement, ...]]) -> GpuModel | None:
    """The model of a GPU the catalogue lacks, from NVML's own answers: one :class:`MigProfile` per
    GPU-instance profile the GPU reports with at least one possible placement (compute slices = NVML's
    ``sliceCount``, memory slices = the placements' size, starts = the placements'), keyed by its product
    name. The driver floor is the global one: the driver that answered is the one MIG will run on."""
    mig: list[MigProfile] = []
    for p in profiles:
        where = placements.get(p.id, ())
        if not where:
            continue
        mig.append(MigProfile(
            name=p.name, gi_profile=p.profile, profile_id=p.id, compute_slices=p.slice_count,
            memory_slices=where[0].size, max_instances=p.instance_count,
            placement_starts=tuple(sorted(pl.start for pl in where)), memory_mib=p.memory_mib,
            multiprocessors=p.multiprocessors, media_extensions=p.name.endswith("+me")))
    if not mig:
        return None
    spec = MigSpec(compute_slices=max(p.compute_slices for p in mig),
                   memory_slices=max(s + p.memory_slices for p in mig for s in p.placement_starts),
                   profiles=tuple(mig), min_driver=catalogue.GLOBAL_MIN_DRIVER)
    return GpuModel(key=gpu.name, product_names=(gpu.name,), architecture=gpu.architecture,
                    compute_capability=gpu.compute_capability, memory_mib=gpu.memory_mib,
                    pci_device_ids=(gpu.pci_device_id,), min_driver=catalogue.GLOBAL_MIN_DRIVER, mig=spec)
