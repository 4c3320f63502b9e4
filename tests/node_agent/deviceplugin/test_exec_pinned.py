"""The device plugin's MPS control daemon commands, pinned by exact argv, environment and order.

``MpsDaemons`` runs ``nvidia-cuda-mps-control`` through the host root's exec seam; a ``RecordingExec``
plays the daemon (no daemon until ``-d``, ``quit`` stops it).
"""

from __future__ import annotations

from pathlib import Path

from node_agent.deviceplugin import config, mps
from node_agent.deviceplugin.resources import build_resources
from node_agent.host import CommandResult, HostRoot
from nvgpu import catalogue
from tests.kit.fakehost import FakeHost
from tests.kit.recording_exec import Call, RecordingExec
from tests.node_agent.deviceplugin.builders import machine

DATA = Path(__file__).parent / "data"


class _Modes:
    """GPU compute modes by UUID (what NVML's nvmlDeviceGet/SetComputeMode answer), recording each change."""

    def __init__(self, uuids: list[str]) -> None:
        self.modes = dict.fromkeys(uuids, "DEFAULT")
        self.changes: list[tuple[str, str]] = []

    def compute_mode(self, uuid: str) -> str:
        return self.modes[uuid]

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self.modes[uuid] = mode
        self.changes.append((uuid, mode))


def test_mps_daemon_start_defaults_and_quit(tmp_path: Path, host: FakeHost) -> None:
    node = machine("a30x4", host)
    s = config.load((DATA / "nvidia-device-plugin-config-mps.yaml").read_text())
    (d,) = mps.plan(build_resources(node.gpu_list, s, host), s)
    running = [False]

    def daemon(call: Call) -> CommandResult:
        if call.argv[-1] == "-d":
            running[0] = True
            return CommandResult(call.argv, 0, "", "")
        was = running[0]
        if call.stdin == "quit\n":
            running[0] = False
        return CommandResult(call.argv, 0 if was else 1, "", "" if was else "Cannot find MPS control daemon process")

    rec = RecordingExec({"nvidia-cuda-mps-control": daemon})
    uuids = [g.uuid for g in node.gpu_list]
    modes = _Modes(uuids)
    daemons = mps.MpsDaemons(HostRoot(tmp_path, executor=rec), host, modes, "/run/nvidia/mps")
    daemons.ensure([d])
    env = {"CUDA_VISIBLE_DEVICES": ",".join(uuids), "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia/mps/nvidia.com/gpu/pipe",
           "CUDA_MPS_LOG_DIRECTORY": "/run/nvidia/mps/nvidia.com/gpu/log"}
    limit = catalogue.A30_24GB.memory_mib // 10
    defaults = "set_default_active_thread_percentage 10\n" + "".join(
        f"set_default_device_pinned_mem_limit {i} {limit}M\n" for i in range(4))
    # EXCLUSIVE_PROCESS first (NVIDIA's Start), then the daemon, then the clients' shares.
    assert modes.changes == [(u, "EXCLUSIVE_PROCESS") for u in uuids]
    assert [(list(c.argv), dict(c.env), c.stdin) for c in rec.calls] == [
        (["nvidia-cuda-mps-control"], env, "get_default_active_thread_percentage\n"),  # one to adopt? none here
        (["nvidia-cuda-mps-control", "-d"], env, None),
        (["nvidia-cuda-mps-control"], env, defaults),
    ]
    rec.calls.clear()
    modes.changes.clear()
    assert daemons.stop() == []
    assert [(list(c.argv), c.stdin) for c in rec.calls] == [(["nvidia-cuda-mps-control"], "quit\n")]
    assert not running[0]
    assert modes.changes == [(u, "DEFAULT") for u in uuids]
