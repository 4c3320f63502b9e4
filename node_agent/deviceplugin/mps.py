"""MPS control daemons for resources shared with MPS, run as NVIDIA runs them: apart from the plugin.

NVIDIA runs the daemons in their own DaemonSet (``mps-control-daemon``, NVIDIA/k8s-device-plugin
``deployments/helm/nvidia-device-plugin/templates/daemonset-mps-control-daemon.yml``,
``cmd/mps-control-daemon/``); here that is the agent's ``mps-daemon`` command
(``node_agent.deviceplugin.mpsdaemon``) in the ``mps-control-daemon`` DaemonSet of an MPS group, so a
restart of the device plugin (an upgrade, a kubelet restart, an OOM kill) leaves every client's server up.

What one daemon does, as ``cmd/mps-control-daemon/mps/daemon.go`` does:

* ``Start``: the GPUs it serves go to ``EXCLUSIVE_PROCESS`` (NVIDIA: ``nvidia-smi -i <uuid> -c
  EXCLUSIVE_PROCESS``; here NVML's ``nvmlDeviceSetComputeMode``), its pipe and log directories are made
  under ``mpsRoot/<resource>``, ``nvidia-cuda-mps-control -d`` starts with ``CUDA_MPS_PIPE_DIRECTORY`` and
  ``CUDA_MPS_LOG_DIRECTORY`` (and, unlike NVIDIA's TODO, ``CUDA_VISIBLE_DEVICES`` of the resource's GPUs),
  then each client's share is set as the defaults, ``set_default_device_pinned_mem_limit <i> <MiB>M`` per
  GPU and ``set_default_active_thread_percentage <100/replicas>``, and ``<resource>/.started`` is written;
  once every daemon is up, ``mpsRoot/.ready``.
* ``Stop``: ``echo quit | nvidia-cuda-mps-control``, the compute mode goes back, ``.started`` goes.

Two differences, both on purpose: the compute mode goes back to what it was before the daemon started
(NVIDIA sets ``DEFAULT``), read from a state file written *before* the change (``compute-modes.json``
under ``mpsRoot``), so a daemon container that crashed and restarted still restores the operator's mode,
not the ``EXCLUSIVE_PROCESS`` it finds; and a daemon already serving a pipe directory (left by a crashed
container: the daemon runs in the host's PID namespace) is adopted rather than failing its ``-d``.

The device plugin runs none of this: it advertises the replicas and, before serving a resource, waits
for its daemon's ``.started`` to match its own plan (:func:`daemon_problem`; NVIDIA's plugin asks the
daemon ``get_default_active_thread_percentage``, which an unprivileged plugin cannot run, needing a
``chroot`` into the driver root), then mounts the pipe directory and ``mpsRoot/shm`` into clients.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from node_agent import nvml
from node_agent.deviceplugin.allocate import mps_client_limits
from node_agent.deviceplugin.config import Settings, SharingStrategy
from node_agent.deviceplugin.devices import HostFiles
from node_agent.deviceplugin.resources import Resource
from node_agent.host import HostError

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
COMMAND_TIMEOUT_S = 30.0
#: The compute mode NVIDIA's daemon puts its GPUs in (``computeModeExclusiveProcess``, ``daemon.go``).
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
#: Under ``mpsRoot``: every daemon is up (NVIDIA's ``/mps/.ready``, ``cmd/mps-control-daemon/main.go``).
READY_FILE = ".ready"
#: Under ``mpsRoot/<resource>``: this daemon is up, with these settings (NVIDIA's ``.started``, ``root.go``).
STARTED_FILE = ".started"
#: Under ``mpsRoot``: each GPU's compute mode before a daemon first changed it (restored on stop).
COMPUTE_MODES_FILE = "compute-modes.json"


class MpsError(RuntimeError):
    """An MPS daemon could not be started or configured."""


class CommandResultLike(Protocol):
    @property
    def returncode(self) -> int: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class CommandRunner(Protocol):
    """Runs a host command (``node_agent.host.HostRoot`` satisfies this)."""

    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = ...,
            stdin: str | None = ..., env: Mapping[str, str] | None = ...) -> CommandResultLike: ...


class ComputeModes(Protocol):
    """A GPU's compute mode by UUID (:class:`NvmlComputeModes` over an NVML session)."""

    def compute_mode(self, uuid: str) -> str: ...

    def set_compute_mode(self, uuid: str, mode: str) -> None: ...


class NvmlComputeModes:
    """:class:`ComputeModes` through NVML (``nvmlDeviceGet/SetComputeMode``), GPUs found by UUID."""

    def __init__(self, session: nvml.NvmlSession) -> None:
        self._session = session

    def _index(self, uuid: str) -> int:
        for g in self._session.inventory().gpus:
            if g.uuid == uuid:
                return g.index
        raise MpsError(f"GPU {uuid}: not on this node (or lost)")

    def compute_mode(self, uuid: str) -> str:
        return self._session.compute_mode(self._index(uuid))

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self._session.set_compute_mode(self._index(uuid), mode)


@dataclass(frozen=True)
class MpsDaemon:
    resource: str
    pipe_dir: str
    log_dir: str
    visible: tuple[str, ...]  #: GPU UUIDs, in ordinal order for the daemon and its clients
    active_thread_percentage: int
    pinned_memory_mib: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """The daemon's and its control commands' environment (NVIDIA's ``Envvars``, plus the GPUs)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.visible), "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
                "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def start_argv(self) -> list[str]:
        return [MPS_CONTROL, "-d"]

    def control_argv(self) -> list[str]:
        return [MPS_CONTROL]

    def defaults(self) -> str:
        """Control commands that set every new client's share."""
        lines = [f"set_default_active_thread_percentage {self.active_thread_percentage}"]
        lines += [f"set_default_device_pinned_mem_limit {ordinal} {mib}M"
                  for ordinal, mib in enumerate(self.pinned_memory_mib)]
        return "\n".join(lines) + "\n"

    @property
    def started_file(self) -> str:
        return f"{self.pipe_dir.rsplit('/', 1)[0]}/{STARTED_FILE}"

    def record(self) -> str:
        """What ``.started`` holds: the settings this daemon runs with (the plugin compares its own plan)."""
        return json.dumps(asdict(self), sort_keys=True) + "\n"


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


def daemon_problem(host: HostFiles, daemon: MpsDaemon, mps_root: str) -> str | None:
    """Why the device plugin may not serve ``daemon``'s resource yet (None: its daemon is up, with the
    settings the plugin advertises); read from the files the ``mps-daemon`` command writes."""
    root = mps_root.rstrip("/")
    try:
        if not host.exists(f"{root}/{READY_FILE}"):
            return f"{root}/{READY_FILE} is missing (is the mps-control-daemon pod running on this node?)"
        started = host.read_text_or_none(daemon.started_file)
    except HostError as e:
        return str(e)
    if started is None:
        return f"{daemon.started_file} is missing"
    if started != daemon.record():
        return f"{daemon.started_file} names other settings than this plugin's (the daemon has not reloaded yet)"
    return None


class _SavedModes(BaseModel):
    """``compute-modes.json``: the agent's own file, read leniently. ``previous``: GPU UUID -> the compute mode
    to restore; ``daemons``: resource -> the :meth:`MpsDaemon.record` of each daemon started and not yet quit
    (so a restarted container quits one its new plan no longer has)."""

    model_config = ConfigDict(extra="ignore")

    version: Literal["v1"] = "v1"
    previous: dict[str, str] = {}
    daemons: dict[str, str] = {}


class MpsDaemons:
    """The ``mps-daemon`` process's daemons and the compute modes it changed.

    Each GPU's compute mode is recorded in ``compute-modes.json`` before it is first changed and only
    then set to ``EXCLUSIVE_PROCESS``; a record already there (the process crashed and restarted) is kept,
    so stop restores the mode the GPU had before any daemon, whatever it finds then."""

    def __init__(self, runner: CommandRunner, host: HostFiles, modes: ComputeModes, mps_root: str):
        self._runner = runner
        self._host = host
        self._modes = modes
        self._root = mps_root.rstrip("/")
        self.running: dict[str, MpsDaemon] = {}

    # -- compute modes ---------------------------------------------------------------------------
    @property
    def _modes_file(self) -> str:
        return f"{self._root}/{COMPUTE_MODES_FILE}"

    def _load(self) -> _SavedModes:
        text = self._host.read_text_or_none(self._modes_file)
        if not text:
            return _SavedModes()
        try:
            return _SavedModes.model_validate_json(text)
        except ValidationError as e:
            raise MpsError(f"{self._modes_file}: unreadable ({e.errors()[0]['msg']}); fix or remove it") from e

    def saved_modes(self) -> dict[str, str]:
        """GPU UUID -> the compute mode to restore."""
        return dict(self._load().previous)

    def _save_modes(self, previous: dict[str, str]) -> None:
        state = self._load()
        self._host.write_atomic(self._modes_file, state.model_copy(update={"previous": previous}).model_dump_json()
                                + "\n")

    def _save_daemon(self, resource: str, record: str | None) -> None:
        state = self._load()
        daemons = {k: v for k, v in state.daemons.items() if k != resource}
        if record is not None:
            daemons[resource] = record
        self._host.write_atomic(self._modes_file, state.model_copy(update={"daemons": daemons}).model_dump_json()
                                + "\n")

    def _left_running(self, wanted: Mapping[str, MpsDaemon]) -> list[MpsDaemon]:
        """Daemons an earlier process started and never quit that the plan no longer has."""
        out = []
        for resource, record in self._load().daemons.items():
            if resource in wanted or resource in self.running:
                continue
            try:
                fields = json.loads(record)
                out.append(MpsDaemon(**{**fields, "visible": tuple(fields["visible"]),
                                        "pinned_memory_mib": tuple(fields["pinned_memory_mib"])}))
            except (ValueError, TypeError, KeyError) as e:
                log.warning("event=mps-record-unreadable resource=%s error=%s action=forget", resource, e)
                self._save_daemon(resource, None)
        return out

    def _exclusive(self, d: MpsDaemon) -> None:
        saved = self.saved_modes()
        try:
            for uuid in d.visible:
                if uuid not in saved:
                    saved[uuid] = self._modes.compute_mode(uuid)
            self._save_modes(saved)  # before any change: a crash from here on still restores these
            for uuid in d.visible:
                self._modes.set_compute_mode(uuid, EXCLUSIVE_PROCESS)
        except nvml.NvmlError as e:
            raise MpsError(f"MPS daemon {d.resource}: set compute mode {EXCLUSIVE_PROCESS}: {e}") from e

    def _restore(self, uuids: Sequence[str]) -> list[str]:
        """Put ``uuids`` back in their recorded modes; the problems (each GPU that failed stays recorded)."""
        saved = self.saved_modes()
        problems = []
        for uuid in uuids:
            mode = saved.get(uuid)
            if mode is None:
                continue
            try:
                self._modes.set_compute_mode(uuid, mode)
            except (nvml.NvmlError, MpsError) as e:
                problems.append(f"GPU {uuid}: restore compute mode {mode}: {e}")
                continue
            del saved[uuid]
            log.info("event=compute-mode-restored gpu=%s mode=%s", uuid, mode)
        self._save_modes(saved)
        return problems

    # -- daemons ---------------------------------------------------------------------------------
    def _run(self, d: MpsDaemon, argv: Sequence[str], stdin: str | None, what: str) -> CommandResultLike:
        try:
            result = self._runner.run(argv, timeout_s=COMMAND_TIMEOUT_S, stdin=stdin, env=d.env())
        except Exception as e:
            raise MpsError(f"MPS daemon {d.resource} {what}: {e}") from e
        if result.returncode != 0:
            raise MpsError(f"MPS daemon {d.resource} {what}: exit {result.returncode}: {result.stderr.strip()}")
        return result

    def _quit(self, d: MpsDaemon) -> str | None:
        self._host.remove(d.started_file)
        try:
            self._run(d, d.control_argv(), "quit\n", "quit")
        except MpsError as e:
            if self.healthy(d):
                log.warning("event=mps-quit-failed resource=%s error=%s", d.resource, e)
                return str(e)
        self._save_daemon(d.resource, None)  # quit, or none was running
        log.info("event=mps-daemon-stopped resource=%s", d.resource)
        return None

    def healthy(self, d: MpsDaemon) -> bool:
        """The daemon answers on its pipe (NVIDIA's ``AssertHealthy``)."""
        try:
            self._run(d, d.control_argv(), "get_default_active_thread_percentage\n", "health")
        except MpsError:
            return False
        return True

    def _start(self, d: MpsDaemon) -> None:
        self._exclusive(d)
        # The settings file records the daemon's shares and creates its directories.
        self._host.write_atomic(f"{d.log_dir}/plugin-settings.json", json.dumps(asdict(d), sort_keys=True) + "\n")
        self._host.write_atomic(f"{d.pipe_dir}/.keep", "")
        running = self.healthy(d)
        if running and self._host.read_text_or_none(d.started_file) != d.record():
            # Started for another plan (other GPUs, other replicas) before this container restarted: its
            # server would keep the old GPUs and shares, so it is restarted.
            self._quit(d)
            running = False
        if running:
            # A daemon already serving this pipe with this plan (the container crashed; the daemon lives in
            # the host's PID namespace) is adopted and given this plan's defaults.
            log.info("event=mps-daemon-adopted resource=%s", d.resource)
        else:
            self._run(d, d.start_argv(), None, "start")
            log.info("event=mps-daemon-started resource=%s gpus=%d threads=%d%%", d.resource, len(d.visible),
                     d.active_thread_percentage)
        self._save_daemon(d.resource, d.record())
        self._run(d, d.control_argv(), d.defaults(), "defaults")
        self._host.write_atomic(d.started_file, d.record())

    def ensure(self, daemons: Sequence[MpsDaemon]) -> None:
        """Make the running daemons match ``daemons``: quit the stale (their GPUs' modes restored), start
        the new or changed, then mark the node ready. Raises :class:`MpsError` (ready stays unset)."""
        wanted = {d.resource: d for d in daemons}
        stale = [d for name, d in self.running.items() if wanted.get(name) != d] + self._left_running(wanted)
        if stale:
            self._host.remove(f"{self._root}/{READY_FILE}")
        for d in stale:
            self._quit(d)
            self.running.pop(d.resource, None)
        # GPUs no daemon serves any more (also those an earlier process changed) get their modes back.
        keep = {u for w in wanted.values() for u in w.visible}
        for p in self._restore([u for u in self.saved_modes() if u not in keep]):
            log.warning("event=compute-mode-restore-failed problem=%s", p)
        for name, d in wanted.items():
            if name not in self.running:
                self._start(d)
                self.running[name] = d
        self._host.write_atomic(f"{self._root}/{READY_FILE}", "".join(sorted(wanted)) + "\n")

    def stop(self) -> list[str]:
        """Quit every daemon and restore every recorded compute mode; the problems left (none: all done)."""
        self._host.remove(f"{self._root}/{READY_FILE}")
        problems = [p for d in self.running.values() if (p := self._quit(d)) is not None]
        self.running = {}
        problems += self._restore(list(self.saved_modes()))
        return problems
