"""``driver-upgrade``: the controller that rolls a driver change through a stack's GPU nodes one at a time.

Runs in its Deployment (not on GPU nodes; see ``nvidia_gpu.components.manifests.driverupgrade``), with the
agent's global ``--kubeconfig`` (default: the pod's ServiceAccount). ``--once`` decides one round and prints
each node's next step, changing nothing (a dry look at the rollout); otherwise it runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.context import AgentContext, UsageError
from node_agent.driverupgrade.controller import UpgradeController
from node_agent.driverupgrade.machine import DrainMode
from node_agent.kube.errors import KubeError
from node_agent.kube.transport import Kube

COMMAND = "driver-upgrade"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(COMMAND, help="roll driver changes through the GPU nodes one at a time")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   help="the stack's namespace, where its driver DaemonSets are (default: $POD_NAMESPACE)")
    p.add_argument("--drain", choices=[m.value for m in DrainMode], default=DrainMode.CORDON.value,
                   help="cordon and evict, or the same within the Deckhouse NodeGroup's disruption settings "
                        "(default: %(default)s)")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between rounds while a rollout runs (default: %(default)s)")
    p.add_argument("--resync", type=float, default=600.0, metavar="SECONDS",
                   help="while every node is at rest, rounds come when the driver DaemonSets, their pods or a "
                        "node's upgrade state change, and at least this often (default: %(default)s)")
    p.add_argument("--once", action="store_true",
                   help="decide one round, print each node's next step and exit; changes nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    if not args.namespace:
        raise UsageError("--namespace (or $POD_NAMESPACE) is required: the driver DaemonSets are there")
    for flag, value in (("--interval", args.interval), ("--resync", args.resync)):
        if not value > 0:
            raise UsageError(f"{flag} {value}: must be a positive number of seconds")
    controller = UpgradeController(Kube.connect(ctx.kubeconfig), args.namespace, drain_mode=DrainMode(args.drain),
                                   dry_run=args.once)
    try:
        if args.once:
            done = controller.run_round()
            doc = {name: {"act": s.act.value, "state": s.state.value if s.state else None, "reason": s.reason}
                   for name, s in sorted(done.steps.items())}
            ctx.emit({"nodes": doc}, "\n".join(f"{n}: {d['act']} {d['state'] or ''} {d['reason']}".rstrip()
                                               for n, d in doc.items()) or "no driver pods")
            return exitcodes.OK
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        controller.run(stop, args.interval, args.resync)
    except KubeError as e:
        ctx.fail(e)
        return exitcodes.KUBE
    return exitcodes.OK
