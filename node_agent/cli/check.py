"""``check [--phase host|all] [--no-record]``: the command line of ``node_agent.setup.check``."""

from __future__ import annotations

import argparse
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary
from node_agent.cli.context import AgentContext
from node_agent.cli.runtime import add_toolkit_dir_flag
from node_agent.host import HostError
from node_agent.setup import check
from nvgpu.driver import DriverExpectation, DriverType, DriverVersion, KernelModules, parse_version
from nvgpu.nodescripts import facts
from nvgpu.nodescripts.facts import Verdict


def add_expect_arguments(p: argparse.ArgumentParser) -> None:
    """The driver the node group declares (``check``, ``setup``, ``setup-monitor``): a mismatch is a finding."""
    p.add_argument("--expect-driver", type=_version, default=None, metavar="VERSION",
                   help="the declared driver: a release (550.90.07) or a branch (550)")
    p.add_argument("--expect-kernel-modules", default=None, help="the declared kernel modules",
                   choices=[m.value for m in (KernelModules.OPEN, KernelModules.PROPRIETARY)])
    p.add_argument("--expect-driver-type", default=None, choices=[t.value for t in DriverType],
                   help="the declared driver type: compared with the GPUs' virtualization mode")


def _version(text: str) -> DriverVersion:
    try:
        return parse_version(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def expectation(args: argparse.Namespace) -> DriverExpectation:
    modules = args.expect_kernel_modules
    driver_type = args.expect_driver_type
    return DriverExpectation(args.expect_driver, KernelModules(modules) if modules else KernelModules.AUTO,
                             DriverType(driver_type) if driver_type else None)


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    report = check.run_check(ctx.host, ctx.nvml, args.phase, expectation(args), toolkit_dir=args.toolkit_dir)
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
                              description=summary(check.__doc__))
    p.add_argument("--phase", choices=("host", "all"), default="all",
                   help="'host' skips the container-runtime check (setup runs it after configuring the runtime)")
    p.add_argument("--no-record", action="store_true",
                   help=f"do not write the verdict to {facts.CHECK_VERDICT_FILE}")
    add_expect_arguments(p)
    add_toolkit_dir_flag(p)
    p.set_defaults(run=run)
