"""GPU sharing for a prepared claim: time-slicing and MPS, applied on prepare and undone on unprepare.

What the opaque config asks for becomes host changes through a :class:`SharingBackend` (``nvidia-smi`` and
``nvidia-cuda-mps-control`` run through the host root's exec seam with timeouts, the test kit's
``RecordingExec`` under it in tests) plus container edits for the
claim's CDI spec. Every change is recorded in an :class:`AppliedSharing` *before* it is made, so a prepare
interrupted half-way can be rolled back from the checkpoint alone.

- TimeSlicing (full GPUs): compute mode ``DEFAULT`` and ``compute-policy --set-timeslice <level>``. MIG
  devices have no timeslice setting: the strategy is accepted and changes nothing.
- MPS: the GPUs go to ``EXCLUSIVE_PROCESS``; a per-claim control daemon runs with its pipe directory under
  ``/run/nvidia-gpu-agent/mps/<claimUID>``, which is bind-mounted into the containers with
  ``CUDA_MPS_PIPE_DIRECTORY``; thread and pinned-memory limits are set on the daemon and, as
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, in the client environment.
  The daemon's ``/dev/shm`` is bind-mounted at ``/dev/shm`` too (NVIDIA/k8s-dra-driver-gpu
  ``cmd/gpu-kubelet-plugin/sharing.go``, ``GetCDIContainerEdits``): clients reach the MPS server through
  shared-memory segments there. NVIDIA gives each claim's daemon its own tmpfs; the daemons here run in the
  plugin's container, whose ``/dev/shm`` is the node's ``hostpaths.DRA_MPS_SHM``, shared by the node's MPS
  claims as NVIDIA's device plugin shares one ``<mpsRoot>/shm`` between its resources.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from node_agent.dra.cdi import SharingEdits
from node_agent.dra.checkpoint import AppliedSharing
from node_agent.dra.config import GpuSharing, Strategy
from node_agent.dra.devices import Allocatable, DeviceKind
from node_agent.dra.hostfs import HostPaths
from node_agent.host import CommandResult, HostError
from nvgpu import hostpaths

log = logging.getLogger(__name__)

MPS_ROOT = hostpaths.DRA_MPS_ROOT
MPS_SHM = hostpaths.DRA_MPS_SHM


class SharingError(RuntimeError):
    """A sharing change failed on the host; the message names the GPU and the command."""


class SharingBackend(Protocol):
    def set_compute_mode(self, uuid: str, mode: str) -> None: ...

    def set_timeslice(self, uuid: str, level: int) -> None: ...

    def start_mps(self, claim_uid: str, uuids: Sequence[str], *, pipe_dir: str, log_dir: str,
                  active_thread_percentage: int | None, pinned_limits_mib: dict[int, int]) -> None: ...

    def stop_mps(self, claim_uid: str, pipe_dir: str) -> None: ...


class CommandRunner(Protocol):
    """Runs a host command through the host layer's exec seam (``node_agent.host.HostRoot`` satisfies it)."""

    def path(self, host_path: str) -> Path: ...

    def command_path(self, host_path: str) -> str: ...

    def run(self, argv: Sequence[str], *, timeout_s: float, kill_after_s: float = ..., stdin: str | None = ...,
            env: Mapping[str, str] | None = ...) -> CommandResult: ...


class NvidiaSmiSharing:
    """The production backend: NVIDIA's tools, each call bounded by a timeout.

    Every command goes through ``host.run`` (``node_agent.host.exec``): the binaries are resolved inside
    the host root (``--host-root``, ``--host-exec``), so a simulated node runs the same code with a
    recorder, and the MPS directories are passed as the command sees them (``HostRoot.command_path``).
    """

    def __init__(self, host: CommandRunner, nvidia_smi: str = "nvidia-smi",
                 mps_control: str = "nvidia-cuda-mps-control", timeout: float = 10.0) -> None:
        self._host = host
        self._smi = nvidia_smi
        self._mps = mps_control
        self._timeout = timeout

    def _run(self, cmd: list[str], env: dict[str, str], stdin: str) -> None:
        try:
            result = self._host.run(cmd, timeout_s=self._timeout, stdin=stdin or None, env=env or None)
        except HostError as e:
            raise SharingError(f"{' '.join(cmd)}: {e}") from e
        if result.returncode != 0:
            raise SharingError(f"{' '.join(cmd)}: exit {result.returncode}: {result.stderr.strip()}")

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self._run([self._smi, "-i", uuid, "-c", mode], {}, "")

    def set_timeslice(self, uuid: str, level: int) -> None:
        self._run([self._smi, "compute-policy", "-i", uuid, "--set-timeslice", str(level)], {}, "")

    def start_mps(self, claim_uid: str, uuids: Sequence[str], *, pipe_dir: str, log_dir: str,
                  active_thread_percentage: int | None, pinned_limits_mib: dict[int, int]) -> None:
        env = {"CUDA_MPS_PIPE_DIRECTORY": self._host.command_path(pipe_dir),
               "CUDA_MPS_LOG_DIRECTORY": self._host.command_path(log_dir), "CUDA_VISIBLE_DEVICES": ",".join(uuids)}
        self._run([self._mps, "-d"], env, "")
        commands = []
        if active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {active_thread_percentage}")
        commands += [f"set_default_device_pinned_mem_limit {i} {mib}M" for i, mib in sorted(pinned_limits_mib.items())]
        if commands:
            self._run([self._mps], env, "\n".join(commands) + "\n")

    def stop_mps(self, claim_uid: str, pipe_dir: str) -> None:
        self._run([self._mps], {"CUDA_MPS_PIPE_DIRECTORY": self._host.command_path(pipe_dir)}, "quit\n")


@dataclass(frozen=True)
class Plan:
    """The record to journal before applying, and the container edits once applied."""

    record: AppliedSharing
    edits: SharingEdits


def plan(claim_uid: str, devices: Sequence[Allocatable], sharing: GpuSharing) -> Plan:
    uuids = [d.uuid for d in devices]
    full = [d.uuid for d in devices if d.kind is DeviceKind.GPU]
    if sharing.strategy is Strategy.TIME_SLICING:
        return Plan(AppliedSharing(strategy=sharing.strategy.value, uuids=uuids, compute_mode_changed=full,
                                   timeslice_changed=full), SharingEdits())
    mps = sharing.mps_config
    assert mps is not None  # normalized() fills it for MPS
    directory = f"{MPS_ROOT}/{claim_uid}"
    env = [f"CUDA_MPS_PIPE_DIRECTORY={directory}/pipe"]
    if mps.default_active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={mps.default_active_thread_percentage}")
    limits = mps.pinned_limits_mib(uuids)
    if limits:
        env.append("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + ",".join(f"{i}={m}M" for i, m in sorted(limits.items())))
    return Plan(AppliedSharing(strategy=sharing.strategy.value, uuids=uuids, compute_mode_changed=full,
                               mps_directory=directory),
                SharingEdits(env=tuple(env), mounts=((f"{directory}/pipe", f"{directory}/pipe"),
                                                     (MPS_SHM, "/dev/shm"))))


def apply(backend: SharingBackend, host: HostPaths, claim_uid: str, *, record: AppliedSharing,
          sharing: GpuSharing, devices: Sequence[Allocatable]) -> None:
    if sharing.strategy is Strategy.TIME_SLICING:
        interval = (sharing.time_slicing_config.interval if sharing.time_slicing_config else None)
        level = interval.level if interval is not None else 0
        for uuid in record.timeslice_changed:
            backend.set_compute_mode(uuid, "DEFAULT")
            backend.set_timeslice(uuid, level)
        return
    mps = sharing.mps_config
    assert mps is not None
    for uuid in record.compute_mode_changed:
        backend.set_compute_mode(uuid, "EXCLUSIVE_PROCESS")
    pipe, logs = f"{record.mps_directory}/pipe", f"{record.mps_directory}/log"
    for d in (pipe, logs, MPS_SHM):
        host.path(d).mkdir(parents=True, exist_ok=True)
    backend.start_mps(claim_uid, record.uuids, pipe_dir=pipe, log_dir=logs,
                      active_thread_percentage=mps.default_active_thread_percentage,
                      pinned_limits_mib=mps.pinned_limits_mib([d.uuid for d in devices]))


def _remove_mps_directory(directory: Path) -> None:
    for sub in ("pipe", "log"):
        d = directory / sub
        if d.is_dir():
            for f in d.iterdir():
                if f.is_file() or f.is_socket() or f.is_fifo():
                    f.unlink(missing_ok=True)
            d.rmdir()
    if directory.is_dir():
        directory.rmdir()


#: The control daemon's socket in its pipe directory; while it exists a daemon may be listening there.
MPS_CONTROL_SOCKET = "control"


@dataclass(frozen=True)
class UndoOutcome:
    """What undoing one :class:`AppliedSharing` left.

    ``remaining`` is the record of what is still changed on the host (None: nothing is), for the journal,
    so that a retry redoes only that; ``problems`` say why (each is worth retrying: the kubelet retries an
    unprepare that reports them). A step that can never succeed, because the record names a directory the
    host root refuses (a hand-edited journal: the driver never starts a daemon there), is logged and
    dropped, not retried forever.
    """

    remaining: AppliedSharing | None
    problems: tuple[str, ...] = ()


def _stop_mps(backend: SharingBackend, claim_uid: str, mps_directory: str, local: Path, problems: list[str]) -> bool:
    """Stop the claim's daemon; True once none runs. Idempotent: the pipe directory is made before the daemon
    starts and removed only after it stopped, so without it (or without the daemon's control socket in it,
    when ``quit`` finds nobody to talk to) there is nothing left to stop."""
    pipe = local / "pipe"
    if not pipe.is_dir():
        return True
    try:
        backend.stop_mps(claim_uid, f"{mps_directory}/pipe")
        return True
    except (SharingError, HostError) as e:
        if not os.path.lexists(pipe / MPS_CONTROL_SOCKET):
            log.info("event=mps-already-stopped claim_uid=%s detail=no control socket error=%s", claim_uid, e)
            return True
        problems.append(f"stop MPS: {e}")
        return False


def undo(backend: SharingBackend, host: HostPaths, claim_uid: str, record: AppliedSharing) -> UndoOutcome:
    """Revert one recorded change as far as the host allows, and say what is left (never raises).

    The MPS daemon goes first; while it cannot be stopped its GPUs keep their compute mode (the daemon
    still serves them in ``EXCLUSIVE_PROCESS``), so the host is never left half way between the two.
    Every step is idempotent, so a retry, or an undo of more than a prepare did, is harmless."""
    problems: list[str] = []
    mps_directory, mps_stopped = record.mps_directory, record.mps_stopped
    if mps_directory:
        try:
            local = host.path(mps_directory)
        except HostError as e:  # the recorded directory climbs out of the host root (``..``)
            log.warning("event=sharing-undo-failed claim_uid=%s problem=remove the MPS directories: %s retry=no",
                        claim_uid, e)
            mps_directory, mps_stopped = "", False
        else:
            mps_stopped = mps_stopped or _stop_mps(backend, claim_uid, mps_directory, local, problems)
            if not mps_stopped:
                return _outcome(claim_uid, record, problems)
            try:
                _remove_mps_directory(local)
                mps_directory, mps_stopped = "", False
            except OSError as e:
                problems.append(f"remove the MPS directories: {e}")

    def attempt(what: str, fn: Callable[[], None]) -> bool:
        try:
            fn()
            return True
        except (SharingError, HostError) as e:
            problems.append(f"{what}: {e}")
            return False

    timeslice = [u for u in record.timeslice_changed
                 if not attempt(f"reset timeslice of {u}", functools.partial(backend.set_timeslice, u, 0))]
    compute = [u for u in record.compute_mode_changed
               if not attempt(f"reset compute mode of {u}", functools.partial(backend.set_compute_mode, u, "DEFAULT"))]
    left = record.model_copy(update={"mps_directory": mps_directory, "mps_stopped": mps_stopped,
                                     "timeslice_changed": timeslice, "compute_mode_changed": compute})
    return _outcome(claim_uid, left, problems)


def _outcome(claim_uid: str, left: AppliedSharing, problems: list[str]) -> UndoOutcome:
    for p in problems:
        log.warning("event=sharing-undo-failed claim_uid=%s problem=%s retry=yes", claim_uid, p)
    changed = left.mps_directory or left.timeslice_changed or left.compute_mode_changed
    return UndoOutcome(left if changed else None, tuple(problems))
