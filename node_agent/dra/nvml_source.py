"""The production :class:`~node_agent.dra.devices.InventorySource`: NVML for the GPUs bound to the nvidia
driver (and their MIG devices), sysfs for the GPUs bound to ``vfio-pci``.

One NVML session stays open for the driver's lifetime (NVML init costs tens of milliseconds on real
hardware; polling opens none). A GPU that NVML reports lost, or that times out, stays in the inventory
marked ``gpu-lost``, so the driver withdraws or taints it instead of silently forgetting it. MIG access
needs the ``/dev/nvidia-caps/nvidia-cap<N>`` nodes named in ``/proc/driver/nvidia-caps/mig-minors``.

Health: critical XID events (NVIDIA's application-error XIDs are ignored, the same set as the device
plugin) mark the whole GPU ``xid`` (with its MIG devices) until ``xid_quiet_s`` passes without another one
and NVML shows nothing outstanding (no recovery action, no pending or failed row remap, no pending retired
page: XIDs 48, 94 and 95 leave a GPU that answers but needs a reset first); unlike NVIDIA's driver, which
keeps the taint until the plugin restarts, a GPU that recovered comes back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from node_agent.dra.devices import GpuInfo, Inventory, MigInfo, VfioInfo
from node_agent.host.pci import nvidia_gpus, pcie_root
from node_agent.host.proc import MIG_MINORS_PATH, parse_mig_minors
from node_agent.host.root import HostError, HostRoot
from node_agent.nvml import NvmlError, NvmlNotSupported
from node_agent.nvml.names import GO_NVLIB_BRANDS
from node_agent.nvml.session import EventWatcher, NvmlBackend, NvmlSession, open_nvml
from node_agent.nvml.types import EventKind, Gpu, GpuEvent
from node_agent.nvml.types import Inventory as NvmlInventory
from node_agent.nvml.xid import EVENT_WAIT_SLICE_S, is_application_xid
from nvgpu import catalogue

log = logging.getLogger(__name__)

VFIO_DRIVER = "vfio-pci"

#: go-nvlib's architecture names, which NVIDIA's DRA driver publishes (``device.attributes[...].architecture``).
_ARCHITECTURES = {
    "kepler": "Kepler", "maxwell": "Maxwell", "pascal": "Pascal", "volta": "Volta", "turing": "Turing",
    "ampere": "Ampere", "ada-lovelace": "Ada Lovelace", "hopper": "Hopper", "blackwell": "Blackwell",
    "rubin": "Rubin",
}


def architecture_name(arch: str) -> str:
    return _ARCHITECTURES.get(arch, arch.title())


def brand_name(brand: int | None) -> str:
    """``nvmlDeviceGetBrand`` as NVIDIA's DRA driver publishes it (go-nvlib's ``GetBrandAsString``): not the
    product name's first word, a "Tesla T4" answers NVML_BRAND_NVIDIA (``Nvidia``). ``Unknown`` where the
    driver cannot tell (go-nvlib's word for NVML_BRAND_UNKNOWN)."""
    return GO_NVLIB_BRANDS.get(brand, "Unknown") if brand is not None else "Unknown"


class NvmlInventorySource:
    def __init__(self, backend: NvmlBackend | str, host: HostRoot, timeout_s: float = 5.0, *,
                 xid_quiet_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._backend = backend
        self._xid_quiet = xid_quiet_s
        self._clock = clock
        self._watcher: EventWatcher | None = None
        #: GPU index -> (last critical XID, when it arrived).
        self._xids: dict[int, tuple[int, float]] = {}
        #: GPU index -> what NVML says it needs, for GPUs quiet long enough but not recovered yet.
        self._held: dict[int, str] = {}
        self._host = host
        self._timeout = timeout_s
        self._stack = contextlib.ExitStack()
        self._session: NvmlSession | None = None
        self._lock = threading.Lock()
        #: Last healthy view of each GPU by index, so a GPU that falls off the bus can still be named
        #: (withdrawn, or tainted ``gpu-lost``) instead of silently vanishing.
        self._last: dict[int, GpuInfo] = {}
        #: GPUs reported lost by the previous poll, and whether NVML was unavailable then: the inventory
        #: is polled every few seconds, so a lost GPU or a missing NVML is logged when it starts and when it
        #: ends, not on every poll for as long as it lasts.
        self._lost: set[int] = set()
        self._nvml_down = False

    def _open(self) -> NvmlSession:
        if self._session is None:
            self._session = self._stack.enter_context(open_nvml(self._backend, timeout_s=self._timeout))
            try:
                self._watcher = self._stack.enter_context(self._session.watch_events(kinds=(EventKind.XID,)))
            except NvmlNotSupported as e:
                # No event sets on this driver: publish the GPUs without XID health rather than none.
                log.warning("event=gpu-health-checks-disabled reason=%s", e)
                self._watcher = None
        return self._session

    def _record(self, event: GpuEvent) -> bool:
        """Keep a critical XID for the next snapshot; True if it was one."""
        if event.kind is EventKind.XID and not is_application_xid(event.data) and event.gpu_index >= 0:
            log.warning("event=gpu-xid index=%d xid=%d", event.gpu_index, event.data)
            self._xids[event.gpu_index] = (event.data, self._clock())
            return True
        return False

    def wait_change(self, timeout_s: float, stop: threading.Event) -> bool:
        """NVML's XID event wait is the inventory loop's sleep, in slices of at most ``EVENT_WAIT_SLICE_S`` (an
        NVML wait cannot be interrupted, so ``stop`` is seen within one): a critical XID wakes the loop at
        once, and the GPU is withdrawn (or tainted) by the snapshot that follows instead of at the next poll.
        Runs on the loop's thread, as :meth:`snapshot` does; :meth:`close` from another thread mid-wait frees
        the event set when the wait ends (``EventWatcher.close``)."""
        end = time.monotonic() + timeout_s
        while not stop.is_set():
            remaining = end - time.monotonic()
            if remaining <= 0:
                return False
            watcher = self._watcher
            if watcher is None:  # before the first snapshot, NVML down, or no event sets on this driver
                stop.wait(remaining)
                return False
            try:
                event = watcher.wait(min(remaining, EVENT_WAIT_SLICE_S))
            except NvmlError as e:  # the next snapshot says what NVML thinks; do not spin meanwhile
                log.debug("event=xid-wait-failed error=%s", e)
                stop.wait(min(remaining, EVENT_WAIT_SLICE_S))
                continue
            if event is not None and self._record(event):
                return True
        return False

    def _drain_xids(self) -> None:
        if self._watcher is None:
            return
        while (event := self._watcher.wait(0)) is not None:
            self._record(event)
        now = self._clock()
        for index, (_xid, when) in list(self._xids.items()):
            if now - when < self._xid_quiet:
                continue
            need = self._outstanding(index)
            if need is not None:  # quiet, but NVML says it is not fit yet (e.g. XID 95: a reset first)
                if self._held.get(index) != need:
                    log.warning("event=gpu-xid-held index=%d needs=%s", index, need)
                    self._held[index] = need
                continue
            log.info("event=gpu-xid-cleared index=%d quiet_s=%.0f", index, self._xid_quiet)
            del self._xids[index]
            self._held.pop(index, None)

    def _outstanding(self, index: int) -> str | None:
        """What NVML says GPU ``index`` still needs before it takes work again (``NvmlSession.recovery``), as
        the device plugin asks before trusting a GPU again; ``None``: nothing, or NVML cannot tell (no
        recovery read on this GPU: the quiet period alone decides, as before)."""
        if self._session is None:
            return None
        try:
            need = self._session.recovery(index).need
        except NvmlError as e:
            return f"unreadable ({e})"
        return None if need is None else need.value

    def close(self) -> None:
        with self._lock:
            self._stack.close()
            self._session = None
            self._watcher = None

    def snapshot(self) -> Inventory:
        with self._lock:
            try:
                session = self._open()
                driver = session.driver()
                nvml_inv = session.inventory()
                self._drain_xids()
                profiles = {g.index: {p.id: p for p in session.gpu_instance_profiles(g.index)}
                            for g in nvml_inv.gpus if g.mig_enabled}
            except NvmlError as e:
                # NVML gone (driver unloaded or upgraded): reopen on the next poll, publish VFIO GPUs only.
                if not self._nvml_down:
                    log.warning("event=nvml-unavailable error=%s", e)
                self._nvml_down = True
                self._stack.close()
                self._session = None
                self._watcher = None
                return Inventory(driver_version="0.0.0", cuda_driver_version="0.0", vfio=self._vfio())
            if self._nvml_down:
                log.info("event=nvml-available")
                self._nvml_down = False
        cuda = f"{driver.cuda_driver_version[0]}.{driver.cuda_driver_version[1]}"
        gpus, migs = self._gpus(nvml_inv, profiles)
        return Inventory(driver_version=driver.driver_version, cuda_driver_version=cuda, gpus=gpus, migs=migs,
                         vfio=self._vfio())

    def _gpus(self, inv: NvmlInventory, profiles: dict[int, dict[int, Any]]
              ) -> tuple[tuple[GpuInfo, ...], tuple[MigInfo, ...]]:
        minors = parse_mig_minors(self._host.read_text_or_none(MIG_MINORS_PATH) or "")
        gpus: list[GpuInfo] = []
        migs: list[MigInfo] = []
        for g in inv.gpus:
            self._last[g.index] = self._gpu(g, self._pcie_root(g))
            xid = self._xids.get(g.index)
            gpus.append(replace(self._last[g.index], unhealthy="xid", xid=xid[0]) if xid else self._last[g.index])
            for m in g.mig_devices:
                p = profiles.get(g.index, {}).get(m.gi_profile_id)
                caps = tuple(f"/dev/nvidia-caps/nvidia-cap{minors[k]}" for k in (
                    f"gpu{g.minor}/gi{m.gi_id}/access", f"gpu{g.minor}/gi{m.gi_id}/ci{m.ci_id}/access") if k in minors)
                migs.append(MigInfo(
                    parent_uuid=g.uuid, parent_minor=g.minor, uuid=m.uuid, profile=m.profile,
                    profile_id=m.gi_profile_id, placement_start=m.placement.start, placement_size=m.placement.size,
                    memory_bytes=m.memory_mib * 2**20, multiprocessors=m.multiprocessors, gi_id=m.gi_id,
                    ci_id=m.ci_id, cap_device_nodes=caps,
                    copy_engines=p.copy_engines if p else 0, decoders=p.decoders if p else 0,
                    encoders=p.encoders if p else 0, jpeg_engines=p.jpegs if p else 0, ofa_engines=p.ofas if p else 0,
                ))
        for lost in inv.lost:
            if lost.index not in self._lost:
                log.warning("event=gpu-lost index=%d reason=%s", lost.index, lost.reason)
            known = self._last.get(lost.index)
            if known is not None:
                gpus.append(replace(known, unhealthy="gpu-lost"))
        now_lost = {lost.index for lost in inv.lost}
        for index in sorted(self._lost - now_lost):
            log.info("event=gpu-back index=%d", index)
        self._lost = now_lost
        return tuple(gpus), tuple(migs)

    def _pcie_root(self, g: Gpu) -> str | None:
        try:
            return pcie_root(self._host, g.sysfs_bus_id)
        except (HostError, ValueError) as e:
            log.warning("event=pcie-root-unknown gpu=%d error=%s", g.index, e)
            return None

    @staticmethod
    def _gpu(g: Gpu, root: str | None = None) -> GpuInfo:
        return GpuInfo(
            index=g.index, minor=g.minor, uuid=g.uuid, product_name=g.name, brand=brand_name(g.brand),
            architecture=architecture_name(g.architecture), compute_capability=g.compute_capability,
            memory_bytes=g.memory_mib * 2**20, pci_bus_id=g.sysfs_bus_id, mig_enabled=g.mig_enabled,
            pcie_root=root,
        )

    def _vfio(self) -> tuple[VfioInfo, ...]:
        try:
            devices = [d for d in nvidia_gpus(self._host) if d.driver == VFIO_DRIVER and d.iommu_group is not None]
        except HostError as e:
            log.warning("event=pci-scan-failed error=%s", e)
            return ()
        iommufd = self._host.exists("/dev/iommu")
        out = []
        for i, d in enumerate(sorted(devices, key=lambda d: d.address)):
            model = catalogue.model_by_pci_device(d.device)
            assert d.iommu_group is not None
            out.append(VfioInfo(
                index=i, pci_bus_id=d.address, iommu_group=d.iommu_group, device_id=d.device, vendor_id=d.vendor,
                product_name=model.product_names[0] if model else f"NVIDIA GPU 0x{d.device:04x}",
                memory_bytes=(model.memory_mib if model else 0) * 2**20, uuid=f"PCI-{d.address}",
                numa_node=d.numa_node if d.numa_node is not None else -1, iommufd=iommufd,
            ))
        return tuple(out)
