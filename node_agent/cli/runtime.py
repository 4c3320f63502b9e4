"""``runtime apply|rollback [--no-restart]``: the command line of ``node_agent.setup.runtime``."""

from __future__ import annotations

import argparse
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary
from node_agent.cli.context import AgentContext
from node_agent.host import HostError
from node_agent.setup import runtime
from node_agent.setup.runtime import RuntimeResult


def _text(action: str, result: RuntimeResult) -> str:
    if result.skipped:
        return f"runtime {action}: nothing to do ({result.skipped})"
    lines = [f"runtime {action}: " + (", ".join(result.changed) + " changed" if result.changed else "no change")]
    if result.restarted_units:
        lines.append(f"{', '.join(result.restarted_units)} restarted")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    restart = not args.no_restart
    try:
        if args.action == "apply":
            result = runtime.apply_runtime(ctx.host, restart=restart,
                                           accept_envvar=args.accept_envvar_when_unprivileged,
                                           driver_root=args.toolkit_driver_root, toolkit_dir=args.toolkit_dir)
        else:
            result = runtime.rollback_runtime(ctx.host, restart=restart)
    except HostError as e:
        return ctx.fail(e)
    ctx.emit(result.to_dict(), _text(args.action, result))
    return exitcodes.OK


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("runtime", help="containerd or CRI-O: enable the nvidia runtime and CDI, or roll back",
                              description=summary(runtime.__doc__))
    p.add_argument("action", choices=("apply", "rollback"))
    p.add_argument("--no-restart", action="store_true", help="do not restart containerd / CRI-O after a change")
    add_envvar_flag(p)
    p.set_defaults(run=run)


def add_envvar_flag(p: Any) -> None:
    """The toolkit settings node setup writes: the envvar choice, and where the toolkit finds the driver."""
    p.add_argument("--accept-envvar-when-unprivileged", action="store_true",
                   help="let the toolkit honour an unprivileged container's own NVIDIA_VISIBLE_DEVICES (only for "
                        "the device plugin's envvar strategy: any pod can then take any GPU of the node)")
    p.add_argument("--toolkit-driver-root", default="/", metavar="PATH", type=_absolute,
                   help="where the driver is on the host, for the toolkit's nvidia-container-cli (a driver "
                        "container's /run/nvidia/driver; default: %(default)s)")
    add_toolkit_dir_flag(p)


def add_toolkit_dir_flag(p: Any) -> None:
    p.add_argument("--toolkit-dir", default=None, metavar="PATH", type=_absolute,
                   help="the toolkit NVIDIA's toolkit container installed (<installDir>/toolkit): the nvidia "
                        "runtime runs its nvidia-container-runtime, its config is the installer's")


def _absolute(text: str) -> str:
    if not text.startswith("/") or "\n" in text or '"' in text:
        raise argparse.ArgumentTypeError(f"{text!r}: an absolute path on the host")
    return text.rstrip("/") or "/"
