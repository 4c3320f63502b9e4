"""``mps-daemon``: the MPS control daemons of an MPS node (``node_agent.deviceplugin.mpsdaemon``).

NVIDIA's ``mps-control-daemon`` binary, from the agent's image: it reads the device plugin's config
(the same flags: ``--config-file`` or ``--config-dir`` with the node label), starts
``nvidia-cuda-mps-control -d`` per MPS-shared resource with its GPUs in ``EXCLUSIVE_PROCESS``, and on
SIGTERM quits them and restores the compute modes. SIGHUP re-reads the config. Exit 0 after a clean
stop, 1 when the stop left a daemon or a compute mode behind or NVML is unavailable, 3 for an invalid flag.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

from node_agent import nvml
from node_agent.cli import exitcodes
from node_agent.cli.configsource import add_config_source_arguments, config_source
from node_agent.cli.context import AgentContext
from node_agent.cli.device_plugin import cli_overrides
from node_agent.deviceplugin import config
from node_agent.deviceplugin.mpsdaemon import DaemonOptions, MpsDaemonProcess

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Adds the ``mps-daemon`` sub-command."""
    p = subparsers.add_parser("mps-daemon", help="run the MPS control daemons of this node's MPS-shared GPUs")
    g = p.add_argument_group("MPS control daemon (reads the device plugin's config)")
    g.add_argument("--mig-strategy", choices=[s.value for s in config.MigStrategy],
                   help="the device plugin's MIG strategy (which devices are MPS-shared)")
    g.add_argument("--mps-root", help="host directory of the pipe, log and shm directories (the plugin's mpsRoot)")
    add_config_source_arguments(g)
    g.add_argument("--config-poll-interval", type=float, default=5.0, metavar="SECONDS",
                   help="how often the config is re-read (the node label is watched)")
    g.add_argument("--retry-interval", type=float, default=30.0, metavar="SECONDS",
                   help="after a failed start, when to try again (NVIDIA: 30s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    ctx = AgentContext.from_args(args)
    try:
        options = DaemonOptions(overrides=cli_overrides(args), source=config_source(args),
                                config_poll_interval=args.config_poll_interval, retry_s=args.retry_interval)
    except config.ConfigError as e:
        ctx.fail(e)
        return exitcodes.HOST_INPUT
    node_name = ctx.node_name or env.get("NODE_NAME")
    labels = None
    if options.source.config_dir is not None and node_name:
        # The Kubernetes client only for a config label to follow (a node name and a config directory).
        from node_agent.deviceplugin.nodewatch import NodeLabelWatch, WatchTiming  # noqa: PLC0415
        from node_agent.kube.errors import KubeError  # noqa: PLC0415

        try:
            labels = NodeLabelWatch(node_name, options.source.config_label, kubeconfig=ctx.kubeconfig,
                                    timing=WatchTiming(relist_interval_s=options.config_poll_interval))
        except KubeError as e:
            log.warning("event=node-label-unavailable error=%s action=use-default-config", e)
    try:
        with nvml.open_nvml(ctx.nvml_backend) as session:
            proc = MpsDaemonProcess(options, env, session, labels, ctx.host)
            previous = _install_signals(proc)
            if labels is not None:
                labels.subscribe(lambda: proc.request_reload("node-label"))
                labels.start()
            try:
                return proc.run()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                if labels is not None:
                    labels.stop()
    except nvml.NvmlUnavailable as e:
        return ctx.fail(e)


def _install_signals(proc: MpsDaemonProcess) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("event=signal signal=%s action=stop", signal.Signals(signum).name)
        proc.request_stop()

    def reload(signum: int, frame: FrameType | None) -> None:
        proc.request_reload("sighup")

    previous: dict[int, Any] = {}
    for sig, fn in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGQUIT, stop), (signal.SIGHUP, reload)):
        previous[sig] = signal.signal(sig, fn)
    return previous
