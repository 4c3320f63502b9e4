"""Hardware and cluster builders for the DRA kubelet plugin: inventories, allocated claims and recording
stand-ins that read like descriptions of the node under test. In the kit because the DRA, CDI and cluster tests
(and the DRA benchmark) build the same nodes and claims."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from node_agent.dra.devices import GpuInfo, Inventory, MigInfo, VfioInfo, allocatable_devices
from node_agent.dra.nvml_source import architecture_name
from node_agent.dra.sharing import SharingError
from nvgpu import catalogue
from tests.kit.gpus import gpu_uuid, mig_profile, sysfs_address
from tests.kit.migcaps import cap_device, minor_table

DRIVER = "gpu.nvidia.com"
NODE = "gpu-node-1"


def full_gpu(minor: int = 0, model: catalogue.GpuModel = catalogue.H100_80GB, **kw: Any) -> GpuInfo:
    """GPU ``minor`` (UUIDs ``…a000`` + minor, buses from 0x18)."""
    return GpuInfo(
        index=minor, minor=minor, uuid=gpu_uuid(minor, base=0xA000), product_name=model.product_names[0],
        brand="Nvidia", architecture=architecture_name(model.architecture), compute_capability=model.compute_capability,
        memory_bytes=model.memory_mib * 2**20, pci_bus_id=sysfs_address(0x18 + minor), **kw,
    )


def mig_devices(parent: GpuInfo, profiles: Sequence[tuple[str, int]],
                model: catalogue.GpuModel = catalogue.H100_80GB) -> list[MigInfo]:
    """MIG devices on ``parent``: ``[(profile, placement start), ...]``, their capability device nodes as the
    driver numbers them on a node whose GPUs are minors 0 to ``parent.minor``."""
    caps = minor_table(range(parent.minor + 1))
    out = []
    for gi, (name, start) in enumerate(profiles, start=1):
        p = mig_profile(model, name)
        out.append(MigInfo(
            parent_uuid=parent.uuid, parent_minor=parent.minor,
            uuid=gpu_uuid(gi, base=parent.minor << 8, kind="MIG"),
            profile=p.name, profile_id=p.profile_id, placement_start=start, placement_size=p.memory_slices,
            memory_bytes=p.memory_mib * 2**20, multiprocessors=p.multiprocessors, gi_id=gi, ci_id=0,
            cap_device_nodes=(cap_device(caps[(parent.minor, gi, None)]), cap_device(caps[(parent.minor, gi, 0)])),
            copy_engines=1, decoders=1 if p.compute_slices >= 2 else 0, jpeg_engines=0, ofa_engines=0,
        ))
    return out


def vfio_gpu(index: int = 0, group: int = 42) -> VfioInfo:
    return VfioInfo(index=index, pci_bus_id=sysfs_address(0x40 + index), iommu_group=group, device_id=0x2330,
                    vendor_id=0x10DE, product_name="NVIDIA H100 80GB HBM3", memory_bytes=81559 * 2**20,
                    uuid=gpu_uuid(index, base=0xF000), numa_node=0)


def machine(gpus: int = 2, mig_on: Sequence[int] = (), vfio: int = 0) -> Inventory:
    """A node with ``gpus`` H100s; those in ``mig_on`` run MIG with a 3g + 2g + 1g + 1g layout."""
    full = [full_gpu(i, mig_enabled=i in mig_on) for i in range(gpus)]
    migs: list[MigInfo] = []
    for i in mig_on:
        migs += mig_devices(full[i], [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6), ("1g.10gb", 7)])
    return Inventory(driver_version="550.54.15", cuda_driver_version="12.4", gpus=tuple(full), migs=tuple(migs),
                     vfio=tuple(vfio_gpu(i, 40 + i) for i in range(vfio)))


class FakeSource:
    """An InventorySource whose hardware the test changes (MIG reconfiguration, a GPU lost)."""

    def __init__(self, inventory: Inventory) -> None:
        self._inv = inventory
        self._lock = threading.Lock()
        self.calls = 0

    def snapshot(self) -> Inventory:
        with self._lock:
            self.calls += 1
            return self._inv

    def wait_change(self, timeout_s: float, stop: threading.Event) -> bool:
        stop.wait(timeout_s)
        return False

    def set(self, inventory: Inventory) -> None:
        with self._lock:
            self._inv = inventory

    def lose(self, minor: int) -> None:
        with self._lock:
            gpus = tuple(replace(g, unhealthy="gpu-lost") if g.minor == minor else g for g in self._inv.gpus)
            self._inv = replace(self._inv, gpus=gpus)


@dataclass
class RecordingSharing:
    """A SharingBackend that records calls (and can be told to fail one)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    fail_on: str = ""

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        if self.fail_on and call[0] == self.fail_on:
            raise SharingError(f"{call[0]} failed (injected)")

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self._record("compute-mode", uuid, mode)

    def set_timeslice(self, uuid: str, level: int) -> None:
        self._record("timeslice", uuid, level)

    def start_mps(self, claim_uid: str, uuids: Sequence[str], *, pipe_dir: str, log_dir: str,
                  active_thread_percentage: int | None, pinned_limits_mib: dict[int, int]) -> None:
        self._record("start-mps", claim_uid, tuple(uuids), active_thread_percentage, dict(pinned_limits_mib))

    def stop_mps(self, claim_uid: str, pipe_dir: str) -> None:
        self._record("stop-mps", claim_uid)


def claim(name: str, uid: str, devices: Sequence[tuple[str, str]], *, namespace: str = "team-a",
          configs: Sequence[dict[str, Any]] = (), pool: str = NODE, driver: str = DRIVER,
          admin: bool = False) -> dict[str, Any]:
    """An allocated v1 ResourceClaim: ``devices`` is ``[(request, device name), ...]``."""
    requests = sorted({r for r, _ in devices})
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                                          for r in requests]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": r, "driver": driver, "pool": pool, "device": d,
                         **({"adminAccess": True} if admin else {})} for r, d in devices],
            "config": list(configs),
        }}},
    }


def gpu_config(source: str, requests: Sequence[str], sharing: dict[str, Any] | None, *,
               kind: str = "GpuConfig", driver: str = DRIVER, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, **extra}
    if sharing is not None:
        params["sharing"] = sharing
    return {"source": source, "requests": list(requests), "opaque": {"driver": driver, "parameters": params}}


def populate_dev(root: Path, inventory: Inventory, *, uvm: bool = True) -> None:
    """Create the device nodes (as plain files) the node's devices need under a fake host root."""
    nodes = ["/dev/nvidiactl", *(["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if uvm else [])]
    nodes += [n for d in allocatable_devices(inventory) for n in d.device_nodes]
    nodes += [f"/dev/nvidia{g.minor}" for g in inventory.gpus]
    for n in nodes:
        path = root / n.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
