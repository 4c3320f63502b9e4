"""``vfio status|prepare|bind|unbind``: hand a GPU to ``vfio-pci`` (for VMs) and back to ``nvidia``.

``prepare`` loads ``vfio``, ``vfio_pci`` and ``vfio_iommu_type1`` (``modprobe``, bounded by a
timeout) and checks that the IOMMU is on (``/sys/kernel/iommu_groups`` has groups); with
``--patch-node`` it sets or removes ``node.deckhouse.io/gpu-vfio-ready``. ``bind`` switches a GPU
with ``driver_override`` + unbind + ``drivers_probe`` and refuses a GPU that NVML reports processes
on (or whose idleness NVML cannot confirm); ``unbind`` refuses a GPU whose VFIO group a process
holds open. Both re-read the driver link afterwards and fail if the kernel did not follow.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.context import AgentContext, UsageError
from node_agent.host import CommandNotFound, HostError, HostRoot, PciDevice, normalize_address, nvidia_gpus, read_device
from node_agent.host import Refused as HostRefused
from node_agent.host.root import CommandTimeout
from node_agent.nvml import NvmlError, normalize_bus_id
from nvgpu import labels
from nvgpu.nodescripts import facts

MODPROBE_TIMEOUT_S = 30
NVIDIA_DRIVER = "nvidia"


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


def _nvidia_processes(ctx: AgentContext, dev: PciDevice) -> list[int]:
    try:
        with ctx.nvml() as nvml:
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


def bind(ctx: AgentContext, address: str) -> PciDevice:
    with ctx.host.lock("vfio"):
        return _bind(ctx, address)


def unbind(ctx: AgentContext, address: str) -> PciDevice:
    with ctx.host.lock("vfio"):
        return _unbind(ctx, address)


def _bind(ctx: AgentContext, address: str) -> PciDevice:
    host = ctx.host
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
        pids = _nvidia_processes(ctx, dev)
        if pids:
            raise Refused(f"{dev.address} is in use by process(es) {', '.join(map(str, pids))}; not unbinding it")
    after = _switch(host, dev, facts.VFIO_DRIVER)
    if after.driver != facts.VFIO_DRIVER:
        raise HostError(f"{dev.address}: the kernel bound {after.driver or 'no driver'} instead of vfio-pci")
    return after


def _unbind(ctx: AgentContext, address: str) -> PciDevice:
    host = ctx.host
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


def _status_text(s: VfioStatus) -> str:
    lines = [f"VFIO: {'ready' if s.ready else 'not ready'}" + (f" ({', '.join(s.problems)})" if s.problems else "")]
    lines += [f"  {g.address}: driver={g.driver or '-'} iommu_group={g.iommu_group}" for g in s.gpus]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    try:
        if args.action in ("bind", "unbind"):
            if not args.address:
                raise UsageError(f"vfio {args.action} needs a PCI address (for example 0000:07:00.0)")
            try:
                address = normalize_address(args.address)
            except ValueError as e:
                raise UsageError(str(e)) from e
            dev = bind(ctx, address) if args.action == "bind" else unbind(ctx, address)
            ctx.emit({"address": dev.address, "driver": dev.driver}, f"{dev.address}: driver {dev.driver}")
            return exitcodes.OK
        status = prepare(ctx.host) if args.action == "prepare" else vfio_status(ctx.host)
    except HostError as e:
        return ctx.fail(e)
    if args.action == "prepare" and args.patch_node:
        from node_agent.kube import KubeError

        value = "true" if status.ready and status.gpus else None
        try:
            ctx.node_api().patch_labels(ctx.require_node_name(), {labels.GPU_VFIO_READY: value})
        except KubeError as e:
            ctx.emit({"error": str(e), **status.to_dict()}, f"error: {e}")
            return exitcodes.KUBE
    ctx.emit(status.to_dict(), _status_text(status))
    return exitcodes.OK if status.ready or args.action == "status" else exitcodes.FAILED


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("vfio", help="VFIO status, module/IOMMU preparation, bind/unbind a GPU",
                              description=(__doc__ or "").splitlines()[0])
    p.add_argument("action", choices=("status", "prepare", "bind", "unbind"))
    p.add_argument("address", nargs="?", help="GPU PCI address for bind/unbind")
    p.add_argument("--patch-node", action="store_true", help=f"prepare: set/remove {labels.GPU_VFIO_READY}")
    p.set_defaults(run=run)


