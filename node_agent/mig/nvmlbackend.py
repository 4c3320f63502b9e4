""":class:`~node_agent.mig.hardware.MigBackend` over the agent's NVML facade, and the GPU reset.

NVML has no public call that resets a GPU; NVIDIA's mig-parted runs ``nvidia-smi -r -i <bus IDs>``
after a MIG mode change stays pending. The reset is therefore its own small protocol
(:class:`GpuResetter`): ``nvidia-smi`` on a real node, the simulator's reset on a simulated one (which,
like a real GPU, refuses while processes hold the GPU or a reset is blocked).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from node_agent.mig.hardware import GpuInfo, InstanceInfo, MigHardwareError, ResetUnavailable
from node_agent.nvml import GpuInstanceProfile, NvmlError, NvmlSession
from node_agent.nvml.sim import SimulatedMachine
from nvgpu.catalogue import MigProfile

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
    """The simulator's GPU reset, refusing like the driver does while the GPU is held."""

    machine: str
    state_file: Path | None = None

    def reset(self, gpus: Sequence[GpuInfo]) -> None:
        sim = SimulatedMachine(self.machine, self.state_file)
        state = sim.state
        for g in gpus:
            held = state.gpus[g.index]
            if held.reset_blocked or held.processes:
                raise ResetUnavailable(f"GPU {g.index} ({g.bus_id}) reset failed: In use by another client")
        for g in gpus:
            sim.reset_gpu(g.index)


class NvmlMigBackend:
    """The MIG manager's NVML operations, each failure raised as :class:`MigHardwareError`."""

    def __init__(self, session: NvmlSession, resetter: GpuResetter) -> None:
        self.nvml = session
        self.resetter = resetter

    def gpus(self) -> Sequence[GpuInfo]:
        try:
            inventory = self.nvml.inventory()
        except NvmlError as e:
            raise MigHardwareError(f"listing GPUs: {e}") from e
        if inventory.lost:
            lost = ", ".join(f"GPU {g.index} ({g.reason})" for g in inventory.lost)
            raise MigHardwareError(f"GPUs unusable: {lost}")
        return [
            GpuInfo(g.index, g.uuid, g.name, g.pci_device_id, g.pci_bus_id, g.pci_subsystem_id)
            for g in inventory.gpus
        ]

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
        self.resetter.reset([by_index[i] for i in indices])

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

    def gpu_processes(self, index: int) -> Sequence[int]:
        try:
            return [p.pid for p in self.nvml.processes(index)]
        except NvmlError as e:
            raise MigHardwareError(f"GPU {index}: listing processes: {e}") from e
