"""Which pod and container hold each GPU, MIG device or shared replica (dcgm-exporter's pod labels).

Kubelet's PodResources ``List`` says, per container, the device-plugin device IDs it was given and the
DRA devices of its claims. Both name devices the agent published: device-plugin IDs are GPU or MIG UUIDs
(``<uuid>::<n>`` for a time-sliced or MPS replica), DRA devices are named by the DRA plugin
(``gpu-<minor>``, ``gpu-<minor>-mig-...``). Here both become the physical device's UUID, so a series is
labelled with its holder whatever the allocation mode. A device held by more than one container (shared
replicas, a shared claim) keeps one series without pod labels, so sums over a node stay true; every
holder is listed by ``nvidia_gpu_device_holder`` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from node_agent.deviceplugin.resources import strip_replica
from node_agent.dra.devices import mig_device_name
from node_agent.nvml import Gpu


@dataclass(frozen=True, order=True)
class Holder:
    pod: str
    namespace: str
    container: str


@dataclass(frozen=True)
class ContainerDevices:
    """One container's devices as kubelet reports them (the PodResources answer, transport-free)."""

    pod: str
    namespace: str
    container: str
    #: (resource name, device ID) from the device plugins.
    device_ids: tuple[tuple[str, str], ...] = ()
    #: (driver, pool, device) from DRA claims.
    dra_devices: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Holders:
    """Physical device UUID (GPU or MIG) to the containers holding it."""

    by_uuid: Mapping[str, tuple[Holder, ...]] = field(default_factory=dict)

    def sole(self, uuid: str) -> Holder | None:
        """The one container holding ``uuid``, or None (free, or shared by several)."""
        held = self.by_uuid.get(uuid, ())
        return held[0] if len(held) == 1 else None


def dra_names(gpus: Iterable[Gpu]) -> dict[str, str]:
    """The DRA plugin's device names of these GPUs and their MIG devices, to UUIDs."""
    out: dict[str, str] = {}
    for g in gpus:
        out[f"gpu-{g.minor}"] = str(g.uuid)
        for m in g.mig_devices:
            out[mig_device_name(g.minor, m.profile, m.gi_profile_id, m.placement.start)] = str(m.uuid)
    return out


def holders(containers: Iterable[ContainerDevices], gpus: Iterable[Gpu], *, dra_driver: str,
            resource_prefix: str = "nvidia.com/") -> Holders:
    """Map every container's NVIDIA devices to physical UUIDs (other vendors' devices are left out)."""
    gpus = tuple(gpus)
    known = {str(g.uuid) for g in gpus} | {str(m.uuid) for g in gpus for m in g.mig_devices}
    names = dra_names(gpus)
    found: dict[str, set[Holder]] = {}
    for c in containers:
        who = Holder(c.pod, c.namespace, c.container)
        for resource, device_id in c.device_ids:
            uuid = strip_replica(device_id)
            if resource.startswith(resource_prefix) and uuid in known:
                found.setdefault(uuid, set()).add(who)
        for driver, _pool, device in c.dra_devices:
            if driver == dra_driver and device in names:
                found.setdefault(names[device], set()).add(who)
    return Holders({u: tuple(sorted(h)) for u, h in found.items()})
