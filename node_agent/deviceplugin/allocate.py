"""Allocate: what a container gets for the devices kubelet picked (env, mounts, device nodes, CDI).

The response follows NVIDIA's plugin field by field so existing workloads and runtimes see the same
thing: ``NVIDIA_VISIBLE_DEVICES`` for ``envvar``, ``/dev/null`` mounts under
``/var/run/nvidia-container-devices`` for ``volume-mounts``, fully qualified CDI names for
``cdi-annotations`` and ``cdi-cri``, device specs with ``passDeviceSpecs``, and the MPS pipe and shm
mounts plus per-client limits under MPS. Errors use NVIDIA's wording, so users' runbooks still match.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from node_agent.deviceplugin.cdi import CDI_IMEX_KIND, CDI_KIND
from node_agent.deviceplugin.config import DeviceIdStrategy, Settings, SharingStrategy
from node_agent.deviceplugin.devices import CONTROL_DEVICES, HostFiles, device_node_present
from node_agent.deviceplugin.resources import PluginDevice, Resource, imex_channel_path
from nvgpu.devicelist import VOLUME_MOUNT_ROOT, DeviceListStrategy

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MPS_CONTAINER_ROOT = "/mps"


class AllocationError(ValueError):
    """A request kubelet must reject; the message is what the user sees in the pod's events."""


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def _join_root(root: str, path: str) -> str:
    return path if root in ("", "/") else root.rstrip("/") + path


def validate_request(resource: Resource, ids: Sequence[str]) -> list[PluginDevice]:
    """NVIDIA's checks: every ID known; shared resources may refuse requests for more than one."""
    if not ids:
        raise AllocationError(f"invalid allocation request for '{resource.name}': no devices requested")
    known = resource.by_id()
    devices = []
    for i in ids:
        d = known.get(i)
        if d is None:
            raise AllocationError(f"invalid allocation request for '{resource.name}': unknown device: {i}")
        devices.append(d)
    if len(set(ids)) != len(ids):
        raise AllocationError(f"invalid allocation request for '{resource.name}': duplicate device IDs")
    if resource.fail_requests_greater_than_one and len(ids) > 1 and any(d.replica is not None for d in devices):
        # NVIDIA's exact text: kubelet shows it as "Allocate failed due to rpc error: code = Unknown
        # desc = request for 'nvidia.com/gpu: 2' too large: ..." in the UnexpectedAdmissionError event.
        raise AllocationError(
            f"request for '{resource.name}: {len(ids)}' too large: maximum request size for shared resources is 1"
        )
    return devices


def visible_ids(devices: Sequence[PluginDevice], strategy: DeviceIdStrategy) -> list[str]:
    """Replica suffixes dropped and duplicates removed, in request order; UUIDs or NVML indices."""
    out: list[str] = []
    for d in devices:
        v = d.uuid if strategy is DeviceIdStrategy.UUID else d.index
        if v not in out:
            out.append(v)
    return out


class Allocator:
    """Builds Allocate responses for one resource under the current settings."""

    def __init__(self, resource: Resource, settings: Settings, host: HostFiles,
                 new_id: Callable[[], str] = lambda: str(uuidlib.uuid4())):
        self.resource = resource
        self.settings = settings
        self._host = host
        self._new_id = new_id

    def _control(self) -> tuple[str, ...]:
        """The control nodes to pass: ``nvidiactl`` always, the optional ones (UVM, modeset) the host has now.
        Looked up per allocation, not once per start: on a freshly booted node ``nvidia-uvm`` is loaded and its
        nodes made after the plugin started (node setup, ``node_agent.setup.devnodes``), and a container without
        ``/dev/nvidia-uvm`` cannot run CUDA."""
        return tuple(
            p for i, p in enumerate(CONTROL_DEVICES)
            if i == 0 or device_node_present(self._host, _join_root(self.settings.nvidia_dev_root, p))
        )

    def allocate(self, ids: Sequence[str]) -> ContainerAllocation:
        s = self.settings
        devices = validate_request(self.resource, ids)
        names = visible_ids(devices, s.device_id_strategy)
        envs: dict[str, str] = {}
        mounts: list[Mount] = []
        specs: list[DeviceSpec] = []
        annotations: dict[str, str] = {}
        cdi: list[str] = []
        if s.uses_cdi:
            qualified = [f"{CDI_KIND}={n}" for n in names]
            qualified += [f"{CDI_IMEX_KIND}={c}" for c in s.imex_channel_ids]
            if DeviceListStrategy.CDI_ANNOTATIONS in s.device_list_strategy:
                annotations[f"{s.cdi_annotation_prefix}nvidia-device-plugin_{self._new_id()}"] = ",".join(qualified)
            if DeviceListStrategy.CDI_CRI in s.device_list_strategy:
                cdi.extend(qualified)
        if not s.only_cdi:
            if DeviceListStrategy.ENVVAR in s.device_list_strategy:
                envs[VISIBLE_DEVICES] = ",".join(names)
                if s.imex_channel_ids:
                    envs["NVIDIA_IMEX_CHANNELS"] = ",".join(str(c) for c in s.imex_channel_ids)
            if DeviceListStrategy.VOLUME_MOUNTS in s.device_list_strategy:
                envs[VISIBLE_DEVICES] = VOLUME_MOUNT_ROOT
                mounts += [Mount(f"{VOLUME_MOUNT_ROOT}/{n}", "/dev/null") for n in names]
                mounts += [Mount(f"{VOLUME_MOUNT_ROOT}/imex/{c}", "/dev/null") for c in s.imex_channel_ids]
            for flag, var in ((s.gdrcopy_enabled, "NVIDIA_GDRCOPY"), (s.gds_enabled, "NVIDIA_GDS"),
                              (s.mofed_enabled, "NVIDIA_MOFED")):
                if flag:
                    envs[var] = "enabled"
            if s.pass_device_specs:
                specs = self._device_specs(devices)
        if self.resource.sharing is SharingStrategy.MPS:
            self._mps(devices, envs, mounts)
        return ContainerAllocation(envs=envs, mounts=tuple(mounts), devices=tuple(specs), annotations=annotations,
                                   cdi_devices=tuple(cdi))

    def _device_specs(self, devices: Sequence[PluginDevice]) -> list[DeviceSpec]:
        paths: list[str] = list(self._control())
        for d in devices:
            for p in d.paths:
                if p not in paths:
                    paths.append(p)
        paths += [imex_channel_path(c) for c in self.settings.imex_channel_ids]  # as NVIDIA's apiDeviceSpecs
        return [DeviceSpec(p, _join_root(self.settings.nvidia_dev_root, p), "rw") for p in paths]

    def _mps(self, devices: Sequence[PluginDevice], envs: dict[str, str], mounts: list[Mount]) -> None:
        pipe = f"{MPS_CONTAINER_ROOT}/{self.resource.base_name}/pipe"
        root = self.settings.mps_root.rstrip("/")
        envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
        limits = mps_client_limits(self.resource, devices)
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(limits.active_thread_percentage)
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{ordinal}={mib}M" for ordinal, mib in enumerate(limits.pinned_memory_mib)
        )
        mounts.append(Mount(pipe, f"{root}/{self.resource.base_name}/pipe"))
        mounts.append(Mount("/dev/shm", f"{root}/shm"))


@dataclass(frozen=True)
class MpsLimits:
    active_thread_percentage: int
    pinned_memory_mib: tuple[int, ...]  #: per visible device, in container ordinal order


def mps_client_limits(resource: Resource, devices: Sequence[PluginDevice]) -> MpsLimits:
    """A client's share: total memory / replicas and 100% / replicas of the SMs, as NVIDIA's daemon sets."""
    replicas = max(resource.replicas, 1)
    seen: dict[str, int] = {}
    for d in devices:
        seen.setdefault(d.uuid, d.memory_mib // replicas)
    return MpsLimits(active_thread_percentage=max(1, 100 // replicas), pinned_memory_mib=tuple(seen.values()))
