"""One ``device-plugin`` process: run the kubelet device plugin on this node (the command line is
``node_agent.cli.device_plugin``; the agent's global options give the host root, the NVML backend and
the node name).

Flags keep NVIDIA's names (``--mig-strategy``, ``--device-list-strategy``, ...) and beat the
environment variables NVIDIA reads, which beat the config file. The config is either one file
(``--config-file``) or a directory of named configs (``--config-dir``, the components' ConfigMap)
chosen by the node label ``nvidia.com/device-plugin.config`` and switched live. SIGHUP reloads,
SIGTERM/SIGINT stop cleanly (sockets removed). Exit status 1 means a permanent failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from node_agent import nvml
from node_agent.cdi.driveredits import DriverEditsSource
from node_agent.deviceplugin import cdi, config, mps
from node_agent.deviceplugin.health import HealthBoard, HealthPolicy
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.nodelabel import ConfigSource, ConfigWatcher, LabelSource
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices
from node_agent.deviceplugin.plugin import NodePlugins
from node_agent.host import HostRoot
from node_agent.host.driverroot import DriverRoot
from node_agent.kube.errors import KubeError
from node_agent.kubelet.deviceplugin.api import DEVICE_PLUGIN_PATH
from node_agent.kubelet.deviceplugin.lifecycle import Supervisor
from node_agent.status.server import StatusServer

if TYPE_CHECKING:
    from node_agent.deviceplugin.nodewatch import NodeLabelWatch

log = logging.getLogger(__name__)

#: Matches the components' DaemonSet (``nvidia_gpu/components/manifests/workloads.py``).
DEFAULT_METRICS_PORT = 9401
#: The supervisor beats every half second while it waits; a loop silent this long is stuck (a hung
#: gRPC or NVML call) and the process exits for the kubelet to restart it.
STALL_EXIT_S = 90.0
#: Exit status of a process the watchdog ended.
EXIT_STALLED = 1


class Watchdog:
    """Ends the process when the supervisor stops beating.

    This is the liveness check, kept in the process rather than in a probe on the status port: that port
    is optional (``node_agent.status.server``), and a probe asking a port another process holds would
    restart a plugin that serves the kubelet well."""

    def __init__(self, live: Callable[[float], bool], *, stall_s: float = STALL_EXIT_S, every_s: float = 10.0,
                 exit_process: Callable[[int], object] = os._exit):
        self._live = live
        self._stall_s = stall_s
        self._every_s = every_s
        self._exit = exit_process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dp-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._every_s + 1)

    def _run(self) -> None:
        if self._stop.wait(self._stall_s):  # the supervisor's first start may take a while
            return
        while not self._stop.wait(self._every_s):
            if not self._live(self._stall_s):
                log.error("event=supervisor-stalled silent_s=%g action=exit", self._stall_s)
                self._exit(EXIT_STALLED)
                return

@dataclass(frozen=True)
class PluginOptions:
    """The ``device-plugin`` flags, parsed: NVIDIA's config overrides, the config source, the endpoints."""

    overrides: config.Overrides = field(default_factory=config.Overrides)
    source: ConfigSource = field(default_factory=ConfigSource)
    #: How often the mounted config files are re-read (the node label is watched).
    config_poll_interval: float = 5.0
    #: kubelet's device-plugins directory, as mounted in this container.
    socket_dir: Path = Path(DEVICE_PLUGIN_PATH)
    metrics_address: str = "0.0.0.0"
    #: 0 disables the status endpoint.
    metrics_port: int = DEFAULT_METRICS_PORT
    #: A taken status port stops the plugin (else it serves the kubelet without it and retries).
    metrics_required: bool = False
    #: An unhealthy device that stays quiet and passes re-checks this long turns Healthy.
    recovery_quiet_period: float = 60.0
    #: Where this process sees the directory of ``nvidiaCTKPath`` (None: under the host root).
    cdi_hook_dir: str | None = None
    recheck_interval: float = 5.0
    #: Serve an MPS-shared resource only once its MPS control daemon (the ``mps-daemon`` command, in its own
    #: DaemonSet) is up with this plugin's settings, as NVIDIA's plugin checks (``waitForMPSDaemon``).
    mps_daemon: bool = True
    #: How long one start waits for that daemon before it fails (and is retried, or ends the process
    #: with ``failOnInitError``, for the kubelet to restart it).
    mps_wait_s: float = 60.0


class PluginProcess:
    """Everything one ``device-plugin`` process holds: NVML session, selector, supervisor, endpoints."""

    def __init__(self, options: PluginOptions, env: Mapping[str, str], session: nvml.NvmlSession | None,
                 labels: LabelSource | None, *, host: HostRoot | None = None,
                 backend: nvml.NvmlBackend | None = None):
        self.options = options
        self.env = dict(env)
        self.session = session
        self._backend = backend
        self._stack = contextlib.ExitStack()
        self.host = host or HostRoot("/")
        self.metrics = PluginMetrics()
        self.board = HealthBoard()  # outlives plugin restarts: health is not reset by kubelet restarts
        self.overrides = options.overrides
        self.selector = options.source.selector(labels)
        self.settings = self._load()[0]
        self.supervisor = Supervisor(options.socket_dir, self.build, self.metrics,
                                     fail_on_init_error=lambda: self.settings.fail_on_init_error)
        self.watcher = ConfigWatcher(self.selector, self.supervisor.request_reload, options.config_poll_interval)
        self._node: NvmlNodeDevices | None = None
        self._edits: DriverEditsSource | None = None
        self._edits_key: tuple[object, ...] = ()

    def _load(self) -> tuple[config.Settings, Any, str | None]:
        sel, text = self.selector.read()
        settings = config.load(text, self.env, self.overrides, source=f"config {sel.name or '(none)'}")
        return settings, sel, text

    def build(self) -> NodePlugins:
        try:
            settings, sel, text = self._load()
        except config.ConfigError as e:
            log.error("event=config-invalid action=keep-previous error=%s", e)
            settings, sel, text = self.settings, self.selector.current, None
        else:
            self.watcher.remember(sel, text)
        self.settings = settings
        log.info("event=config name=%s settings=%s", getattr(sel, "name", None), config.dump_settings(settings))
        if self.session is None:
            if self._backend is None:
                raise RuntimeError("NVML is not available")
            try:  # opened on first use and retried on every restart until the driver is there
                self.session = self._stack.enter_context(nvml.open_nvml(self._backend))
            except nvml.NvmlUnavailable as e:
                raise RuntimeError(f"NVML is not available: {e}") from e
        if self._node is not None:
            self._node.close()
        self._node = NvmlNodeDevices(self.session)
        policy = HealthPolicy.from_env(self.env, self.options.recovery_quiet_period, self.options.recheck_interval)
        edits = None
        if settings.uses_cdi:
            edits = self._driver_edits(settings).edits(self.session.driver().driver_version)
        plugins = NodePlugins(self._node, settings, self.host, metrics=self.metrics, policy=policy,
                              board=self.board, driver_edits=edits)
        if self.options.mps_daemon:
            self._wait_for_mps(mps.plan(plugins.resources, settings), settings)
        return plugins

    def _wait_for_mps(self, daemons: list[mps.MpsDaemon], settings: config.Settings) -> None:
        """Wait until each daemon's ``mps-daemon`` reports it up with these settings; ``RuntimeError`` after
        ``mps_wait_s``. The plugin never starts or stops a daemon: a plugin restart leaves the clients'
        servers running (NVIDIA/k8s-device-plugin ``internal/plugin/server.go``, ``waitForMPSDaemon``)."""
        deadline = time.monotonic() + self.options.mps_wait_s
        for d in daemons:
            while (problem := mps.daemon_problem(self.host, d, settings.mps_root)) is not None:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"MPS control daemon for {d.resource} is not ready: {problem}")
                log.info("event=mps-daemon-wait resource=%s problem=%s", d.resource, problem)
                time.sleep(min(1.0, self.options.mps_wait_s))

    def _driver_edits(self, settings: config.Settings) -> DriverEditsSource:
        """The driver's files under ``containerDriverRoot`` (named under ``nvidiaDriverRoot``) and the hook
        program at ``nvidiaCTKPath``, seen under ``--cdi-hook-dir`` or the host root."""
        root = DriverRoot(cdi.discovery_root(settings, self.host.path("/")))
        hook = settings.nvidia_ctk_path
        hook_dir = self.options.cdi_hook_dir
        seen = Path(hook_dir) / os.path.basename(hook) if hook_dir else self.host.path(hook)
        key = (root, settings.nvidia_driver_root, hook, seen)
        if self._edits is None or self._edits_key != key:
            self._edits, self._edits_key = DriverEditsSource(root, settings.nvidia_driver_root, hook, seen), key
        return self._edits

    def close(self) -> None:
        self.watcher.stop()
        if self._node is not None:
            self._node.close()
            self._node = None
        self._stack.close()


def serve(options: PluginOptions, env: Mapping[str, str], *, host: HostRoot, backend: nvml.NvmlBackend,
          node_name: str | None, kubeconfig: Path | None) -> int:
    """Serve until SIGTERM/SIGINT: the supervisor's exit status, 0 after a requested stop, 1 after a
    permanent failure. Raises ``config.ConfigError`` for an invalid config file or environment."""
    labels: NodeLabelWatch | None = None
    if options.source.config_dir is not None and node_name:
        # Only now the Kubernetes client: a plugin serving one fixed config never loads it.
        from node_agent.deviceplugin.nodewatch import (  # noqa: PLC0415 - loads the Kubernetes client
            NodeLabelWatch,
            WatchTiming,
        )

        try:
            labels = NodeLabelWatch(node_name, options.source.config_label, kubeconfig=kubeconfig,
                                    timing=WatchTiming(relist_interval_s=options.config_poll_interval))
        except KubeError as e:
            log.warning("event=node-label-unavailable error=%s action=use-default-config", e)
    proc = PluginProcess(options, env, None, labels, host=host, backend=backend)
    status = None
    if options.metrics_port:
        status = StatusServer(proc.metrics, proc.supervisor.live, proc.supervisor.ready,
                              options.metrics_address, options.metrics_port, required=options.metrics_required)
        status.start()
    previous = _install_signals(proc.supervisor)
    watchdog = Watchdog(proc.supervisor.live)
    watchdog.start()
    if options.source.config_dir is not None:
        proc.watcher.start()
        if labels is not None:
            labels.subscribe(proc.watcher.wake)
            labels.start()
    try:
        return proc.supervisor.run()
    finally:
        _restore_signals(previous)
        watchdog.stop()
        if labels is not None:
            labels.stop()
        proc.close()
        if status is not None:
            status.stop()


def _install_signals(sup: Supervisor) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("event=signal signal=%s action=stop", signal.Signals(signum).name)
        sup.request_stop()

    def reload(signum: int, frame: FrameType | None) -> None:
        log.info("event=signal signal=SIGHUP action=reload")
        sup.request_reload("sighup")

    previous: dict[int, Any] = {}
    for sig, fn in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGQUIT, stop), (signal.SIGHUP, reload)):
        previous[sig] = signal.signal(sig, fn)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)

