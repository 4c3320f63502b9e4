"""The ``mps-daemon`` process: NVIDIA's MPS control daemon container, run from the agent's image.

It reads the same device-plugin config the plugin serves (the group's ConfigMap, the named config the
node label picks), plans one MPS control daemon per MPS-shared resource (``node_agent.deviceplugin.mps``)
and keeps them running until SIGTERM, when it quits them and restores the GPUs' compute modes. It
re-reads the config every few seconds and at once on SIGHUP or a node-label change (NVIDIA's
``config-manager`` sidecar sends SIGHUP to ``mps-control-daemon``, ``cmd/mps-control-daemon/main.go``
restarts its daemons then); daemons whose plan did not change are left alone, so their clients keep
their servers. A start that fails is retried every ``retry_s`` (NVIDIA: 30 s).

The pod runs with ``hostPID`` (as NVIDIA's DRA driver runs its per-claim daemon, ``templates/
mps-control-daemon.tmpl.yaml``): the daemon and the ``nvidia-cuda-mps-server`` it forks then live in the
host's PID namespace, which MPS clients in other pods need to be seen by the server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from node_agent import nvml
from node_agent.deviceplugin import config, mps
from node_agent.deviceplugin.devices import DeviceError
from node_agent.deviceplugin.nodelabel import ConfigSource, LabelSource
from node_agent.deviceplugin.nvml_devices import to_gpu
from node_agent.deviceplugin.resources import build_resources
from node_agent.host import HostRoot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonOptions:
    """The ``mps-daemon`` flags, parsed."""

    overrides: config.Overrides = field(default_factory=config.Overrides)
    source: ConfigSource = field(default_factory=ConfigSource)
    #: How often the config (and so the plan) is re-read.
    config_poll_interval: float = 5.0
    #: After a failed start, the next try (NVIDIA's ``restartTimeout``: 30 s).
    retry_s: float = 30.0


class MpsDaemonProcess:
    """One node's MPS daemons, kept to the config (see the module docstring)."""

    def __init__(self, options: DaemonOptions, env: Mapping[str, str], session: nvml.NvmlSession,
                 labels: LabelSource | None, host: HostRoot):
        self.options = options
        self.env = dict(env)
        self.session = session
        self.host = host
        self.selector = options.source.selector(labels)
        self.daemons: mps.MpsDaemons | None = None
        self.daemons_root = ""
        self.wake = threading.Event()
        self.stopping = threading.Event()

    def plan(self) -> tuple[config.Settings, list[mps.MpsDaemon]]:
        """The daemons the current config asks for on this node's GPUs."""
        sel, text = self.selector.read()
        settings = config.load(text, self.env, self.options.overrides, source=f"config {sel.name or '(none)'}")
        gpus = [to_gpu(g) for g in self.session.inventory().gpus]
        return settings, mps.plan(build_resources(gpus, settings, self.host), settings)

    def reconcile(self) -> bool:
        """Bring the daemons to the plan; False (logged) when that failed and must be retried."""
        try:
            settings, planned = self.plan()
            root = (settings.mps_root or config.DEFAULT_MPS_ROOT).rstrip("/")
            if self.daemons is None or self.daemons_root != root:
                if self.daemons is not None:  # mpsRoot changed: the old root's daemons go first
                    self.daemons.stop()
                self.daemons = mps.MpsDaemons(self.host, self.host, mps.NvmlComputeModes(self.session), root)
                self.daemons_root = root
            self.daemons.ensure(planned)
        except (config.ConfigError, mps.MpsError, DeviceError, nvml.NvmlError, OSError) as e:
            log.error("event=mps-daemons-failed error=%s retry_in_s=%g", e, self.options.retry_s)
            return False
        if not planned:
            log.info("event=mps-no-resources detail=no resource is shared with MPS on this node; waiting")
        return True

    def request_reload(self, cause: str = "reload") -> None:
        log.info("event=mps-reload cause=%s", cause)
        self.wake.set()

    def request_stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def run(self) -> int:
        """Reconcile until :meth:`request_stop`; then quit the daemons and restore the compute modes.
        Exit status 0, or 1 when the stop left something (a daemon that would not quit, a mode not restored)."""
        while not self.stopping.is_set():
            ok = self.reconcile()
            self.wake.wait(self.options.config_poll_interval if ok else self.options.retry_s)
            self.wake.clear()
        return self.stop()

    def stop(self) -> int:
        if self.daemons is None:
            return 0
        problems = self.daemons.stop()
        for p in problems:
            log.error("event=mps-stop-incomplete problem=%s", p)
        return 1 if problems else 0
