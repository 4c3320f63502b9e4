"""``diagnose [--bundle FILE.tar.gz]``: the node's GPU report as JSON (``node_agent.diagnose``); changes nothing.

Exit 0 with the report whatever it found (a report of a broken node is still a report); 2 for a bundle
path that cannot be written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary
from node_agent.cli.context import AgentContext
from node_agent.diagnose import collect, write_bundle
from node_agent.host.driverroot import current_driver_root


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("diagnose", help="a read-only report of this node's GPUs, driver and GPU stack",
                              description=summary(__doc__))
    p.add_argument("--bundle", type=Path, default=None, metavar="FILE.tar.gz",
                   help="also write the report and the raw files it read to this archive")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    kube = None
    if ctx.node_name and ctx.kubeconfig is not None:
        from node_agent.kube.transport import Kube  # noqa: PLC0415 - the Kubernetes client only for --node-name

        kube = Kube.connect(ctx.kubeconfig)
    report, files = collect(ctx.host, current_driver_root(), ctx.nvml_backend, node_name=ctx.node_name, kube=kube)
    if args.bundle is not None:
        try:
            write_bundle(args.bundle, report, files)
        except OSError as e:
            print(f"error: --bundle {args.bundle}: {e.strerror or e}", file=sys.stderr)
            return exitcodes.USAGE
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return exitcodes.OK
