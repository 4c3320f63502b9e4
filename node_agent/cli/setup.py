"""``setup [--dra]``, ``teardown`` and ``setup-monitor``: the command lines of ``node_agent.setup.flow`` and
``node_agent.setup.monitor``."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.check import add_expect_arguments, expectation
from node_agent.cli.commands import summary
from node_agent.cli.context import AgentContext
from node_agent.cli.runtime import add_envvar_flag, add_toolkit_dir_flag
from node_agent.cli.statusflags import add_status_arguments
from node_agent.kube.nodeowner import NODE_SETUP
from node_agent.setup import check, flow
from node_agent.setup.flow import Failure, FlowResult
from node_agent.setup.monitor import DEFAULT_INTERVAL_S, CheckMonitor
from node_agent.status.server import RegistryRenderer, StatusServer

#: A failed step's exit code.
EXIT_CODES = {
    Failure.FAILED: exitcodes.FAILED,
    Failure.HOST_INPUT: exitcodes.HOST_INPUT,
    Failure.KUBE: exitcodes.KUBE,
    Failure.REFUSED: exitcodes.REFUSED,
}


def exit_code(r: FlowResult) -> int:
    return exitcodes.OK if r.failure is None else EXIT_CODES[r.failure]


def _text(r: FlowResult) -> str:
    lines = [f"{r.action}: {'complete' if r.complete else 'FAILED' if exit_code(r) else 'nothing to do'}"]
    lines += [f"  {'ok  ' if s.ok else 'FAIL'} {s.name}: {s.detail}" for s in r.steps]
    lines += [f"  label {k}{'-' if v is None else '=' + v}" for k, v in r.label_changes.items()]
    return "\n".join(lines)


def _report(ctx: AgentContext, result: FlowResult) -> int:
    code = exit_code(result)
    ctx.emit({**result.to_dict(), "exitCode": code}, _text(result))
    return code


def run_setup(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    return _report(ctx, flow.setup(ctx, dra=args.dra, restart=not args.no_restart, patch_node=not args.no_patch_node,
                                   accept_envvar=args.accept_envvar_when_unprivileged, expect=expectation(args),
                                   toolkit_root=args.toolkit_driver_root, toolkit_dir=args.toolkit_dir))


def run_teardown(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    return _report(ctx, flow.teardown(ctx, restart=not args.no_restart, patch_node=not args.no_patch_node,
                                      toolkit_dir=args.toolkit_dir))


#: Node setup's status port (exporter 9400, device plugin 9401, DRA plugin 9402, MIG manager 9403).
DEFAULT_METRICS_PORT = 9404


def run_monitor(args: argparse.Namespace) -> int:
    """Serve the check's metrics until SIGTERM (then exit 0: the pod's preStop hook runs the teardown)."""
    ctx = AgentContext.from_args(args)
    expect = expectation(args)
    publish = None
    if not args.no_patch_node and ctx.node_name:
        node = ctx.node_name

        def publish(changes: dict[str, str | None]) -> None:
            ctx.node_api().patch_labels(node, changes, writer=NODE_SETUP)

    monitor = CheckMonitor(lambda: check.run_check(ctx.host, ctx.nvml, args.phase, expect,
                                                   toolkit_dir=args.toolkit_dir), publish=publish)
    ready = monitor.usable if args.ready_when_usable else monitor.live
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = None
    if args.metrics_port:
        try:
            server = StatusServer(RegistryRenderer(monitor.registry), live=lambda: True, ready=ready,
                                  host=args.metrics_address, port=args.metrics_port,
                                  not_ready=b"the last check did not find the node usable\n" if args.ready_when_usable
                                  else b"no check yet\n", required=args.metrics_port_required)
        except OSError as e:  # a required port is taken or not ours to bind
            return ctx.fail(e)
        server.start()
    try:
        monitor.run(stop, args.interval)
    finally:
        if server is not None:
            server.stop()
    return exitcodes.OK


def register(subparsers: Any) -> None:
    for name, handler, help_text in (
        ("setup", run_setup, "check, runtime, sysctl (and vfio), then mark the node ready"),
        ("teardown", run_teardown, "undo setup: remove the label, the runtime drop-in, the sysctl"),
    ):
        p = subparsers.add_parser(name, help=help_text, description=summary(flow.__doc__))
        if name == "setup":
            p.add_argument("--dra", action="store_true", help="DRA mode: also prepare VFIO")
            add_envvar_flag(p)
            add_expect_arguments(p)
        else:
            add_toolkit_dir_flag(p)
        p.add_argument("--no-restart", action="store_true", help="do not restart containerd / CRI-O")
        p.add_argument("--no-patch-node", action="store_true", help="do not touch the Node's labels")
        p.set_defaults(run=handler)
    m = subparsers.add_parser("setup-monitor", help="check the node again at an interval and serve the findings",
                              description=summary(CheckMonitor.__doc__ or check.__doc__))
    m.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help="seconds between checks (default: %(default)s)")
    m.add_argument("--phase", choices=["host", "all"], default="all",
                   help="host: the driver, devices and NVML only; all: also the container runtime (default)")
    m.add_argument("--ready-when-usable", action="store_true",
                   help="/readyz answers only while the last verdict is ok (the driver pod's check)")
    add_status_arguments(m, DEFAULT_METRICS_PORT)
    add_expect_arguments(m)
    add_toolkit_dir_flag(m)
    m.add_argument("--no-patch-node", action="store_true",
                   help="do not write the verdict on the Node as its check labels (written when the node's name "
                        "is known)")
    m.set_defaults(run=run_monitor)
