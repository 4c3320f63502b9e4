"""``vfio status|prepare|bind|unbind``: hand a GPU to ``vfio-pci`` (for VMs) and back to ``nvidia``.

``prepare`` loads ``vfio``, ``vfio_pci`` and ``vfio_iommu_type1`` (``modprobe``, bounded by a
timeout) and checks that the IOMMU is on (``/sys/kernel/iommu_groups`` has groups); with
``--patch-node`` it sets or removes ``node.deckhouse.io/gpu-vfio-ready``. ``bind`` switches a GPU
with ``driver_override`` + unbind + ``drivers_probe`` and refuses a GPU that NVML reports processes
on (or whose idleness NVML cannot confirm); ``unbind`` refuses a GPU whose VFIO group a process
holds open. Both re-read the driver link afterwards and fail if the kernel did not follow.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from node_agent.host import CommandNotFound, HostError, HostRoot, PciDevice, nvidia_gpus, read_device
from node_agent.host import Refused as HostRefused
from node_agent.host.root import CommandTimeout
from node_agent.nvml import NvmlError, NvmlSession, normalize_bus_id
from nvgpu.nodescripts import facts

MODPROBE_TIMEOUT_S = 30
NVIDIA_DRIVER = "nvidia"
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
    modules = {m: host.is_dir(f"/sys/module/{m}") for m in facts.VFIO_MODULES}
    iommu = bool(host.listdir(facts.IOMMU_GROUPS_DIR))
    problems = [f"module-missing:{m}" for m, ok in modules.items() if not ok]
    if not iommu:
        problems.append("iommu-off")
    return VfioStatus(modules, iommu, tuple(nvidia_gpus(host)), tuple(problems))


def prepare(host: HostRoot) -> VfioStatus:
    for module, loaded in vfio_status(host).modules.items():
        if not loaded:
            try:
                host.run(["modprobe", module], timeout_s=MODPROBE_TIMEOUT_S)
            except (CommandNotFound, CommandTimeout) as e:
                raise HostError(f"cannot load {module}: {e}") from e
    return vfio_status(host)


def vfio_group_holders(host: HostRoot, group: int) -> list[int]:
    """PIDs with ``/dev/vfio/<group>`` open (a VM using the GPU)."""
    target = f"/dev/vfio/{group}"
    pids = []
    for entry in host.listdir("/proc"):
        if not entry.isdigit():
            continue
        for fd in host.listdir(f"/proc/{entry}/fd"):
            if host.readlink(f"/proc/{entry}/fd/{fd}") == target:
                pids.append(int(entry))
                break
    return pids


def _nvidia_processes(open_nvml: NvmlOpener, dev: PciDevice) -> list[int]:
    try:
        with open_nvml() as nvml:
            for index in range(nvml.device_count()):
                if normalize_bus_id(nvml.gpu_bus_id(index)) == dev.address:
                    return [p.pid for p in nvml.processes(index)]
    except NvmlError as e:
        raise Refused(f"{dev.address}: NVML cannot confirm the GPU is idle ({e}); not unbinding it") from e
    raise Refused(f"{dev.address}: NVML does not list this GPU; cannot confirm it is idle")


def _switch(host: HostRoot, dev: PciDevice, override: str) -> PciDevice:
    base = f"{facts.PCI_DEVICES_DIR}/{dev.address}"
    host.write_kernel(f"{base}/driver_override", override + "\n")
    if dev.driver is not None:
        host.write_kernel(f"{base}/driver/unbind", dev.address)
    host.write_kernel("/sys/bus/pci/drivers_probe", dev.address)
    return read_device(host, dev.address)


def bind(host: HostRoot, open_nvml: NvmlOpener, address: str) -> PciDevice:
    """Hand the GPU at ``address`` (normalized) to ``vfio-pci``; refused while NVML lists processes on it."""
    with host.lock("vfio"):
        return _bind(host, open_nvml, address)


def unbind(host: HostRoot, address: str) -> PciDevice:
    """Give the GPU at ``address`` back to ``nvidia``; refused while a process holds its VFIO group."""
    with host.lock("vfio"):
        return _unbind(host, address)


def _bind(host: HostRoot, open_nvml: NvmlOpener, address: str) -> PciDevice:
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
    if dev.driver == NVIDIA_DRIVER:
        pids = _nvidia_processes(open_nvml, dev)
        if pids:
            raise Refused(f"{dev.address} is in use by process(es) {', '.join(map(str, pids))}; not unbinding it")
    after = _switch(host, dev, facts.VFIO_DRIVER)
    if after.driver != facts.VFIO_DRIVER:
        raise HostError(f"{dev.address}: the kernel bound {after.driver or 'no driver'} instead of vfio-pci")
    return after


def _unbind(host: HostRoot, address: str) -> PciDevice:
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
    return after
