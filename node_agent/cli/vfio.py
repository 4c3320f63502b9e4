"""``vfio status|prepare|bind|unbind [ADDRESS] [--patch-node]``: the command line of ``node_agent.setup.vfio``."""

from __future__ import annotations

import argparse
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary
from node_agent.cli.context import AgentContext, UsageError
from node_agent.host import HostError, normalize_address
from node_agent.setup import vfio
from node_agent.setup.vfio import VfioStatus
from nvgpu import labels


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
            dev = (vfio.bind(ctx.host, ctx.nvml, address, timeout_s=args.timeout) if args.action == "bind"
                   else vfio.unbind(ctx.host, address, ctx.nvml))
            ctx.emit({"address": dev.address, "driver": dev.driver}, f"{dev.address}: driver {dev.driver}")
            return exitcodes.OK
        status = vfio.prepare(ctx.host) if args.action == "prepare" else vfio.vfio_status(ctx.host)
    except HostError as e:
        return ctx.fail(e)
    if args.action == "prepare" and args.patch_node:
        from node_agent.kube import KubeError  # noqa: PLC0415 - the Kubernetes client only for --patch-node
        from node_agent.kube.nodeowner import NODE_SETUP  # noqa: PLC0415

        value = "true" if status.ready and status.gpus else None
        try:
            ctx.node_api().patch_labels(ctx.require_node_name(), {labels.GPU_VFIO_READY: value}, writer=NODE_SETUP)
        except KubeError as e:
            ctx.emit({"error": str(e), **status.to_dict()}, f"error: {e}")
            return exitcodes.KUBE
    ctx.emit(status.to_dict(), _status_text(status))
    return exitcodes.OK if status.ready or args.action == "status" else exitcodes.FAILED


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("vfio", help="VFIO status, module/IOMMU preparation, bind/unbind a GPU",
                              description=summary(vfio.__doc__))
    p.add_argument("action", choices=("status", "prepare", "bind", "unbind"))
    p.add_argument("address", nargs="?", help="GPU PCI address for bind/unbind")
    p.add_argument("--patch-node", action="store_true", help=f"prepare: set/remove {labels.GPU_VFIO_READY}")
    p.add_argument("--timeout", type=float, default=vfio.FREE_TIMEOUT_S, metavar="SECONDS",
                   help="bind: wait this long for the processes holding the GPU to exit")
    p.set_defaults(run=run)
