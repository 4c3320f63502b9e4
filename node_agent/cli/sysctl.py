"""``sysctl apply|rollback``: the command line of ``node_agent.setup.sysctl``."""

from __future__ import annotations

import argparse
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary
from node_agent.cli.context import AgentContext
from node_agent.host import HostError
from node_agent.setup import sysctl
from node_agent.setup.sysctl import SysctlResult


def _text(action: str, r: SysctlResult) -> str:
    if r.skipped:
        return f"sysctl {action}: nothing to do ({r.skipped})"
    parts = [f"{f} changed" for f in r.changed_files] + [f"{n}={v} (live)" for n, v in r.live.items()]
    return "\n".join([f"sysctl {action}: " + (", ".join(parts) if parts else "no change")]
                     + [f"note: {n}" for n in r.notes])


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    try:
        result = sysctl.apply_sysctl(ctx.host) if args.action == "apply" else sysctl.rollback_sysctl(ctx.host)
    except HostError as e:
        return ctx.fail(e)
    ctx.emit(result.to_dict(), _text(args.action, result))
    return exitcodes.OK


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sysctl", help="apply or roll back the sysctls the NVIDIA toolkit needs",
                              description=summary(sysctl.__doc__))
    p.add_argument("action", choices=("apply", "rollback"))
    p.set_defaults(run=run)
