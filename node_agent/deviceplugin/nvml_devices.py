""":class:`~node_agent.deviceplugin.devices.NodeDevices` over the agent's NVML facade.

Adapts ``node_agent.nvml`` (real NVML or a simulated machine underneath nvidia-ml-py) to the plugin's
narrow view: one inventory and topology snapshot per plugin start, an XID event watcher, and
re-checks. GPUs NVML cannot register events for, and GPUs that were already lost at start, are
reported as lost right away, as NVIDIA's plugin does.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence

from node_agent import nvml
from node_agent.deviceplugin.devices import (
    WHOLE_GPU,
    Gpu,
    HealthEvent,
    HealthEventKind,
    Link,
    MigDevice,
    PcieLink,
    Recovery,
)

log = logging.getLogger(__name__)

#: XID 79: "GPU has fallen off the bus".
XID_FALLEN_OFF_BUS = 79

_PCIE = {
    nvml.TopologyLevel.INTERNAL: PcieLink.SAME_BOARD,
    nvml.TopologyLevel.SINGLE: PcieLink.SINGLE_SWITCH,
    nvml.TopologyLevel.MULTIPLE: PcieLink.MULTI_SWITCH,
    nvml.TopologyLevel.HOSTBRIDGE: PcieLink.HOST_BRIDGE,
    nvml.TopologyLevel.NODE: PcieLink.SAME_CPU,
    nvml.TopologyLevel.SYSTEM: PcieLink.CROSS_CPU,
}


def to_gpu(g: nvml.Gpu) -> Gpu:
    migs = tuple(
        MigDevice(uuid=str(m.uuid), index=m.index, profile=m.profile, gi_id=m.gi_id, ci_id=m.ci_id,
                  memory_mib=m.memory_mib, multiprocessors=m.multiprocessors)
        for m in g.mig_devices
    )
    return Gpu(index=g.index, uuid=str(g.uuid), name=g.name, memory_mib=g.memory_mib, pci_bus_id=g.pci_bus_id,
               minor=g.minor, compute_capability=g.compute_capability, mig_enabled=g.mig_enabled, migs=migs,
               numa_node=g.numa_node)


class NvmlNodeDevices:
    """The node's GPUs from one NVML session (build a new one at every plugin start)."""

    def __init__(self, session: nvml.NvmlSession):
        self._session = session
        inv = session.inventory()
        self._gpus = tuple(to_gpu(g) for g in inv.gpus)
        for lost in inv.lost:
            log.error("event=gpu-unusable-at-start index=%d reason=%s", lost.index, lost.reason)
        self._index = {g.uuid: g.index for g in self._gpus}
        indices = [g.index for g in self._gpus]
        self._topology = session.topology(indices) if len(indices) > 1 else nvml.Topology(())
        self._pending: deque[HealthEvent] = deque()
        self._watcher: nvml.EventWatcher | None = None
        if indices:
            try:
                self._watcher = session.watch_events(indices, (nvml.EventKind.XID,))
            except nvml.NvmlNotSupported as e:
                # No event sets on this driver: serve the GPUs with XID health checks off, as NVIDIA's
                # plugin does ("continuing with health checks disabled"), instead of serving none.
                log.warning("event=gpu-health-checks-disabled reason=%s", e)
                return
            by_index = {g.index: g.uuid for g in self._gpus}
            for index, reason in self._watcher.failed.items():
                self._pending.append(HealthEvent(HealthEventKind.GPU_LOST, by_index.get(index), detail=reason))

    def gpus(self) -> Sequence[Gpu]:
        return self._gpus

    def link(self, a: Gpu, b: Gpu) -> Link:
        p = self._topology.pair(a.index, b.index)
        if p is None:
            return Link(0, PcieLink.CROSS_CPU)
        return Link(p.nvlinks, _PCIE.get(p.level, PcieLink.CROSS_CPU))

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        if self._pending:
            return self._pending.popleft()
        if self._watcher is None:
            # No event set (health checks off): nothing can arrive, so wait out the slice as promised instead of
            # returning at once, which spun the health monitor at a full core and starved gRPC of the GIL.
            time.sleep(timeout_s)
            return None
        try:
            ev = self._watcher.wait(timeout_s)
        except nvml.DeviceLost as e:
            return HealthEvent(HealthEventKind.WATCH_FAILED, detail=str(e))
        if ev is None:
            return None
        gi = WHOLE_GPU if ev.gi_id is None else ev.gi_id
        ci = WHOLE_GPU if ev.ci_id is None else ev.ci_id
        if ev.data == XID_FALLEN_OFF_BUS:
            return HealthEvent(HealthEventKind.GPU_LOST, str(ev.gpu_uuid), ev.data, detail="xid-79")
        return HealthEvent(HealthEventKind.XID, str(ev.gpu_uuid), ev.data, gi, ci)

    def check(self, gpu_uuid: str) -> bool:
        index = self._index.get(gpu_uuid)
        if index is None:
            return False
        try:
            uuid = self._session.probe(index)
        except nvml.NvmlError as e:
            log.info("event=recheck-failed gpu=%s error=%s", gpu_uuid, e)
            return False
        return str(uuid) == gpu_uuid

    def recovery(self, gpu_uuid: str) -> Recovery:
        index = self._index.get(gpu_uuid)
        if index is None:
            return Recovery(known=False, detail="not a GPU of this node")
        try:
            r = self._session.recovery(index)
        except nvml.NvmlError as e:
            log.info("event=recovery-read-failed gpu=%s error=%s", gpu_uuid, e)
            return Recovery(known=False, detail=str(e))
        need = r.need
        return Recovery(need=None if need is None else need.value, out_of_service=r.out_of_service, known=r.known,
                        detail=", ".join(r.reasons))

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
