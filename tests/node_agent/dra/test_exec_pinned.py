"""The DRA sharing backend's host commands, pinned by exact argv and order.

The production backend (``NvidiaSmiSharing``) runs on a simulated DGX H100 through the host root's exec
seam with a ``RecordingExec`` under it: the commands ``nvidia-smi`` and ``nvidia-cuda-mps-control`` get
(argv, environment, control commands on stdin) are what a real node would run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.dra.sharing import NvidiaSmiSharing
from node_agent.host import CommandResult, HostRoot
from tests.kit.dra_builders import claim, gpu_config
from tests.kit.recording_exec import RecordingExec
from tests.node_agent.dra.conftest import Node


@pytest.mark.parametrize(("interval", "level"), [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)])
def test_time_slice_level_per_interval(node: Node, interval: str, level: int) -> None:
    ref = node.put(claim("ts", "uid-ts", [("gpu", "gpu-2"), ("gpu", "gpu-5")], configs=[gpu_config(
        "FromClaim", ["gpu"], {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})]))
    assert node.driver.prepare([ref])["uid-ts"].error == ""
    u2, u5 = node.uuids[2], node.uuids[5]
    assert node.exec.argvs == [
        ["nvidia-smi", "-i", u2, "-c", "DEFAULT"],
        ["nvidia-smi", "compute-policy", "-i", u2, "--set-timeslice", str(level)],
        ["nvidia-smi", "-i", u5, "-c", "DEFAULT"],
        ["nvidia-smi", "compute-policy", "-i", u5, "--set-timeslice", str(level)],
    ]
    assert all(c.env == {} and c.stdin is None for c in node.exec.calls)
    node.exec.calls.clear()
    assert node.driver.unprepare([ref]) == {"uid-ts": ""}
    assert node.exec.argvs == [
        ["nvidia-smi", "compute-policy", "-i", u2, "--set-timeslice", "0"],
        ["nvidia-smi", "compute-policy", "-i", u5, "--set-timeslice", "0"],
        ["nvidia-smi", "-i", u2, "-c", "DEFAULT"],
        ["nvidia-smi", "-i", u5, "-c", "DEFAULT"],
    ]


def test_mps_start_limits_and_stop(node: Node) -> None:
    ref = node.put(claim("mps", "uid-mps", [("gpu", "gpu-1"), ("gpu", "gpu-4")], configs=[gpu_config(
        "FromClaim", ["gpu"], {"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "10Gi",
            "defaultPerDevicePinnedMemoryLimit": {"1": "4Gi"}}})]))
    assert node.driver.prepare([ref])["uid-mps"].error == ""
    u1, u4 = node.uuids[1], node.uuids[4]
    # Direct exec under a non-/ root: the daemon sees the directories under the root.
    base = str(node.root / "run/nvidia-gpu-agent/mps/uid-mps")
    env = {"CUDA_MPS_PIPE_DIRECTORY": f"{base}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{base}/log",
           "CUDA_VISIBLE_DEVICES": f"{u1},{u4}"}
    assert [(c.argv, c.env, c.stdin) for c in node.exec.calls] == [
        (("nvidia-smi", "-i", u1, "-c", "EXCLUSIVE_PROCESS"), {}, None),
        (("nvidia-smi", "-i", u4, "-c", "EXCLUSIVE_PROCESS"), {}, None),
        (("nvidia-cuda-mps-control", "-d"), env, None),
        (("nvidia-cuda-mps-control",), env, "set_default_active_thread_percentage 25\n"
                                            "set_default_device_pinned_mem_limit 0 10240M\n"
                                            "set_default_device_pinned_mem_limit 1 4096M\n"),
    ]
    node.exec.calls.clear()
    assert node.driver.unprepare([ref]) == {"uid-mps": ""}
    assert [(c.argv, c.env, c.stdin) for c in node.exec.calls] == [
        (("nvidia-cuda-mps-control",), {"CUDA_MPS_PIPE_DIRECTORY": f"{base}/pipe"}, "quit\n"),
        (("nvidia-smi", "-i", u1, "-c", "DEFAULT"), {}, None),
        (("nvidia-smi", "-i", u4, "-c", "DEFAULT"), {}, None),
    ]


def test_mps_directories_are_host_paths_under_chroot(host_root: Path) -> None:
    rec = RecordingExec()
    NvidiaSmiSharing(HostRoot(host_root, exec_mode="chroot", executor=rec)).stop_mps("u", "/run/x/pipe")
    assert rec.calls[0].env == {"CUDA_MPS_PIPE_DIRECTORY": "/run/x/pipe"}


def test_a_failing_nvidia_smi_fails_the_prepare(node: Node) -> None:
    node.exec.on("nvidia-smi", lambda c: CommandResult(c.argv, 6, "", "Unable to set the timeslice"))
    ref = node.put(claim("ts", "uid-ts", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", ["gpu"], {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})]))
    error = node.driver.prepare([ref])["uid-ts"].error
    assert "exit 6" in error and "Unable to set the timeslice" in error
