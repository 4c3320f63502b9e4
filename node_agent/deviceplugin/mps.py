"""MPS control daemons for resources shared with MPS: started before the plugin serves, quit on stop.

NVIDIA runs these in a separate ``mps-control-daemon`` DaemonSet; here the plugin owns them, so a
node in MPS mode needs nothing else. One daemon per MPS resource, with its pipe and log directories
under ``mpsRoot/<resource>`` (the pipe directory is what Allocate mounts into clients) and the GPUs of
that resource visible. Once up, the daemon gets each client's share as defaults: the active-thread
percentage and the pinned device memory limit, both ``1/replicas`` of the GPU (what NVIDIA's daemon
sets; clients get the same limits in their environment and can only lower them).

The daemon binary is ``nvidia-cuda-mps-control`` from the driver, run through the host layer's
command runner (``HostRoot.run``), with its environment passed through ``env``.

The daemon, and the ``nvidia-cuda-mps-server`` it forks for clients, run in the plugin container's
memory cgroup: the DaemonSet of an MPS group gets a limit sized for them
(``nvidia_gpu.components.manifests.workloads.device_plugin_resources``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from node_agent.deviceplugin.allocate import mps_client_limits
from node_agent.deviceplugin.config import Settings, SharingStrategy
from node_agent.deviceplugin.devices import HostFiles
from node_agent.deviceplugin.resources import Resource

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
COMMAND_TIMEOUT_S = 30.0


class MpsError(RuntimeError):
    """An MPS daemon could not be started or configured."""


class CommandResultLike(Protocol):
    @property
    def returncode(self) -> int: ...

    @property
    def stderr(self) -> str: ...


class CommandRunner(Protocol):
    """Runs a host command (``node_agent.host.HostRoot`` satisfies this)."""

    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = ...,
            stdin: str | None = ...) -> CommandResultLike: ...


@dataclass(frozen=True)
class MpsDaemon:
    resource: str
    pipe_dir: str
    log_dir: str
    visible: tuple[str, ...]  #: GPU UUIDs, in ordinal order for the daemon and its clients
    active_thread_percentage: int
    pinned_memory_mib: tuple[int, ...]

    def _env(self) -> list[str]:
        return ["env", f"CUDA_VISIBLE_DEVICES={','.join(self.visible)}", f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}",
                f"CUDA_MPS_LOG_DIRECTORY={self.log_dir}"]

    def start_argv(self) -> list[str]:
        return [*self._env(), MPS_CONTROL, "-d"]

    def control_argv(self) -> list[str]:
        return [*self._env(), MPS_CONTROL]

    def defaults(self) -> str:
        """Control commands that set every new client's share."""
        lines = [f"set_default_active_thread_percentage {self.active_thread_percentage}"]
        lines += [f"set_default_device_pinned_mem_limit {ordinal} {mib}M"
                  for ordinal, mib in enumerate(self.pinned_memory_mib)]
        return "\n".join(lines) + "\n"


def plan(resources: Sequence[Resource], settings: Settings) -> list[MpsDaemon]:
    out = []
    root = settings.mps_root.rstrip("/")
    for r in resources:
        if r.sharing is not SharingStrategy.MPS:
            continue
        physical = list({d.uuid: d for d in r.devices}.values())
        limits = mps_client_limits(r, physical)
        base = f"{root}/{r.base_name}"
        out.append(MpsDaemon(resource=r.name, pipe_dir=f"{base}/pipe", log_dir=f"{base}/log",
                             visible=tuple(d.uuid for d in physical),
                             active_thread_percentage=limits.active_thread_percentage,
                             pinned_memory_mib=limits.pinned_memory_mib))
    return out


class MpsDaemons:
    """The process's MPS daemons. They outlive plugin restarts (kubelet restarts, reloads), so running
    clients keep their server; a daemon is restarted only when its plan changes."""

    def __init__(self, runner: CommandRunner, host: HostFiles):
        self._runner = runner
        self._host = host
        self.running: dict[str, MpsDaemon] = {}

    def _run(self, argv: Sequence[str], stdin: str | None, what: str) -> None:
        try:
            result = self._runner.run(argv, timeout_s=COMMAND_TIMEOUT_S, stdin=stdin)
        except Exception as e:
            raise MpsError(f"MPS daemon {what}: {e}") from e
        if result.returncode != 0:
            raise MpsError(f"MPS daemon {what}: exit {result.returncode}: {result.stderr.strip()}")

    def _quit(self, d: MpsDaemon) -> None:
        try:
            self._run(d.control_argv(), "quit\n", f"{d.resource} quit")
        except MpsError as e:
            log.warning("event=mps-quit-failed resource=%s error=%s", d.resource, e)

    def _start(self, d: MpsDaemon) -> None:
        # The settings file records the daemon's shares and creates its directories.
        self._host.write_atomic(f"{d.log_dir}/plugin-settings.json", json.dumps(asdict(d), sort_keys=True) + "\n")
        self._host.write_atomic(f"{d.pipe_dir}/.keep", "")
        try:
            # A daemon already serving this pipe (left by an earlier agent process) is adopted.
            self._run(d.control_argv(), d.defaults(), f"{d.resource} defaults")
            log.info("event=mps-daemon-adopted resource=%s", d.resource)
            return
        except MpsError:
            pass
        self._run(d.start_argv(), None, f"{d.resource} start")
        self._run(d.control_argv(), d.defaults(), f"{d.resource} defaults")
        log.info("event=mps-daemon-started resource=%s gpus=%d threads=%d%%", d.resource, len(d.visible),
                 d.active_thread_percentage)

    def ensure(self, daemons: Sequence[MpsDaemon]) -> None:
        """Make the running daemons match ``daemons``: quit the stale, start the new or changed."""
        wanted = {d.resource: d for d in daemons}
        for name, d in list(self.running.items()):
            if wanted.get(name) != d:
                self._quit(d)
                del self.running[name]
        for name, d in wanted.items():
            if name not in self.running:
                self._start(d)
                self.running[name] = d

    def stop(self) -> None:
        for d in self.running.values():
            self._quit(d)
        self.running = {}
