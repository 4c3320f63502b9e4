"""Hardware builders for device-plugin tests: fake nodes from plain values (the host root is the kit's
:class:`~tests.kit.fakehost.FakeHost`).

``dgx_a100()``, ``dgx_h100()`` and friends read like the machines they stand for; ``FakeNode``
implements :class:`NodeDevices` with an event queue the tests push XIDs and GPU-lost events into.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass, field

from node_agent.deviceplugin.devices import (
    Gpu,
    HealthEvent,
    HealthEventKind,
    Link,
    MigDevice,
    PcieLink,
    Recovery,
    sysfs_bus_id,
)
from nvgpu import catalogue
from tests.kit.fakehost import FakeHost
from tests.kit.gpus import gpu_uuid, machine_base, mig_profile, nvml_bus_id
from tests.kit.migcaps import write_mig_minors


@dataclass
class FakeNode:
    gpu_list: list[Gpu]
    links: dict[tuple[int, int], Link] = field(default_factory=dict)
    events: queue.Queue[HealthEvent] = field(default_factory=queue.Queue)
    failing: set[str] = field(default_factory=set)
    checks: int = 0
    #: GPU UUID to what NVML says it still needs (absent: NVML shows nothing outstanding).
    recoveries: dict[str, Recovery] = field(default_factory=dict)

    def gpus(self) -> Sequence[Gpu]:
        return list(self.gpu_list)

    def link(self, a: Gpu, b: Gpu) -> Link:
        return self.links.get((min(a.index, b.index), max(a.index, b.index)), Link(0, PcieLink.CROSS_CPU))

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        try:
            return self.events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def check(self, gpu_uuid: str) -> bool:
        self.checks += 1
        return gpu_uuid not in self.failing

    def recovery(self, gpu_uuid: str) -> Recovery:
        return self.recoveries.get(gpu_uuid, Recovery())

    def xid(self, gpu: int, xid: int, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF) -> None:
        self.events.put(HealthEvent(HealthEventKind.XID, self.gpu_list[gpu].uuid, xid, gi, ci))

    def lose(self, gpu: int) -> None:
        self.failing.add(self.gpu_list[gpu].uuid)
        self.events.put(HealthEvent(HealthEventKind.GPU_LOST, self.gpu_list[gpu].uuid))


def full_gpu(index: int, model: catalogue.GpuModel, machine: str = "node", numa: int | None = None) -> Gpu:
    """GPU ``index`` of ``machine``: its own UUID per machine, buses 0x07, 0x17, ... as on a DGX."""
    return Gpu(index=index, uuid=gpu_uuid(index, base=machine_base(machine)), name=model.product_names[0],
               memory_mib=model.memory_mib, pci_bus_id=nvml_bus_id(0x07 + 0x10 * index), minor=index,
               compute_capability=model.compute_capability)


def mig_gpu(index: int, model: catalogue.GpuModel, profiles: Sequence[str], machine: str = "node") -> Gpu:
    """:func:`full_gpu` in MIG mode with one GPU instance per profile (GI 1, 2, ...; CI 0 each)."""
    base = full_gpu(index, model, machine)
    migs = []
    for j, name in enumerate(profiles):
        p = mig_profile(model, name)
        migs.append(MigDevice(uuid=gpu_uuid((index << 8) + j, base=machine_base(machine), kind="MIG"), index=j,
                              profile=p.name, gi_id=j + 1, ci_id=0, memory_mib=p.memory_mib,
                              multiprocessors=p.multiprocessors))
    return Gpu(index=base.index, uuid=base.uuid, name=base.name, memory_mib=base.memory_mib,
               pci_bus_id=base.pci_bus_id, minor=base.minor, compute_capability=base.compute_capability,
               mig_enabled=True, migs=tuple(migs))


def dgx_links(n: int, nvlinks: int) -> dict[tuple[int, int], Link]:
    """NVSwitch-connected boards: every pair has the same NVLinks; PCIe pairs share a switch, halves a CPU."""
    out = {}
    for a in range(n):
        for b in range(a + 1, n):
            if a // 2 == b // 2:
                pcie = PcieLink.SINGLE_SWITCH
            elif a // (n // 2) == b // (n // 2):
                pcie = PcieLink.SAME_CPU
            else:
                pcie = PcieLink.CROSS_CPU
            out[(a, b)] = Link(nvlinks, pcie)
    return out


def hybrid_cube_mesh() -> dict[tuple[int, int], Link]:
    """DGX-1 style: NVLink counts differ per pair (a hard case for greedy choices)."""
    nv = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 1, (2, 6): 1,
          (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 1}
    base = dgx_links(8, 0)
    return {k: Link(nv.get(k, 0), v.pcie) for k, v in base.items()}


def numa_files(host: FakeHost, gpus: Sequence[Gpu], per_node: int) -> None:
    for g in gpus:
        host.put(f"/sys/bus/pci/devices/{sysfs_bus_id(g.pci_bus_id)}/numa_node", f"{g.index // per_node}\n")


def machine(name: str, host: FakeHost, mig: Sequence[str] | None = None) -> FakeNode:
    """Test stand-ins for the simulated machines (model, count, links, NUMA)."""
    specs = {
        "dgx-a100-40gb": (catalogue.A100_40GB, 8, dgx_links(8, 12)),
        "dgx-a100-80gb": (catalogue.A100_80GB, 8, dgx_links(8, 12)),
        "dgx-h100": (catalogue.H100_80GB, 8, dgx_links(8, 18)),
        "hgx-h200": (catalogue.H200_141GB, 8, dgx_links(8, 18)),
        "dgx-1": (catalogue.A100_40GB, 8, hybrid_cube_mesh()),
        "a30x4": (catalogue.A30_24GB, 4, dgx_links(4, 0)),
        "l4x2": (catalogue.L4, 2, dgx_links(2, 0)),
        "t4x1": (catalogue.T4, 1, {}),
    }
    model, count, links = specs[name]
    gpus = [mig_gpu(i, model, mig, name) if mig else full_gpu(i, model, name) for i in range(count)]
    numa_files(host, gpus, max(1, count // 2))
    host.put("/dev/nvidiactl", "")
    host.put("/dev/nvidia-uvm", "")
    if mig:
        write_mig_minors(host.root, [g.minor for g in gpus])
    return FakeNode(gpus, links)
