"""One ``dra-driver`` process: run the DRA kubelet plugin on this node until SIGTERM (the command line is
``node_agent.cli.dra``).

Startup order: recover the checkpoint (roll back half-done prepares), publish this node's pool, serve
the DRA socket, then the registration socket (the kubelet only calls a plugin that is ready), and the
status endpoint (``/metrics`` of :mod:`node_agent.dra.metrics`, ``/readyz`` once registered). Background
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
from node_agent.kube import resource_v1
from node_agent.kube.transport import Kube
from node_agent.kube.watch import ListWatch, WatchTiming
from node_agent.kubelet.dra.server import PLUGINS_DIR, REGISTRY_DIR, PluginServer
from node_agent.nvml import NvmlBackend
from node_agent.status.server import RegistryRenderer, StatusServer

log = logging.getLogger(__name__)

#: The DRA plugin's status port (the device plugin serves on 9401, the exporter on 9400).
DEFAULT_METRICS_PORT = 9402


@dataclass(frozen=True)
class Endpoints:
    """Where the plugin serves: kubelet's plugin socket directory and its registration directory."""

    plugins_dir: str = PLUGINS_DIR
    registry_dir: str = REGISTRY_DIR
    #: The status endpoint (``/metrics``, ``/healthz``, ``/readyz``); port 0 disables it.
    metrics_address: str = "0.0.0.0"
    metrics_port: int = DEFAULT_METRICS_PORT
    #: A taken status port stops the plugin (else it serves the kubelet without it and retries).
    metrics_required: bool = False


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
    driver.metrics.watch_registration(lambda: server.registration.registered)
    loops = [threading.Thread(target=driver.run_inventory_loop, args=(stop,), name="dra-inventory", daemon=True)]
    # Anyone's change to this pool's slices (the kubelet deletes them when it starts; an operator's edit)
    # asks for a check against the API server at the next refresh; at rest the watch costs one request
    # per its timeout, where re-listing every 30 s cost two a minute.
    slices = ListWatch(Kube.connect(kubeconfig), resource_v1.SLICES,
                       field_selector=f"spec.driver={settings.driver},spec.nodeName={settings.node}",
                       on_list=lambda _items: driver.resync(), on_event=lambda _kind, _obj: driver.resync(),
                       timing=WatchTiming(relist_interval_s=settings.resync_interval), name="dra-slice-watch",
                       log_as="slice-watch")
    status = None
    if endpoints.metrics_port:
        # Bound before any socket is served, so a taken port that is required fails the start with
        # nothing to undo. Live while the inventory loop runs; ready once kubelet has accepted the
        # registration.
        try:
            status = StatusServer(RegistryRenderer(driver.metrics.registry), live=loops[0].is_alive,
                                  ready=lambda: server.registration.registered, not_ready=b"not registered\n",
                                  host=endpoints.metrics_address, port=endpoints.metrics_port,
                                  required=endpoints.metrics_required)
        except OSError:
            driver.close()
            source.close()
            raise
    server.start()
    if status is not None:
        status.start()
    if uninstall_marker:
        watcher = UninstallWatcher(api, driver=settings.driver, marker=uninstall_marker, withdraw=driver.withdraw)
        loops.append(threading.Thread(target=watcher.run, args=(stop,), name="dra-uninstall", daemon=True))
    for t in loops:
        t.start()
    slices.start()
    log.info("event=dra-driver-running driver=%s node=%s", settings.driver, settings.node)
    stop.wait()
    slices.stop()
    if status is not None:
        status.stop()
    server.stop()
    for t in loops:
        t.join(timeout=5)
    driver.close()
    source.close()
    log.info("event=dra-driver-stopped driver=%s node=%s", settings.driver, settings.node)
