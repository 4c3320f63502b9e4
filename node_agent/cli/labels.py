"""``labels``: the command line of the labeller (``node_agent.labeller.labels``): one run, or ``--loop``."""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary
from node_agent.cli.configsource import add_config_source_arguments, config_source
from node_agent.cli.context import AgentContext, UsageError
from node_agent.host import HostError
from node_agent.labeller import labels
from node_agent.labeller.inventory import InventoryContext
from node_agent.labeller.labels import FEATURE_FILE, LabelOptions, LabelRun, Owner
from node_agent.labeller.nodeconfig import NodeConfigError, Requested
from node_agent.labeller.nodepatch import NodeEnv
from node_agent.nvml import NvmlError


def _owner(text: str) -> Owner:
    """``--daemonset``'s type: a malformed value is a usage error naming it."""
    try:
        return Owner.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _text(r: LabelRun) -> str:
    lines = [f"{k}={v}" for k, v in sorted(r.labels.items())]
    lines.append(f"# feature file {'updated' if r.file_changed else 'unchanged'}; "
                 f"{len(r.node_changes)} node label change(s)"
                 + ("" if r.node_taints is None else f"; taints now {len(r.node_taints)}"))
    lines += [f"# warning: {w}" for w in r.warnings]
    return "\n".join(lines)


def options(args: argparse.Namespace) -> LabelOptions:
    """The labelling flags, checked against each other and parsed."""
    if args.replicas is not None and args.replicas < 1:
        raise UsageError(f"--replicas must be at least 1 (got {args.replicas})")
    if (args.config_file or args.config_dir) and (args.replicas is not None or args.sharing_strategy):
        flag = "--replicas" if args.replicas is not None else "--sharing-strategy"
        raise UsageError(f"{flag} describes sharing without a device-plugin config; with --config-file or "
                         "--config-dir the config's sharing section decides")
    if (args.node_label or args.node_taint) and not args.patch_node:
        flag = "--node-label" if args.node_label else "--node-taint"
        raise UsageError(f"{flag} needs --patch-node (the labels and taints go onto the Node)")
    inventory = None
    if args.inventory:
        if not args.patch_node:
            raise UsageError("--inventory needs --patch-node (the GPU objects belong to the Node)")
        if not args.inventory_sharing:
            raise UsageError("--inventory needs --inventory-sharing (the node group's sharing mode)")
        if args.inventory_xid_quiet < 0:
            raise UsageError(f"--inventory-xid-quiet must be 0 or more seconds (got {args.inventory_xid_quiet:g})")
        inventory = InventoryContext(sharing=args.inventory_sharing, allocation_mode=args.inventory_allocation_mode,
                                     dra_driver=args.inventory_dra_driver, xid_quiet_s=args.inventory_xid_quiet)
    return LabelOptions(mig_strategy=args.mig_strategy, replicas=args.replicas, sharing_strategy=args.sharing_strategy,
                        timestamp=not args.no_timestamp, output_file=args.output_file,
                        write_file=not args.no_output_file, patch_node=args.patch_node, daemonset=args.daemonset,
                        inventory=inventory)


def run(args: argparse.Namespace) -> int:
    kube_error = labels.kube_error(args.patch_node)
    opts = options(args)
    try:
        want = Requested.from_flags(args.node_label, args.node_taint)
    except NodeConfigError as e:
        raise UsageError(str(e)) from e
    if args.daemonset is not None and not args.patch_node:
        raise UsageError("--daemonset needs --patch-node (it gates and withdraws the Node's labels)")
    ctx = AgentContext.from_args(args)
    if args.loop and args.patch_node:
        return _loop_watching_node(ctx, args, opts, want)
    source = labels.sharing_source(ctx, config_source(args), args.mig_strategy)
    if not args.loop:
        try:
            result = labels.label_once(ctx, opts, want, source)
        except NvmlError as e:
            ctx.emit({"error": f"NVML: {e}"}, f"error: NVML: {e}")
            return exitcodes.FAILED
        except HostError as e:
            ctx.emit({"error": str(e)}, f"error: {e}")
            return exitcodes.HOST_INPUT
        except kube_error as e:
            ctx.emit({"error": str(e)}, f"error: {e}")
            return exitcodes.KUBE
        ctx.emit(result.to_dict(), _text(result))
        return exitcodes.OK
    return _loop(ctx, ctx, args, opts, want, source=source)


def _loop_watching_node(ctx: AgentContext, args: argparse.Namespace, opts: LabelOptions, want: Requested) -> int:
    """The loop with its own Node watched: the config label, the Node's labels and the inventory's Node
    fields come from the watch, so a run that changes nothing makes no request."""
    with labels.watching_node(ctx, args.interval) as watched:
        source = labels.sharing_source(watched, config_source(args), args.mig_strategy)
        return _loop(ctx, watched, args, opts, want, source=source)


def _loop(ctx: AgentContext, env: NodeEnv, args: argparse.Namespace, opts: LabelOptions, want: Requested, *,
          source: labels.SharingSource | None = None) -> int:
    stop = threading.Event()
    previous = _on_signals(stop)
    try:
        labels.label_loop(env, opts, want, source, stop, interval=args.interval, iterations=args.iterations)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.is_set() and args.daemonset is not None:
        labels.withdraw_if_retired(ctx, args.daemonset, args.output_file, opts.inventory)
    return exitcodes.OK


def _on_signals(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("labels", help="GPU feature-discovery labels: NFD feature file and Node labels",
                              description=summary(labels.__doc__))
    p.add_argument("--mig-strategy", choices=("none", "single", "mixed"), default=None,
                   help="default: the device-plugin config's flags.migStrategy, else none")
    p.add_argument("--replicas", type=int, default=None,
                   help="without a device-plugin config: time-slicing/MPS replicas per GPU (default 1 = not shared)")
    p.add_argument("--sharing-strategy", choices=("time-slicing", "mps"), default=None,
                   help="without a device-plugin config: how --replicas share (default time-slicing)")
    add_config_source_arguments(p.add_argument_group(
        "device-plugin config (the device plugin's flags: the labels follow the config it serves)"))
    p.add_argument("--output-file", default=FEATURE_FILE, metavar="HOST_PATH",
                   help="the NFD feature file the labels are written to (Node Feature Discovery reads it)")
    p.add_argument("--no-output-file", action="store_true", help="do not write the NFD feature file")
    p.add_argument("--no-timestamp", action="store_true", help="omit nvidia.com/gfd.timestamp")
    p.add_argument("--patch-node", action="store_true", help="also set the labels on the Node")
    p.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE",
                   help="with --patch-node: a node-group label to keep on the Node (repeatable)")
    p.add_argument("--node-taint", action="append", default=[], metavar="KEY=VALUE:EFFECT",
                   help="with --patch-node: a node-group taint to keep on the Node (repeatable; KEY:EFFECT "
                        "for an empty value)")
    g = p.add_argument_group("GPU inventory (one gpus.gpu.nvidia-gpu.io object per GPU of this node)")
    g.add_argument("--inventory", action="store_true",
                   help="with --patch-node: keep this node's GPU objects current on every run")
    g.add_argument("--inventory-sharing", choices=("Exclusive", "TimeSlicing", "MPS", "MIG"), default=None,
                   help="the node group's sharing mode, as the objects report it")
    g.add_argument("--inventory-allocation-mode", choices=("devicePlugin", "dra"), default="devicePlugin",
                   help="the node group's allocation mode, as the objects report it")
    g.add_argument("--inventory-dra-driver", default="gpu.nvidia.com", metavar="NAME",
                   help="the DRA driver whose devices expose the GPUs (allocation mode dra)")
    g.add_argument("--inventory-xid-quiet", type=float, default=60.0, metavar="SECONDS",
                   help="with --loop: how long a GPU shows Unhealthy after a critical XID (the device plugin's "
                        "--recovery-quiet-period; default 60)")
    p.add_argument("--loop", action="store_true", help="re-label every --interval seconds until SIGTERM")
    p.add_argument("--interval", type=float, default=60.0, metavar="SECONDS", help="with --loop: seconds between runs")
    p.add_argument("--iterations", type=int, default=0, help="with --loop: stop after N runs (0 = never)")
    p.add_argument("--daemonset", type=_owner, metavar="NAMESPACE/NAME",
                   help="with --patch-node: the DaemonSet this runs under; label only while the Node carries "
                        "gpu-setup-complete, and on SIGTERM withdraw the labels if that DaemonSet is gone or "
                        "being deleted")
    p.set_defaults(run=run)
