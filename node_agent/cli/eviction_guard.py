"""``eviction-guard``: the admission webhook that keeps the MIG manager's evictions on its own node.

Runs in the guard's Deployment (not on GPU nodes; see ``nvidia_gpu.components.manifests.evictionguard``),
with the agent's global ``--kubeconfig`` (default: the pod's ServiceAccount). Serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from node_agent.admission.server import GuardSettings, serve
from node_agent.cli import exitcodes
from node_agent.cli.context import AgentContext, UsageError
from node_agent.kube.errors import KubeError
from node_agent.kube.transport import Kube
from nvgpu import evictionguard

COMMAND = "eviction-guard"


def register(subparsers: Any) -> None:
    """Adds the ``eviction-guard`` sub-command."""
    p = subparsers.add_parser(COMMAND, help="serve the webhook that keeps MIG evictions on the manager's node")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   help="the stack's namespace, where the guard's Service is (default: $POD_NAMESPACE)")
    p.add_argument("--listen", default=f"0.0.0.0:{evictionguard.PORT}", metavar="HOST:PORT",
                   help="HTTPS address (default: %(default)s)")
    p.add_argument("--extra-host", action="append", default=[], metavar="NAME",
                   help="another DNS name or IP address for the serving certificate (a URL-based webhook)")
    p.set_defaults(run=run)


def settings_from(args: argparse.Namespace) -> GuardSettings:
    if not args.namespace:
        raise UsageError("--namespace (or $POD_NAMESPACE) is required: the certificate names the Service there")
    host, sep, port = str(args.listen).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {args.listen!r}: expected HOST:PORT with a port from 0 to 65535")
    ns = args.namespace
    return GuardSettings(namespace=ns, configuration=evictionguard.configuration_name(ns),
                         hosts=(*evictionguard.service_hosts(ns), *args.extra_host), listen=(host, int(port)))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    ctx = AgentContext.from_args(args)
    settings = settings_from(args)  # a UsageError is the CLI's exit 2
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        serve(settings, Kube.connect(ctx.kubeconfig), stopped)
    except KubeError as e:
        ctx.fail(e)
        return exitcodes.KUBE
    except OSError as e:  # the address is taken or not ours to bind
        return ctx.fail(e)
    return exitcodes.OK
