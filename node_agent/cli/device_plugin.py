"""``device-plugin``: the command line of the kubelet device plugin (``node_agent.kubelet.deviceplugin.process``).

Flags keep NVIDIA's names (``--mig-strategy``, ``--device-list-strategy``, ...) and beat the environment
variables NVIDIA reads, which beat the config file. Exit 0 after a requested stop, 1 after a permanent
failure, 3 for an invalid config file, environment or flag (the problem names the field).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.configsource import add_config_source_arguments, config_source
from node_agent.cli.context import AgentContext
from node_agent.cli.statusflags import add_status_arguments
from node_agent.deviceplugin import config
from node_agent.kubelet.deviceplugin import process
from node_agent.kubelet.deviceplugin.api import DEVICE_PLUGIN_PATH
from node_agent.kubelet.deviceplugin.process import DEFAULT_METRICS_PORT, PluginOptions
from node_agent.status.server import StatusPortError

log = logging.getLogger(__name__)

_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _bool(text: str) -> bool:
    try:
        return _BOOL[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("device plugin (NVIDIA-compatible flags; unset flags fall back to env, then file)")
    g.add_argument("--mig-strategy", choices=[s.value for s in config.MigStrategy],
                   help="how MIG devices are offered: none (whole GPUs), single (nvidia.com/gpu), mixed "
                        "(nvidia.com/mig-<profile>)")
    g.add_argument("--fail-on-init-error", type=_bool, metavar="BOOL",
                   help="exit when a start fails (NVML, config); false: log it and wait")
    g.add_argument("--pass-device-specs", type=_bool, metavar="BOOL",
                   help="list the device nodes in each Allocate answer (for runtimes without the NVIDIA hook)")
    g.add_argument("--device-list-strategy", metavar="LIST",
                   help="comma list of envvar, volume-mounts, cdi-annotations, cdi-cri")
    g.add_argument("--device-id-strategy", choices=[s.value for s in config.DeviceIdStrategy],
                   help="how a container is told its GPUs: by UUID or by index")
    g.add_argument("--nvidia-driver-root", help="where the driver is on the host (/, or a driver container's root)")
    g.add_argument("--nvidia-dev-root", help="where the /dev/nvidia* nodes are on the host (default: the driver root)")
    g.add_argument("--mps-root", help="host directory of the MPS control daemons' pipe, log and shm directories")
    g.add_argument("--cdi-annotation-prefix", help="the key prefix of the cdi-annotations device list strategy")
    g.add_argument("--nvidia-ctk-path", help="the nvidia-ctk (and its CDI hook) the generated CDI specs name")
    g.add_argument("--container-driver-root", help="where this container sees the driver root (for the CDI specs)")
    g.add_argument("--shared-devices-allocation-policy", choices=[s.value for s in config.AllocationPolicy],
                   help="which replicas of shared GPUs a request prefers: distributed (the least used GPUs) or "
                        "packed (the most used)")
    add_config_source_arguments(g)
    g.add_argument("--config-poll-interval", type=float, default=5.0, metavar="SECONDS",
                   help="how often the mounted config files are re-read (the node label is watched)")
    g.add_argument("--socket-dir", type=Path, default=Path(DEVICE_PLUGIN_PATH),
                   help="kubelet's device-plugins directory, as mounted in this container")
    add_status_arguments(g, DEFAULT_METRICS_PORT)
    g.add_argument("--recovery-quiet-period", type=float, default=60.0, metavar="SECONDS",
                   help="an unhealthy device that stays quiet and passes re-checks this long turns Healthy")
    g.add_argument("--cdi-hook-dir", default=None, metavar="PATH",
                   help="where this process sees the directory of nvidiaCTKPath (default: under --host-root)")
    g.add_argument("--recheck-interval", type=float, default=5.0, metavar="SECONDS",
                   help="how often unhealthy devices are read again for recovery")
    g.add_argument("--mps-daemon", type=_bool, default=True, metavar="BOOL",
                   help="serve MPS-shared resources only once their control daemon (mps-daemon) is up "
                        "(default true)")
    g.add_argument("--mps-wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long one start waits for the MPS control daemon")


def cli_overrides(args: argparse.Namespace) -> config.Overrides:
    """NVIDIA's flags that override the config file; an invalid combination is a ``ConfigError`` naming it."""
    fields = ("mig_strategy", "fail_on_init_error", "pass_device_specs", "device_list_strategy",
              "device_id_strategy", "nvidia_driver_root", "nvidia_dev_root", "mps_root", "cdi_annotation_prefix",
              "nvidia_ctk_path", "container_driver_root", "shared_devices_allocation_policy")
    values: dict[str, Any] = {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}
    try:
        return config.Overrides.model_validate(values)
    except Exception as e:
        raise config.ConfigError([str(e)], "flags") from e


def options(args: argparse.Namespace) -> PluginOptions:
    """The flags of :func:`add_arguments`, parsed; raises ``config.ConfigError`` for invalid overrides."""
    return PluginOptions(
        overrides=cli_overrides(args), source=config_source(args), config_poll_interval=args.config_poll_interval,
        socket_dir=args.socket_dir, metrics_address=args.metrics_address, metrics_port=args.metrics_port,
        metrics_required=args.metrics_port_required,
        recovery_quiet_period=args.recovery_quiet_period, cdi_hook_dir=args.cdi_hook_dir,
        recheck_interval=args.recheck_interval, mps_daemon=args.mps_daemon, mps_wait_s=args.mps_wait,
    )


def register(subparsers: Any) -> None:
    """Adds the ``device-plugin`` sub-command."""
    p = subparsers.add_parser("device-plugin", help="run the kubelet device plugin (nvidia.com/gpu, MIG, sharing)")
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT (see the module docstring for the exit codes)."""
    env = os.environ if env is None else env
    ctx = AgentContext.from_args(args)
    try:
        return process.serve(options(args), env, host=ctx.host, backend=ctx.nvml_backend,
                             node_name=ctx.node_name or env.get("NODE_NAME"), kubeconfig=ctx.kubeconfig)
    except config.ConfigError as e:
        log.error("event=fatal error=%s", e)
        print(str(e), file=sys.stderr)
        return exitcodes.HOST_INPUT
    except StatusPortError as e:  # --metrics-port-required and the port is taken or not ours to bind
        return ctx.fail(e)
