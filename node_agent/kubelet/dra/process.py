"""``python -m node_agent dra-driver``: run the DRA kubelet plugin on this node until SIGTERM.

Startup order: recover the checkpoint (roll back half-done prepares), publish this node's pool, serve
the DRA socket, then the registration socket (the kubelet only calls a plugin that is ready). Background
loops: inventory polling (republish within one interval of any change) and the uninstall watcher.
SIGTERM stops serving and removes the sockets; the slices stay (the kubelet wipes them 30 s after the
plugin disappears, and a restarted plugin finds them unchanged without bumping the generation).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from node_agent.cdi.driveredits import DEFAULT_HOOK_PATH, DriverEditsSource
from node_agent.cli.context import AgentContext
from node_agent.dra.api import KubeDraApi
from node_agent.dra.checkpoint import CheckpointError
from node_agent.dra.cleanup import UninstallWatcher
from node_agent.dra.devices import HealthAction
from node_agent.dra.driver import DEFAULT_STATE_DIR, DraDriver, DriverSettings
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.dra.sharing import NvidiaSmiSharing
from node_agent.kube.transport import Kube
from node_agent.kubelet.dra.server import PLUGINS_DIR, REGISTRY_DIR, PluginServer

log = logging.getLogger(__name__)

COMMAND = "dra-driver"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--driver-name", default="gpu.nvidia.com", help="DRA driver name (default: %(default)s)")
    p.add_argument("--health-action", choices=[a.value for a in HealthAction], default=HealthAction.WITHDRAW.value,
                   help="unhealthy GPUs are withdrawn from the slices, or tainted (needs DRADeviceTaints)")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="checkpoint and lock directory on the host")
    p.add_argument("--plugins-dir", default=PLUGINS_DIR, help="kubelet's plugin socket directory")
    p.add_argument("--registry-dir", default=REGISTRY_DIR, help="kubelet's plugin registration directory")
    p.add_argument("--poll-interval", type=float, default=0.5, help="inventory poll interval, seconds")
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


def register(subparsers: Any) -> None:
    """Hook for the agent CLI (``node_agent.cli.commands``): adds the ``dra-driver`` sub-command."""
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
    """Serve until SIGTERM/SIGINT; reads the agent's global options (host root, NVML, node, kubeconfig)."""
    ctx = AgentContext.from_args(args)
    host, node = ctx.host, ctx.require_node_name()
    settings = DriverSettings(driver=args.driver_name, node=node, state_dir=args.state_dir,
                              health=HealthAction(args.health_action), poll_interval=args.poll_interval)
    api = KubeDraApi(Kube.connect(ctx.kubeconfig, timeout=(5.0, 10.0)))  # a claim read on prepare's path: 10 s at most
    source = NvmlInventorySource(ctx.nvml_backend, host)
    driver = DraDriver(settings, api=api, source=source, host=host, backend=NvidiaSmiSharing(host),
                       driver_files=driver_edits_source(args, ctx))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        driver.start()
    except CheckpointError as e:  # e.g. the state directory is on a read-only file system
        log.error("event=dra-driver-start-failed error=%s", e)
        driver.close()
        source.close()
        return ctx.fail(e)
    server = PluginServer(driver, host, plugins_dir=args.plugins_dir, registry_dir=args.registry_dir)
    server.start()
    loops = [threading.Thread(target=driver.run_inventory_loop, args=(stop,), name="dra-inventory", daemon=True)]
    if args.uninstall_marker:
        watcher = UninstallWatcher(api, driver=settings.driver, marker=args.uninstall_marker, withdraw=driver.withdraw)
        loops.append(threading.Thread(target=watcher.run, args=(stop,), name="dra-uninstall", daemon=True))
    for t in loops:
        t.start()
    log.info("event=dra-driver-running driver=%s node=%s", settings.driver, node)
    stop.wait()
    server.stop()
    for t in loops:
        t.join(timeout=5)
    driver.close()
    source.close()
    log.info("event=dra-driver-stopped driver=%s node=%s", settings.driver, node)
    return 0
