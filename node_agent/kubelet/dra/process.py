"""One ``dra-driver`` process: run the DRA kubelet plugin on this node until SIGTERM (the command line is
``node_agent.cli.dra``).

Startup order: recover the checkpoint (roll back half-done prepares), publish this node's pool, serve
the DRA socket, then the registration socket (the kubelet only calls a plugin that is ready). Background
loops: inventory polling (republish within one interval of any change) and the uninstall watcher.
SIGTERM stops serving and removes the sockets; the slices stay (the kubelet wipes them 30 s after the
plugin disappears, and a restarted plugin finds them unchanged without bumping the generation).
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from node_agent.cdi.driveredits import DriverEditsSource
from node_agent.dra.api import KubeDraApi
from node_agent.dra.checkpoint import CheckpointError
from node_agent.dra.cleanup import UninstallWatcher
from node_agent.dra.driver import DraDriver, DriverSettings
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.dra.sharing import NvidiaSmiSharing
from node_agent.host import HostRoot
from node_agent.kube.transport import Kube
from node_agent.kubelet.dra.server import PLUGINS_DIR, REGISTRY_DIR, PluginServer
from node_agent.nvml import NvmlBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoints:
    """Where the plugin serves: kubelet's plugin socket directory and its registration directory."""

    plugins_dir: str = PLUGINS_DIR
    registry_dir: str = REGISTRY_DIR


def serve(settings: DriverSettings, *, host: HostRoot, nvml_backend: NvmlBackend, kubeconfig: Path | None,
          driver_files: DriverEditsSource, endpoints: Endpoints = Endpoints(), uninstall_marker: str = "") -> None:
    """Serve until SIGTERM/SIGINT. Raises ``CheckpointError`` when the driver cannot start (e.g. the state
    directory is on a read-only file system), after closing what it opened."""
    api = KubeDraApi(Kube.connect(kubeconfig, timeout=(5.0, 10.0)))  # a claim read on prepare's path: 10 s at most
    source = NvmlInventorySource(nvml_backend, host)
    driver = DraDriver(settings, api=api, source=source, host=host, backend=NvidiaSmiSharing(host),
                       driver_files=driver_files)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        driver.start()
    except CheckpointError as e:
        log.error("event=dra-driver-start-failed error=%s", e)
        driver.close()
        source.close()
        raise
    server = PluginServer(driver, host, plugins_dir=endpoints.plugins_dir, registry_dir=endpoints.registry_dir)
    server.start()
    loops = [threading.Thread(target=driver.run_inventory_loop, args=(stop,), name="dra-inventory", daemon=True)]
    if uninstall_marker:
        watcher = UninstallWatcher(api, driver=settings.driver, marker=uninstall_marker, withdraw=driver.withdraw)
        loops.append(threading.Thread(target=watcher.run, args=(stop,), name="dra-uninstall", daemon=True))
    for t in loops:
        t.start()
    log.info("event=dra-driver-running driver=%s node=%s", settings.driver, settings.node)
    stop.wait()
    server.stop()
    for t in loops:
        t.join(timeout=5)
    driver.close()
    source.close()
    log.info("event=dra-driver-stopped driver=%s node=%s", settings.driver, settings.node)
