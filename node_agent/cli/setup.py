"""``setup [--dra]`` and ``teardown``: the command line of ``node_agent.setup.flow``."""

from __future__ import annotations

import argparse
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.context import AgentContext
from node_agent.cli.runtime import add_envvar_flag
from node_agent.setup import flow
from node_agent.setup.flow import Failure, FlowResult

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
                                   accept_envvar=args.accept_envvar_when_unprivileged))


def run_teardown(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    return _report(ctx, flow.teardown(ctx, restart=not args.no_restart, patch_node=not args.no_patch_node))


def register(subparsers: Any) -> None:
    for name, handler, help_text in (
        ("setup", run_setup, "check, runtime, sysctl (and vfio), then mark the node ready"),
        ("teardown", run_teardown, "undo setup: remove the label, the runtime drop-in, the sysctl"),
    ):
        p = subparsers.add_parser(name, help=help_text, description=(flow.__doc__ or "").splitlines()[0])
        if name == "setup":
            p.add_argument("--dra", action="store_true", help="DRA mode: also prepare VFIO")
            add_envvar_flag(p)
        p.add_argument("--no-restart", action="store_true", help="do not restart containerd / CRI-O")
        p.add_argument("--no-patch-node", action="store_true", help="do not touch the Node's labels")
        p.set_defaults(run=handler)
