"""Turns the node's GPUs and the settings into kubelet resources and their device lists.

This is NVIDIA's resource-manager step: MIG strategy (``none`` exposes MIG-enabled GPUs whole,
``single`` maps identical MIG devices to ``nvidia.com/gpu``, ``mixed`` adds one
``nvidia.com/mig-<profile>`` resource per profile), then time-slicing or MPS replicas (``<uuid>::<n>``
IDs, ``.shared`` renaming). Each device carries its index, device nodes and NUMA node. Resources with
no devices are left out, like NVIDIA's "No devices found" resources.

IMEX channels (``imex.channelIDs``) are selected as NVIDIA's ``internal/imex.GetChannels`` does: a
channel is used only when its device node ``/dev/nvidia-caps-imex-channels/channel<N>`` exists under
the device root on the host; a missing one is a start-up error with ``imex.required: true`` and is
otherwise dropped with a warning, so no container is ever handed a channel it cannot open.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from node_agent.deviceplugin.config import MigStrategy, Settings, SharingStrategy
from node_agent.deviceplugin.devices import (
    DeviceError,
    Gpu,
    HostFiles,
    MigDevice,
    numa_node,
    refusal_reason,
    report_refused,
)
from node_agent.host import HostError
from node_agent.host.proc import MIG_MINORS_PATH, parse_mig_minors
from nvgpu.catalogue import MIN_COMPUTE_CAPABILITY

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
REPLICA_SEPARATOR = "::"
MAX_DEVICE_ID_LENGTH = 63
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"


class ImexChannelError(DeviceError):
    """``imex.required`` is set and a configured IMEX channel has no device node on the host."""


def imex_channel_path(channel: int) -> str:
    """The channel's device node (container path; on the host it is under the device root)."""
    return f"{IMEX_CHANNEL_DIR}/channel{channel}"


def imex_channel_host_path(settings: Settings, channel: int) -> str:
    root = settings.nvidia_dev_root
    path = imex_channel_path(channel)
    return path if root in ("", "/") else root.rstrip("/") + path


def select_imex_channels(settings: Settings, host: HostFiles) -> Settings:
    """``settings`` with only the IMEX channels whose device node exists; raises :class:`ImexChannelError`
    when ``imex.required`` and one is missing (the plugin then does not start with this config)."""
    present: list[int] = []
    for channel in settings.imex_channel_ids:
        node = imex_channel_host_path(settings, channel)
        try:
            present_node = host.exists(node)
        except HostError as e:
            reason = report_refused(node, e)
            if settings.imex_required:
                raise ImexChannelError(f"imex.required is true but IMEX channel {channel}'s device node {node} "
                                       f"cannot be checked: {reason}") from e
            log.warning("event=imex-channel-ignored channel=%d device=%s reason=device-node-refused", channel, node)
            continue
        if present_node:
            log.info("event=imex-channel-selected channel=%d device=%s", channel, node)
            present.append(channel)
        elif settings.imex_required:
            raise ImexChannelError(
                f"imex.required is true but IMEX channel {channel} has no device node: {node} does not exist on "
                "the host (is the nvidia-imex channel device created, e.g. NVreg_CreateImexChannel0=1?)")
        else:
            log.warning("event=imex-channel-ignored channel=%d device=%s reason=device-node-missing", channel, node)
    if tuple(present) == settings.imex_channel_ids:
        return settings
    return replace(settings, imex_channel_ids=tuple(present))


@dataclass(frozen=True)
class PluginDevice:
    """One device as advertised to kubelet."""

    id: str  #: the advertised ID: the GPU/MIG UUID, or ``<uuid>::<n>`` for a replica
    uuid: str  #: the GPU or MIG device UUID behind it
    index: str  #: NVML index: ``"0"`` for a GPU, ``"0:1"`` for MIG device 1 of GPU 0
    gpu_uuid: str  #: the physical GPU (the parent for MIG devices)
    gpu_index: int
    paths: tuple[str, ...]  #: device nodes (container paths)
    numa_node: int | None
    memory_mib: int
    replica: int | None = None
    mig: MigDevice | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig is not None


@dataclass(frozen=True)
class Resource:
    name: str  #: what kubelet sees, e.g. ``nvidia.com/gpu`` or ``nvidia.com/gpu.shared``
    devices: tuple[PluginDevice, ...]
    sharing: SharingStrategy = SharingStrategy.NONE
    replicas: int = 1
    fail_requests_greater_than_one: bool = False
    base_name: str = ""  #: the resource before renaming (``nvidia.com/gpu``); MPS paths use it

    @property
    def socket_name(self) -> str:
        """``nvidia-gpu.sock``, ``nvidia-mig-1g.10gb.sock``: one socket per resource, as NVIDIA names them."""
        return f"nvidia-{self.name.split('/', 1)[1]}.sock"

    @property
    def full_gpus_only(self) -> bool:
        return all(not d.is_mig and d.replica is None for d in self.devices)

    def by_id(self) -> dict[str, PluginDevice]:
        return {d.id: d for d in self.devices}


def _gpu_device(gpu: Gpu, host: HostFiles) -> PluginDevice:
    return PluginDevice(
        id=gpu.uuid, uuid=gpu.uuid, index=str(gpu.index), gpu_uuid=gpu.uuid, gpu_index=gpu.index,
        paths=(f"/dev/nvidia{gpu.minor}",), numa_node=numa_node(host, gpu), memory_mib=gpu.memory_mib,
    )


def _mig_device(gpu: Gpu, mig: MigDevice, host: HostFiles, minors: dict[str, int]) -> PluginDevice:
    paths = [f"/dev/nvidia{gpu.minor}"]
    for cap in (f"gpu{gpu.minor}/gi{mig.gi_id}/access", f"gpu{gpu.minor}/gi{mig.gi_id}/ci{mig.ci_id}/access"):
        minor = minors.get(cap)
        if minor is None:
            raise DeviceError(
                f"MIG device {mig.uuid} (GPU {gpu.index}, GI {mig.gi_id}, CI {mig.ci_id}): "
                f"capability {cap!r} is missing from {MIG_MINORS_PATH}"
            )
        paths.append(f"/dev/nvidia-caps/nvidia-cap{minor}")
    return PluginDevice(
        id=mig.uuid, uuid=mig.uuid, index=f"{gpu.index}:{mig.index}", gpu_uuid=gpu.uuid, gpu_index=gpu.index,
        paths=tuple(paths), numa_node=numa_node(host, gpu), memory_mib=mig.memory_mib, mig=mig,
    )


def _mig_minors(host: HostFiles) -> dict[str, int]:
    """The driver's MIG capability minors. A table that cannot be read is an init error naming why: taken
    for empty it would fail every MIG device with "capability missing", pointing at the wrong cause."""
    try:
        text = host.read_text_or_none(MIG_MINORS_PATH)
    except HostError as e:
        raise DeviceError(f"cannot read {MIG_MINORS_PATH}: {refusal_reason(e)}") from e
    return parse_mig_minors(text or "")


def _mig_resource_name(profile: str) -> str:
    return f"nvidia.com/mig-{profile.replace('+', '.')}"


def _base_resources(gpus: Sequence[Gpu], strategy: MigStrategy, host: HostFiles) -> dict[str, list[PluginDevice]]:
    out: dict[str, list[PluginDevice]] = {}
    has_mig = any(g.mig_enabled for g in gpus)
    minors = _mig_minors(host) if has_mig and strategy != "none" else {}
    if strategy is MigStrategy.NONE or not has_mig:
        out[GPU_RESOURCE] = [_gpu_device(g, host) for g in gpus]
        return out
    if strategy is MigStrategy.SINGLE:
        if not all(g.mig_enabled for g in gpus):
            raise DeviceError("migStrategy single: all GPUs must have the same MIG mode, but some are MIG-enabled "
                              "and some are not; use migStrategy mixed")
        empty = [g.index for g in gpus if not g.migs]
        if empty:
            raise DeviceError(f"migStrategy single: MIG-enabled GPU(s) {empty} have no MIG devices")
        profiles = sorted({m.profile for g in gpus for m in g.migs})
        if len(profiles) > 1:
            raise DeviceError(f"migStrategy single: all MIG devices must be identical, found profiles {profiles}; "
                              "use migStrategy mixed")
        out[GPU_RESOURCE] = [_mig_device(g, m, host, minors) for g in gpus for m in g.migs]
        return out
    # mixed
    full = [_gpu_device(g, host) for g in gpus if not g.mig_enabled]
    if full:
        out[GPU_RESOURCE] = full
    for g in gpus:
        if g.mig_enabled and not g.migs:
            log.warning("event=mig-gpu-without-devices gpu=%d uuid=%s", g.index, g.uuid)
        for m in g.migs:
            out.setdefault(_mig_resource_name(m.profile), []).append(_mig_device(g, m, host, minors))
    return out


def replicate(devices: Sequence[PluginDevice], replicas: int) -> tuple[PluginDevice, ...]:
    out = []
    for d in devices:
        for n in range(replicas):
            rid = f"{d.uuid}{REPLICA_SEPARATOR}{n}"
            if len(rid) > MAX_DEVICE_ID_LENGTH:
                raise DeviceError(f"replica ID {rid!r} is longer than kubelet's {MAX_DEVICE_ID_LENGTH} characters")
            out.append(PluginDevice(
                id=rid, uuid=d.uuid, index=d.index, gpu_uuid=d.gpu_uuid, gpu_index=d.gpu_index, paths=d.paths,
                numa_node=d.numa_node, memory_mib=d.memory_mib, replica=n, mig=d.mig,
            ))
    return tuple(out)


def strip_replica(device_id: str) -> str:
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def build_resources(gpus: Sequence[Gpu], settings: Settings, host: HostFiles) -> tuple[Resource, ...]:
    """Every resource this node advertises, sorted by name (GPUs older than the catalogue's minimum
    compute capability are left out)."""
    usable = [g for g in gpus if g.compute_capability >= MIN_COMPUTE_CAPABILITY]
    for g in gpus:
        if g.compute_capability < MIN_COMPUTE_CAPABILITY:
            log.warning("event=gpu-unsupported index=%d uuid=%s compute_capability=%d.%d minimum=%d.%d", g.index,
                        g.uuid, *g.compute_capability, *MIN_COMPUTE_CAPABILITY)
    base = _base_resources(usable, settings.mig_strategy, host)
    sharing = settings.sharing
    out: dict[str, Resource] = {}
    for name, devices in base.items():
        if not devices:
            log.info("event=no-devices resource=%s", name)
            continue
        shared = sharing.for_resource(name)
        if shared is None:
            res = Resource(name=name, devices=tuple(devices), base_name=name)
        else:
            if sharing.strategy is SharingStrategy.MPS and any(d.is_mig for d in devices):
                raise DeviceError(f"MPS sharing of {name}: MPS is not supported on MIG devices")
            res = Resource(
                name=shared.advertised_as, devices=replicate(devices, shared.replicas), sharing=sharing.strategy,
                replicas=shared.replicas, fail_requests_greater_than_one=sharing.fail_requests_greater_than_one,
                base_name=name,
            )
        if res.name in out:
            raise DeviceError(f"two resources would be advertised as {res.name}")
        out[res.name] = res
    return tuple(out[k] for k in sorted(out))
