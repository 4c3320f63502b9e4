"""``dra-driver``: the command line of the DRA kubelet plugin (``node_agent.kubelet.dra.process``).

Reads the agent's global options (host root, driver root, NVML, node, kubeconfig) and its own flags,
builds the driver's settings and CDI sources, and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from node_agent.cdi.driveredits import DEFAULT_HOOK_PATH, DriverEditsSource
from node_agent.cli import exitcodes
from node_agent.cli.context import AgentContext
from node_agent.cli.statusflags import add_status_arguments
from node_agent.dra.checkpoint import CheckpointError
from node_agent.dra.devices import HealthAction
from node_agent.dra.driver import DEFAULT_STATE_DIR, DriverSettings
from node_agent.kubelet.dra import process
from node_agent.kubelet.dra.server import PLUGINS_DIR, REGISTRY_DIR

COMMAND = "dra-driver"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--driver-name", default="gpu.nvidia.com", help="DRA driver name (default: %(default)s)")
    p.add_argument("--health-action", choices=[a.value for a in HealthAction], default=HealthAction.WITHDRAW.value,
                   help="unhealthy GPUs are withdrawn from the slices, or tainted (needs DRADeviceTaints)")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="checkpoint and lock directory on the host")
    p.add_argument("--plugins-dir", default=PLUGINS_DIR, help="kubelet's plugin socket directory")
    p.add_argument("--registry-dir", default=REGISTRY_DIR, help="kubelet's plugin registration directory")
    p.add_argument("--poll-interval", type=float, default=DriverSettings.poll_interval,
                   help="inventory poll interval, seconds (default %(default)s)")
    # CDI specs: the driver's files are found under --driver-root (as this process sees it) and named by
    # their host path under --nvidia-driver-root; the toolkit's hook program is used when it is seen.
    p.add_argument("--nvidia-driver-root", default=None, metavar="PATH",
                   help="the driver root's path on the node, for CDI specs (default: --driver-root)")
    p.add_argument("--cdi-hook-path", default=DEFAULT_HOOK_PATH, metavar="PATH",
                   help="host path of nvidia-cdi-hook (or nvidia-ctk) named in CDI specs (default: %(default)s)")
    p.add_argument("--cdi-hook-dir", default=None, metavar="PATH",
                   help="where this process sees the hook's directory (default: under --host-root)")
    p.add_argument("--uninstall-marker", default="", metavar="NAMESPACE/NAME",
                   help="ConfigMap whose deletion makes the plugin withdraw its ResourceSlices")
    add_status_arguments(p, process.DEFAULT_METRICS_PORT)


def register(subparsers: Any) -> None:
    """Adds the ``dra-driver`` sub-command."""
    p = subparsers.add_parser(COMMAND, help="run the DRA kubelet plugin (ResourceSlices, prepare/unprepare)")
    add_arguments(p)
    p.set_defaults(run=run)


def driver_edits_source(args: argparse.Namespace, ctx: AgentContext) -> DriverEditsSource:
    """Where CDI specs find the driver's files and the toolkit hook (see ``node_agent.cdi.driveredits``)."""
    root = ctx.driver_root
    host_root = args.nvidia_driver_root or str(root.path)
    hook = args.cdi_hook_path or None
    seen = None
    if hook:
        seen = Path(args.cdi_hook_dir) / os.path.basename(hook) if args.cdi_hook_dir else ctx.host.path(hook)
    return DriverEditsSource(root, host_root, hook, seen)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; exit 0 after a requested stop, the error's code when the driver cannot start."""
    ctx = AgentContext.from_args(args)
    settings = DriverSettings(driver=args.driver_name, node=ctx.require_node_name(), state_dir=args.state_dir,
                              health=HealthAction(args.health_action), poll_interval=args.poll_interval)
    try:
        process.serve(settings, host=ctx.host, nvml_backend=ctx.nvml_backend, kubeconfig=ctx.kubeconfig,
                      driver_files=driver_edits_source(args, ctx),
                      endpoints=process.Endpoints(args.plugins_dir, args.registry_dir, args.metrics_address,
                                                  args.metrics_port, args.metrics_port_required),
                      uninstall_marker=args.uninstall_marker)
    except (CheckpointError, OSError) as e:  # OSError: a required status port is taken or not ours to bind
        return ctx.fail(e)
    return exitcodes.OK
