"""A stand-in ``nvidia-cuda-mps-control`` over a simulated machine, for agents that start MPS daemons.

Simulated host roots (``nvml_sim.host.lay_out``) put a two-line ``/usr/bin/nvidia-cuda-mps-control``
in place that runs this module with the machine and its state file, next to the simulated ``nvidia-smi``.
It keeps the daemon's state where the real one keeps its socket: ``control`` in the pipe directory
(``CUDA_MPS_PIPE_DIRECTORY``, default ``/tmp/nvidia-mps``, under the ``HOST_ROOT`` the agent's exec seam
passes), so the daemon outlives the process that started it exactly as long as the real one would, and
the agent's restart, crash or ``quit`` are all visible to the next command.

The forms NVIDIA's code uses (NVIDIA/k8s-device-plugin ``cmd/mps-control-daemon/mps/daemon.go``,
NVIDIA/k8s-dra-driver-gpu ``templates/mps-control-daemon.tmpl.yaml``):

* ``nvidia-cuda-mps-control -d``: start the daemon for ``CUDA_VISIBLE_DEVICES``; it fails when one already
  serves the pipe directory, when the pipe or log directory is missing, when a listed GPU is not on the
  machine, or when the state says so (``SimulatedMachine.fail_mps_start``);
* ``echo <command> | nvidia-cuda-mps-control``: ``set_default_active_thread_percentage N``,
  ``get_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit <dev> <limit>``,
  ``get_default_device_pinned_mem_limit <dev>`` and ``quit``; with no daemon on the pipe directory every
  command fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from nvml_sim.state import SimStore

DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"
#: The daemon's socket in its pipe directory (here a JSON file with the daemon's state).
CONTROL = "control"
NO_DAEMON = "Cannot find MPS control daemon process"


class DaemonState(BaseModel):
    """What a running simulated daemon holds; read by tests through :func:`read_daemon`."""

    model_config = ConfigDict(extra="forbid")

    visible: list[str]
    #: ``nvmlComputeMode_t`` of each visible GPU when the daemon started (NVIDIA sets EXCLUSIVE_PROCESS first).
    compute_modes: dict[str, int] = {}
    active_thread_percentage: float = 100.0
    pinned_mem_limits: dict[str, str] = {}


def _under_root(path: str) -> Path:
    root = os.environ.get("HOST_ROOT", "")
    return Path(root + path) if root else Path(path)


def read_daemon(pipe_dir: Path) -> DaemonState | None:
    """The daemon serving ``pipe_dir`` (a local path), or None when none does."""
    try:
        return DaemonState.model_validate_json((pipe_dir / CONTROL).read_bytes())
    except FileNotFoundError:
        return None


def _save(pipe_dir: Path, state: DaemonState) -> None:
    tmp = pipe_dir / f".{CONTROL}.tmp"
    tmp.write_text(state.model_dump_json())
    os.replace(tmp, pipe_dir / CONTROL)


def _log(log_dir: Path, line: str) -> None:
    if log_dir.is_dir():
        with open(log_dir / "control.log", "a") as f:
            f.write(line + "\n")


def _start(store: SimStore, pipe_dir: Path, log_dir: Path) -> int:
    state = store.read()
    if state.mps_start_error:
        print(state.mps_start_error, file=sys.stderr)
        return 1
    if not pipe_dir.is_dir() or not log_dir.is_dir():
        print(f"Failed to open the pipe or log directory ({pipe_dir}, {log_dir})", file=sys.stderr)
        return 1
    if read_daemon(pipe_dir) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    spec = state.spec
    uuids = {spec.gpu_uuid(i): i for i in range(spec.gpu_count)}
    wanted = [u for u in os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(uuids)).split(",") if u]
    unknown = [u for u in wanted if u not in uuids]
    if unknown:
        print(f"CUDA_VISIBLE_DEVICES names no GPU of this machine: {','.join(unknown)}", file=sys.stderr)
        return 1
    modes = {u: state.gpus[uuids[u]].compute_mode for u in wanted}
    _save(pipe_dir, DaemonState(visible=wanted, compute_modes=modes))
    _log(log_dir, f"Starting control daemon for {','.join(wanted)}")
    return 0


def _command(pipe_dir: Path, log_dir: Path, text: str) -> int:
    daemon = read_daemon(pipe_dir)
    if daemon is None:
        print(NO_DAEMON, file=sys.stderr)
        return 1
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        if cmd == "quit":
            (pipe_dir / CONTROL).unlink(missing_ok=True)
            _log(log_dir, "Exit")
            return 0
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if not 0 < value <= 100:
                print(f"Invalid active thread percentage {args[0]!r}", file=sys.stderr)
                return 1
            daemon.active_thread_percentage = value
            print(f"{value:.1f}")
        elif cmd == "get_default_active_thread_percentage" and not args:
            print(f"{daemon.active_thread_percentage:.1f}")
        elif cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            daemon.pinned_mem_limits[args[0]] = args[1]
        elif cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
            print(daemon.pinned_mem_limits.get(args[0], "0M"))
        else:
            print(f"Unrecognized command {line!r}", file=sys.stderr)
            return 1
        _save(pipe_dir, daemon)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-cuda-mps-control", add_help=False)
    parser.add_argument("--machine", required=True)
    parser.add_argument("--state", type=Path)
    parser.add_argument("-d", dest="daemon", action="store_true")
    args = parser.parse_args(argv)
    store = SimStore(args.machine, args.state)
    pipe_dir = _under_root(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIRECTORY))
    log_dir = _under_root(os.environ.get("CUDA_MPS_LOG_DIRECTORY", DEFAULT_LOG_DIRECTORY))
    try:
        if args.daemon:
            return _start(store, pipe_dir, log_dir)
        return _command(pipe_dir, log_dir, sys.stdin.read())
    except (OSError, ValidationError, json.JSONDecodeError) as e:
        print(f"nvidia-cuda-mps-control: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
