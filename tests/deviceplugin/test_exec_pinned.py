"""The device plugin's MPS control daemon commands, pinned by exact argv, environment and order.

``MpsDaemons`` runs ``nvidia-cuda-mps-control`` through the host root's exec seam; a ``RecordingExec``
plays the daemon (no daemon until ``-d``, ``quit`` stops it).
"""

from __future__ import annotations

from pathlib import Path

from node_agent.deviceplugin import config, mps
from node_agent.deviceplugin.resources import build_resources
from node_agent.host import Call, CommandResult, HostRoot, RecordingExec
from nvgpu import catalogue
from tests.deviceplugin.builders import machine
from tests.kit.fakehost import FakeHost

DATA = Path(__file__).parent / "data"


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

    rec = RecordingExec({"env": daemon})
    daemons = mps.MpsDaemons(HostRoot(tmp_path, executor=rec), host)
    daemons.ensure([d])
    uuids = ",".join(g.uuid for g in node.gpu_list)
    env = ["env", f"CUDA_VISIBLE_DEVICES={uuids}", "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps/nvidia.com/gpu/pipe",
           "CUDA_MPS_LOG_DIRECTORY=/run/nvidia/mps/nvidia.com/gpu/log"]
    limit = catalogue.A30_24GB.memory_mib // 10
    defaults = "set_default_active_thread_percentage 10\n" + "".join(
        f"set_default_device_pinned_mem_limit {i} {limit}M\n" for i in range(4))
    assert [(list(c.argv), c.stdin) for c in rec.calls] == [
        ([*env, "nvidia-cuda-mps-control"], defaults),  # adopt a daemon already serving? none here
        ([*env, "nvidia-cuda-mps-control", "-d"], None),
        ([*env, "nvidia-cuda-mps-control"], defaults),
    ]
    rec.calls.clear()
    daemons.stop()
    assert [(list(c.argv), c.stdin) for c in rec.calls] == [([*env, "nvidia-cuda-mps-control"], "quit\n")]
    assert not running[0]
