"""``python -m node_agent device-plugin``: run the kubelet device plugin on this node.

Registered in ``node_agent.cli.commands``; the agent's global options give the host root
(``--host-root``), the NVML backend (``--nvml``, ``--nvml-state``) and the node name.

Flags keep NVIDIA's names (``--mig-strategy``, ``--device-list-strategy``, ...) and beat the
environment variables NVIDIA reads, which beat the config file. The config is either one file
(``--config-file``) or a directory of named configs (``--config-dir``, the components' ConfigMap)
chosen by the node label ``nvidia.com/device-plugin.config`` and switched live. SIGHUP reloads,
SIGTERM/SIGINT stop cleanly (sockets removed). Exit status 1 means a permanent failure.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from node_agent import nvml
from node_agent.cdi.driveredits import DriverEditsSource
from node_agent.cli import exitcodes
from node_agent.cli.context import AgentContext
from node_agent.deviceplugin import cdi, config, mps
from node_agent.deviceplugin.health import HealthBoard, HealthPolicy
from node_agent.deviceplugin.hostfiles import HostRootFiles
from node_agent.deviceplugin.metrics import PluginMetrics, StatusServer
from node_agent.deviceplugin.nodelabel import ConfigWatcher, LabelSource, add_config_source_arguments, config_selector
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices
from node_agent.deviceplugin.plugin import NodePlugins
from node_agent.host import HostRoot
from node_agent.host.driverroot import DriverRoot
from node_agent.kubelet.deviceplugin.api import DEVICE_PLUGIN_PATH
from node_agent.kubelet.deviceplugin.lifecycle import Supervisor

if TYPE_CHECKING:
    from node_agent.deviceplugin.nodewatch import NodeLabelWatch

log = logging.getLogger(__name__)

#: Matches the components' DaemonSet (``nvidia_gpu/components/manifests/workloads.py``).
DEFAULT_METRICS_PORT = 9401

_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _bool(text: str) -> bool:
    try:
        return _BOOL[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("device plugin (NVIDIA-compatible flags; unset flags fall back to env, then file)")
    g.add_argument("--mig-strategy", choices=[s.value for s in config.MigStrategy])
    g.add_argument("--fail-on-init-error", type=_bool, metavar="BOOL")
    g.add_argument("--pass-device-specs", type=_bool, metavar="BOOL")
    g.add_argument("--device-list-strategy", metavar="LIST",
                   help="comma list of envvar, volume-mounts, cdi-annotations, cdi-cri")
    g.add_argument("--device-id-strategy", choices=[s.value for s in config.DeviceIdStrategy])
    g.add_argument("--nvidia-driver-root")
    g.add_argument("--nvidia-dev-root")
    g.add_argument("--mps-root")
    g.add_argument("--cdi-annotation-prefix")
    g.add_argument("--nvidia-ctk-path")
    g.add_argument("--container-driver-root")
    g.add_argument("--shared-devices-allocation-policy", choices=[s.value for s in config.AllocationPolicy])
    add_config_source_arguments(g)
    g.add_argument("--config-poll-interval", type=float, default=5.0, metavar="SECONDS",
                   help="how often the mounted config files are re-read (the node label is watched)")
    g.add_argument("--socket-dir", type=Path, default=Path(DEVICE_PLUGIN_PATH),
                   help="kubelet's device-plugins directory, as mounted in this container")
    g.add_argument("--metrics-address", default="0.0.0.0")
    g.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT, help="0 disables the endpoint")
    g.add_argument("--recovery-quiet-period", type=float, default=60.0, metavar="SECONDS",
                   help="an unhealthy device that stays quiet and passes re-checks this long turns Healthy")
    g.add_argument("--cdi-hook-dir", default=None, metavar="PATH",
                   help="where this process sees the directory of nvidiaCTKPath (default: under --host-root)")
    g.add_argument("--recheck-interval", type=float, default=5.0, metavar="SECONDS")
    g.add_argument("--mps-daemon", type=_bool, default=True, metavar="BOOL",
                   help="run the MPS control daemon for MPS-shared resources (default true)")


def cli_overrides(args: argparse.Namespace) -> config.Overrides:
    fields = ("mig_strategy", "fail_on_init_error", "pass_device_specs", "device_list_strategy",
              "device_id_strategy", "nvidia_driver_root", "nvidia_dev_root", "mps_root", "cdi_annotation_prefix",
              "nvidia_ctk_path", "container_driver_root", "shared_devices_allocation_policy")
    values: dict[str, Any] = {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}
    try:
        return config.Overrides.model_validate(values)
    except Exception as e:
        raise config.ConfigError([str(e)], "flags") from e


class PluginProcess:
    """Everything one ``device-plugin`` process holds: NVML session, selector, supervisor, endpoints."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str], session: nvml.NvmlSession | None,
                 labels: LabelSource | None, *, host: HostRoot | None = None,
                 backend: nvml.NvmlBackend | None = None):
        self.args = args
        self.env = dict(env)
        self.session = session
        self._backend = backend
        self._stack = contextlib.ExitStack()
        root = host or HostRoot(getattr(args, "host_root", None) or "/")
        self.host = HostRootFiles(root)
        self.mps = mps.MpsDaemons(root, self.host)
        self.metrics = PluginMetrics()
        self.board = HealthBoard()  # outlives plugin restarts: health is not reset by kubelet restarts
        self.overrides = cli_overrides(args)
        self.selector = config_selector(args, labels)
        self.settings = self._load()[0]
        self.supervisor = Supervisor(args.socket_dir, self.build, self.metrics,
                                     fail_on_init_error=lambda: self.settings.fail_on_init_error)
        self.watcher = ConfigWatcher(self.selector, self.supervisor.request_reload, args.config_poll_interval)
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
        policy = HealthPolicy.from_env(self.env, self.args.recovery_quiet_period, self.args.recheck_interval)
        edits = None
        if settings.uses_cdi:
            edits = self._driver_edits(settings).edits(self.session.driver().driver_version)
        plugins = NodePlugins(self._node, settings, self.host, metrics=self.metrics, policy=policy,
                              board=self.board, driver_edits=edits)
        if self.args.mps_daemon:
            self.mps.ensure(mps.plan(plugins.resources, settings))
        return plugins

    def _driver_edits(self, settings: config.Settings) -> DriverEditsSource:
        """The driver's files under ``containerDriverRoot`` (named under ``nvidiaDriverRoot``) and the hook
        program at ``nvidiaCTKPath``, seen under ``--cdi-hook-dir`` or the host root."""
        root = DriverRoot(cdi.discovery_root(settings, self.host.root.path("/")))
        hook = settings.nvidia_ctk_path
        hook_dir = getattr(self.args, "cdi_hook_dir", None)
        seen = Path(hook_dir) / os.path.basename(hook) if hook_dir else self.host.root.path(hook)
        key = (root, settings.nvidia_driver_root, hook, seen)
        if self._edits is None or self._edits_key != key:
            self._edits, self._edits_key = DriverEditsSource(root, settings.nvidia_driver_root, hook, seen), key
        return self._edits

    def close(self) -> None:
        self.watcher.stop()
        self.mps.stop()
        if self._node is not None:
            self._node.close()
            self._node = None
        self._stack.close()


def register(subparsers: Any) -> None:
    """Hook for the agent CLI (``node_agent.cli.commands``): adds the ``device-plugin`` sub-command."""
    p = subparsers.add_parser("device-plugin", help="run the kubelet device plugin (nvidia.com/gpu, MIG, sharing)")
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT. Exit 0 after a requested stop, 1 after a permanent failure,
    3 for an invalid config file, environment or flag (the problem names the field)."""
    env = os.environ if env is None else env
    ctx = AgentContext.from_args(args)
    labels: NodeLabelWatch | None = None
    node_name = ctx.node_name or env.get("NODE_NAME")
    if args.config_dir is not None and node_name:
        # Only now the Kubernetes layer: a plugin serving one fixed config never loads it.
        from node_agent.deviceplugin.nodewatch import NodeLabelWatch, WatchTiming
        from node_agent.kube.errors import KubeError

        try:
            labels = NodeLabelWatch(node_name, args.config_label, kubeconfig=ctx.kubeconfig,
                                    timing=WatchTiming(relist_interval_s=args.config_poll_interval))
        except KubeError as e:
            log.warning("event=node-label-unavailable error=%s action=use-default-config", e)
    try:
        proc = PluginProcess(args, env, None, labels, host=ctx.host, backend=ctx.nvml_backend)
    except config.ConfigError as e:
        log.error("event=fatal error=%s", e)
        print(str(e), file=sys.stderr)
        return exitcodes.HOST_INPUT
    status = None
    if args.metrics_port:
        status = StatusServer(proc.metrics, proc.supervisor.live, proc.supervisor.ready,
                              args.metrics_address, args.metrics_port)
        status.start()
    previous = _install_signals(proc.supervisor)
    if args.config_dir is not None:
        proc.watcher.start()
        if labels is not None:
            labels.subscribe(proc.watcher.wake)
            labels.start()
    try:
        return proc.supervisor.run()
    finally:
        _restore_signals(previous)
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

