"""``check [--phase host|all] [--no-record]``: the command line of ``node_agent.setup.check``."""

from __future__ import annotations

import argparse
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.context import AgentContext
from node_agent.host import HostError
from node_agent.setup import check
from nvgpu.nodescripts import facts
from nvgpu.nodescripts.facts import Verdict


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    report = check.run_check(ctx.host, ctx.nvml, args.phase)
    if not args.no_record:
        try:
            check.record_verdict(ctx.host, report)
        except HostError as e:
            ctx.emit({"error": str(e), **report.to_dict()}, f"{check.report_text(report)}\nerror: {e}")
            return exitcodes.HOST_INPUT
    ctx.emit(report.to_dict(), check.report_text(report))
    return exitcodes.FAILED if report.verdict is Verdict.UNUSABLE else exitcodes.OK


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("check", help="check whether this node's GPUs are usable",
                              description=(check.__doc__ or "").splitlines()[0])
    p.add_argument("--phase", choices=("host", "all"), default="all",
                   help="'host' skips the container-runtime check (setup runs it after configuring the runtime)")
    p.add_argument("--no-record", action="store_true",
                   help=f"do not write the verdict to {facts.CHECK_VERDICT_FILE}")
    p.set_defaults(run=run)
