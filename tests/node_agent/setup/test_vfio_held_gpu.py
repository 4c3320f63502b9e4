"""VFIO bind of a GPU something holds: wait (bounded) for the holders, persistence mode off, SR-IOV VFs.

On a real node unbinding a GPU from ``nvidia`` while a process has ``/dev/nvidia<N>`` open, or while the GPU
is in persistence mode, blocks in the kernel until they let go. The fake kernel (``tests.kit.fakekernel``)
blocks the same way and records it; the simulated host has the holders (``hold_device``) and the simulated
NVML the persistence mode. NVIDIA's behaviour followed: NVIDIA/k8s-dra-driver-gpu
``cmd/gpu-kubelet-plugin/vfio-device.go`` (``Configure``: verifyDisabledVFs, disableGPUPersistenceMode,
WaitForGPUFree, tryChangeDriverWithTimeout; ``Unconfigure``: enableGPUPersistenceMode).
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest

from node_agent.cli.context import AgentContext
from node_agent.host import read_device
from node_agent.setup import vfio
from nvml_sim.host import hold_device, release_device, sriov_vfs
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.fakekernel import FakeKernelHostRoot

A30 = "simulated:a30x4"
GPU1 = "0000:31:00.0"  #: minor 1


def _ctx(host: FakeHost) -> tuple[AgentContext, FakeKernelHostRoot]:
    args = argparse.Namespace(host_root=str(host.root), host_exec="direct", nvml=A30, nvml_state=None)
    ctx = AgentContext.from_args(args, host_factory=lambda root, mode: FakeKernelHostRoot(root, exec_mode=mode))
    assert isinstance(ctx.host, FakeKernelHostRoot)
    vfio.prepare(ctx.host)
    return ctx, ctx.host


def test_bind_waits_for_the_holder_then_unbinds_without_blocking(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    assert host.machine is not None and host.machine.persistence_mode(1)  # nvidia-persistenced keeps it on
    ctx, kernel = _ctx(host)
    hold_device(host.root, 4242, "/dev/nvidia1", comm="python3")
    threading.Timer(0.4, release_device, (host.root, 4242)).start()  # the workload exits a moment later
    after = vfio.bind(ctx.host, ctx.nvml, GPU1, timeout_s=10, poll_s=0.05)
    assert after.driver == "vfio-pci"
    assert kernel.blocked == []  # the unbind never waited in the kernel
    assert not host.machine.persistence_mode(1)
    assert vfio.unbind(ctx.host, GPU1, ctx.nvml).driver == "nvidia"
    assert host.machine.persistence_mode(1)  # put back as it was
    assert host.machine.persistence_mode(2)  # the other GPUs were never touched


def test_bind_turns_persistence_mode_off_before_unbinding(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    ctx, kernel = _ctx(host)
    assert vfio.bind(ctx.host, ctx.nvml, GPU1, timeout_s=1, poll_s=0.05).driver == "vfio-pci"
    assert kernel.blocked == []


def test_bind_times_out_naming_the_gpu_its_holders_and_the_timeout(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    assert host.machine is not None
    ctx, kernel = _ctx(host)
    hold_device(host.root, 4242, "/dev/nvidia1", comm="python3")
    hold_device(host.root, 777, "/dev/nvidia1", comm="nvtop", fd=9)
    hold_device(host.root, 555, "/dev/nvidia2", comm="other")  # another GPU's holder is no holder of this one
    with pytest.raises(vfio.Refused, match=r"^0000:31:00\.0 \(/dev/nvidia1\) is still in use after 0\.3s by "
                                           r"process\(es\) 777 \(nvtop\), 4242 \(python3\); not unbinding it"):
        vfio.bind(ctx.host, ctx.nvml, GPU1, timeout_s=0.3, poll_s=0.05)
    assert kernel.blocked == []
    assert read_device(ctx.host, GPU1).driver == "nvidia"
    assert host.path(f"/sys/bus/pci/devices/{GPU1}/driver_override").read_text() == "(null)\n"
    assert host.machine.persistence_mode(1)  # restored after the failed wait


def test_bind_refused_persistence_change_names_the_gpu(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    assert host.machine is not None
    host.machine.fail_call(1, "nvmlDeviceSetPersistenceMode", 4)  # NO_PERMISSION: not root
    ctx, kernel = _ctx(host)
    with pytest.raises(vfio.Refused, match=r"^0000:31:00\.0: .*persistence mode off .*Insufficient Permissions"):
        vfio.bind(ctx.host, ctx.nvml, GPU1, timeout_s=1, poll_s=0.05)
    assert read_device(ctx.host, GPU1).driver == "nvidia" and kernel.blocked == []


def test_sriov_physical_function_is_refused_and_its_vfs_are_bound(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    vfs = sriov_vfs(host.root, GPU1, 2)
    assert vfs == ["0000:31:00.4", "0000:31:00.5"]
    ctx, kernel = _ctx(host)
    with pytest.raises(vfio.Refused, match=r"^0000:31:00\.0 has 2 SR-IOV virtual function\(s\) enabled "
                                           r"\(0000:31:00\.4, 0000:31:00\.5\)"):
        vfio.bind(ctx.host, ctx.nvml, GPU1, timeout_s=1, poll_s=0.05)
    assert read_device(ctx.host, GPU1).driver == "nvidia"
    assert vfio.bind(ctx.host, ctx.nvml, vfs[0], timeout_s=1, poll_s=0.05).driver == "vfio-pci"
    assert read_device(ctx.host, vfs[1]).driver is None and kernel.blocked == []
    assert vfio.unbind(ctx.host, vfs[0], ctx.nvml).driver == "nvidia"
