"""``vfio status|prepare|bind|unbind``: hand a GPU to ``vfio-pci`` (for VMs) and back to ``nvidia``.

``prepare`` loads ``vfio``, ``vfio_pci`` and ``vfio_iommu_type1`` (``modprobe``, bounded by a
timeout) and checks that the IOMMU is on (``/sys/kernel/iommu_groups`` has groups); with
``--patch-node`` it sets or removes ``node.deckhouse.io/gpu-vfio-ready``. ``bind`` switches a GPU
with ``driver_override`` + unbind + ``drivers_probe``; ``unbind`` refuses a GPU whose VFIO group a process
holds open. Both re-read the driver link afterwards and fail if the kernel did not follow.

Unbinding a GPU from ``nvidia`` while anything holds it does not fail: the write blocks in the kernel, the
agent's thread with it, until the last holder lets go. So ``bind`` does what NVIDIA's VFIO code does
(NVIDIA/k8s-dra-driver-gpu ``cmd/gpu-kubelet-plugin/vfio-device.go``, ``VfioPciManager.Configure``):

- a physical function with SR-IOV virtual functions enabled is refused (``verifyDisabledVFs``: "gpu has N VFs,
  cannot unbind"): unbinding it would tear the VFs down under whoever uses them. The VFs themselves are what
  is passed through then, and ``bind`` takes a VF (which NVML does not list and has no ``/dev/nvidia<N>``);
- persistence mode is turned off first (``disableGPUPersistenceMode``): while it is on the driver, or
  nvidia-persistenced, keeps the GPU open; ``unbind`` turns it back on for a GPU ``bind`` turned it off for
  (``Unconfigure`` -> ``enableGPUPersistenceMode``);
- it waits, bounded (NVIDIA: 60 s, polled every second), until no process holds ``/dev/nvidia<minor>``
  (``WaitForGPUFree``: ``fuser``, or ``findFileUsers`` scanning ``/proc/*/fd``) and NVML lists no process on the
  GPU, then fails naming the GPU, the holders and the timeout, with persistence mode restored;
- the unbind itself runs with a timeout in a thread of its own (``tryChangeDriverWithTimeout``, 15 s): a
  holder that appeared after the wait leaves that thread stuck in the kernel, not the caller, and a second
  ``bind`` of the GPU in the same process is refused while it is (the "inflight" marker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from node_agent.host import HostError, HostRoot, PciDevice, gpu_minors, nvidia_gpus, read_device
from node_agent.host import Refused as HostRefused
from node_agent.nvml import NvmlError, NvmlNotSupported, NvmlSession, normalize_bus_id
from node_agent.setup import executor
from nvgpu.nodescripts import facts, plan

log = logging.getLogger(__name__)

MODPROBE_TIMEOUT_S = facts.MODPROBE_TIMEOUT_S
NVIDIA_DRIVER = "nvidia"
#: How long ``bind`` waits for a GPU's holders to let go, and how often it looks (NVIDIA's
#: ``gpuFreeCheckTimeout`` and ``gpuFreeCheckInterval``).
FREE_TIMEOUT_S = 60.0
FREE_POLL_S = 1.0
#: How long the unbind may stay in the kernel before ``bind`` gives up on it (NVIDIA's ``driverChangeTimeout``).
SWITCH_TIMEOUT_S = 15.0
#: ``bind`` records here, per GPU, that it turned persistence mode off, so ``unbind`` turns it back on.
PERSISTENCE_RECORD = "vfio/persistence-off-{address}"
#: GPUs whose driver switch is still in the kernel (the thread is stuck there): not switched again meanwhile.
_INFLIGHT: set[str] = set()
_INFLIGHT_LOCK = threading.Lock()
#: Opens an NVML session (``AgentContext.nvml``): bind asks NVML whether the GPU is idle, and only then.
NvmlOpener = Callable[[], AbstractContextManager[NvmlSession]]


class Refused(HostRefused):
    """The GPU is in use (or that cannot be ruled out); nothing was changed."""


@dataclass(frozen=True)
class VfioStatus:
    modules: dict[str, bool]
    iommu: bool
    gpus: tuple[PciDevice, ...]
    problems: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "modules": self.modules, "iommu": self.iommu, "problems": list(self.problems),
                "gpus": [{"address": g.address, "driver": g.driver, "iommuGroup": g.iommu_group} for g in self.gpus]}


def vfio_status(host: HostRoot) -> VfioStatus:
    """Where the VFIO step's plan (``nvgpu.nodescripts.plan.VFIO``: modules, IOMMU) stands; nothing is changed."""
    return _status(host, executor.problems(host, plan.VFIO))


def _status(host: HostRoot, problems: list[str]) -> VfioStatus:
    iommu = all(r.problem not in problems for r in plan.VFIO.requirements)
    return VfioStatus(executor.modules_loaded(host, plan.VFIO), iommu, tuple(nvidia_gpus(host)), tuple(problems))


def prepare(host: HostRoot) -> VfioStatus:
    """Apply the VFIO step's plan (load the missing modules) with the agent's executor; ``gpu-vfio.sh`` runs the
    same plan rendered as bash."""
    return _status(host, executor.apply_plan(host, plan.VFIO).problems)


def device_holders(host: HostRoot, target: str) -> dict[int, str]:
    """PID -> command name of every process with the file ``target`` open, from ``/proc/<pid>/fd`` (NVIDIA's
    ``findFileUsers``); a process that exits mid-scan is skipped."""
    out: dict[int, str] = {}
    for entry in host.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = host.listdir(f"/proc/{entry}/fd")
            if any(host.readlink(f"/proc/{entry}/fd/{fd}") == target for fd in fds):
                out[int(entry)] = (host.read_text_or_none(f"/proc/{entry}/comm") or "").strip()
        except HostError:  # gone, or not ours to read: as fuser, it is not counted
            continue
    return out


def vfio_group_holders(host: HostRoot, group: int) -> list[int]:
    """PIDs with ``/dev/vfio/<group>`` open (a VM using the GPU)."""
    return sorted(device_holders(host, f"/dev/vfio/{group}"))


def _nvml_index(nvml: NvmlSession, dev: PciDevice) -> int:
    for index in range(nvml.device_count()):
        if normalize_bus_id(nvml.gpu_bus_id(index)) == dev.address:
            return index
    raise Refused(f"{dev.address}: NVML does not list this GPU; cannot confirm it is idle")


def _nvidia_processes(open_nvml: NvmlOpener, dev: PciDevice) -> list[int]:
    try:
        with open_nvml() as nvml:
            return [p.pid for p in nvml.processes(_nvml_index(nvml, dev))]
    except NvmlError as e:
        raise Refused(f"{dev.address}: NVML cannot confirm the GPU is idle ({e}); not unbinding it") from e


def _set_persistence(open_nvml: NvmlOpener, dev: PciDevice, enabled: bool) -> bool:
    """Turn the GPU's persistence mode ``enabled``; True when it changed it (False: already so, or a GPU
    without persistence mode). NVML refusing (not root) is a :class:`Refused` naming the GPU."""
    try:
        with open_nvml() as nvml:
            index = _nvml_index(nvml, dev)
            if nvml.persistence_mode(index) == enabled:
                return False
            nvml.set_persistence_mode(index, enabled)
            return True
    except NvmlNotSupported:
        return False
    except NvmlError as e:
        if enabled:
            raise HostError(f"{dev.address}: cannot turn its persistence mode back on ({e})") from e
        raise Refused(f"{dev.address}: NVML cannot confirm the GPU is idle nor turn its persistence mode off ({e}); "
                      "not unbinding it (the driver keeps a GPU in persistence mode open)") from e


def _virtual_functions(host: HostRoot, address: str) -> tuple[int, list[str]]:
    """How many SR-IOV virtual functions are enabled on the physical function ``address`` (``sriov_numvfs``),
    and their addresses (its ``virtfn<i>`` links)."""
    base = f"{facts.PCI_DEVICES_DIR}/{address}"
    text = (host.read_text_or_none(f"{base}/sriov_numvfs") or "0").strip()
    if not text.isdigit() or int(text) == 0:
        return 0, []
    links = sorted((n for n in host.listdir(base) if n.startswith("virtfn") and n[6:].isdigit()),
                   key=lambda n: int(n[6:]))
    return int(text), [name for n in links if (name := host.readlink_name(f"{base}/{n}")) is not None]


def _wait_until_free(host: HostRoot, open_nvml: NvmlOpener, dev: PciDevice, *, timeout_s: float, poll_s: float,
                     sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait, at most ``timeout_s``, until no process holds ``/dev/nvidia<minor>`` and NVML lists none on the
    GPU; :class:`Refused` naming the GPU, its holders and the timeout otherwise."""
    minor = gpu_minors(host).get(dev.address)
    node = f"/dev/nvidia{minor}" if minor is not None else None
    deadline = time.monotonic() + timeout_s
    while True:
        holders = device_holders(host, node) if node is not None else {}
        for pid in _nvidia_processes(open_nvml, dev):
            holders.setdefault(pid, "")
        if not holders:
            return
        if time.monotonic() >= deadline:
            who = ", ".join(f"{pid} ({comm})" if comm else str(pid) for pid, comm in sorted(holders.items()))
            raise Refused(f"{dev.address}{f' ({node})' if node else ''} is still in use after {timeout_s:g}s "
                          f"by process(es) {who}; not unbinding it (the unbind would block in the kernel until "
                          "they exit)")
        sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def _switch(host: HostRoot, dev: PciDevice, override: str) -> PciDevice:
    base = f"{facts.PCI_DEVICES_DIR}/{dev.address}"
    host.write_kernel(f"{base}/driver_override", override + "\n")
    if dev.driver is not None:
        host.write_kernel(f"{base}/driver/unbind", dev.address)
    host.write_kernel("/sys/bus/pci/drivers_probe", dev.address)
    return read_device(host, dev.address)


def bind(host: HostRoot, open_nvml: NvmlOpener, address: str, *, timeout_s: float = FREE_TIMEOUT_S,
         poll_s: float = FREE_POLL_S, switch_timeout_s: float = SWITCH_TIMEOUT_S) -> PciDevice:
    """Hand the GPU at ``address`` (normalized) to ``vfio-pci``, once it is free (waiting at most ``timeout_s``)."""
    with host.lock("vfio"):
        return _bind(host, open_nvml, address, timeout_s=timeout_s, poll_s=poll_s, switch_timeout_s=switch_timeout_s)


def unbind(host: HostRoot, address: str, open_nvml: NvmlOpener | None = None) -> PciDevice:
    """Give the GPU at ``address`` back to ``nvidia`` (and its persistence mode, if ``bind`` turned it off);
    refused while a process holds its VFIO group."""
    with host.lock("vfio"):
        return _unbind(host, address, open_nvml)


def _switch_bounded(host: HostRoot, dev: PciDevice, override: str, timeout_s: float) -> PciDevice:
    """:func:`_switch` in a thread of its own, given ``timeout_s`` (NVIDIA's ``tryChangeDriverWithTimeout``)."""
    with _INFLIGHT_LOCK:
        if dev.address in _INFLIGHT:
            raise HostError(f"{dev.address}: an earlier driver switch is still stuck in the kernel; check the "
                            "kernel log (dmesg) and what holds the GPU")
        _INFLIGHT.add(dev.address)
    outcome: list[PciDevice | BaseException] = []

    def run() -> None:
        try:
            outcome.append(_switch(host, dev, override))
        except BaseException as e:  # handed to the caller
            outcome.append(e)
        finally:
            with _INFLIGHT_LOCK:
                _INFLIGHT.discard(dev.address)

    worker = threading.Thread(target=run, name=f"vfio-switch-{dev.address}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        raise HostError(f"{dev.address}: unbinding it from {dev.driver} did not finish in {timeout_s:g}s: the kernel "
                        "is waiting for a process that opened the GPU after the check; it completes when that "
                        "process exits (check dmesg)")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _bind(host: HostRoot, open_nvml: NvmlOpener, address: str, *, timeout_s: float, poll_s: float,
          switch_timeout_s: float) -> PciDevice:
    dev = read_device(host, address)
    if not dev.is_nvidia_gpu:
        raise HostError(f"{dev.address} is not an NVIDIA GPU", dev.address)
    if dev.driver == facts.VFIO_DRIVER:
        return dev
    status = vfio_status(host)
    if not status.ready:
        raise HostError(f"VFIO is not ready ({', '.join(status.problems)}): run 'vfio prepare' first")
    if dev.iommu_group is None:
        raise HostError(f"{dev.address} has no IOMMU group", dev.address)
    count, vfs = _virtual_functions(host, dev.address)
    if count:
        listed = ", ".join(vfs) or "no virtfn links"
        raise Refused(f"{dev.address} has {count} SR-IOV virtual function(s) enabled ({listed}): "
                      "unbinding the physical function would remove them; bind the virtual functions instead, "
                      f"or disable them first (echo 0 > {facts.PCI_DEVICES_DIR}/{dev.address}/sriov_numvfs)")
    virtual_function = host.readlink(f"{facts.PCI_DEVICES_DIR}/{dev.address}/physfn") is not None
    if dev.driver == NVIDIA_DRIVER and not virtual_function:
        turned_off = _set_persistence(open_nvml, dev, False)
        try:
            _wait_until_free(host, open_nvml, dev, timeout_s=timeout_s, poll_s=poll_s)
            if turned_off:
                host.write_atomic(host.state_path(PERSISTENCE_RECORD.format(address=dev.address)), "off\n")
        except BaseException:
            if turned_off:
                try:
                    _set_persistence(open_nvml, dev, True)
                except HostError as e:  # the wait's own error is the one to report
                    log.warning("event=persistence-restore-failed gpu=%s error=%s", dev.address, e)
            raise
    after = _switch_bounded(host, dev, facts.VFIO_DRIVER, switch_timeout_s)
    if after.driver != facts.VFIO_DRIVER:
        raise HostError(f"{dev.address}: the kernel bound {after.driver or 'no driver'} instead of vfio-pci")
    return after


def _unbind(host: HostRoot, address: str, open_nvml: NvmlOpener | None) -> PciDevice:
    dev = read_device(host, address)
    if not dev.is_nvidia_gpu:
        raise HostError(f"{dev.address} is not an NVIDIA GPU", dev.address)
    if dev.driver != facts.VFIO_DRIVER:
        return dev
    if dev.iommu_group is not None:
        pids = vfio_group_holders(host, dev.iommu_group)
        if pids:
            raise Refused(f"{dev.address}: /dev/vfio/{dev.iommu_group} is held by process(es) "
                          f"{', '.join(map(str, pids))}; not unbinding it")
    after = _switch(host, dev, "")
    if after.driver == facts.VFIO_DRIVER:
        raise HostError(f"{dev.address}: still bound to vfio-pci after unbind")
    record = host.state_path(PERSISTENCE_RECORD.format(address=dev.address))
    if open_nvml is not None and after.driver == NVIDIA_DRIVER and host.exists(record):
        _set_persistence(open_nvml, after, True)  # bind turned it off: back as it was (NVIDIA's Unconfigure)
        host.remove(record)
    return after
