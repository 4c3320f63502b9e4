"""VFIO: status, prepare (+ node label), bind/unbind through driver_override with a kernel stand-in."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from node_agent.cli.context import AgentContext
from node_agent.host import HostError, read_device
from node_agent.setup import vfio
from nvml_sim.state import SimProcess
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.fakekernel import FakeKernelHostRoot
from tests.node_agent.agent_testkit import ApiServer, Cli

A30 = "simulated:a30x4"
GPU1 = "0000:31:00.0"


def _ctx(host: FakeHost) -> AgentContext:
    args = argparse.Namespace(host_root=str(host.root), host_exec="direct", nvml=A30, nvml_state=None)
    return AgentContext.from_args(args, host_factory=lambda root, mode: FakeKernelHostRoot(root, exec_mode=mode))


def test_status_and_prepare(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    code, doc = cli(host.root, A30, "vfio", "status")
    assert code == 0 and not doc["ready"] and "module-missing:vfio_pci" in doc["problems"]
    assert [g["driver"] for g in doc["gpus"]] == ["nvidia"] * 4
    code, doc = cli(host.root, A30, "vfio", "prepare")
    assert (code, doc["ready"], doc["iommu"]) == (0, True, True)
    assert host.log("modprobe") == ["vfio", "vfio_pci", "vfio_iommu_type1"]
    assert cli(host.root, A30, "vfio", "prepare")[0] == 0
    assert len(host.log("modprobe")) == 3


def test_prepare_without_iommu_fails_and_labels(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    good = build_fake_host(tmp_path / "on", "a30x4")
    code, _ = cli(good.root, A30, "vfio", "prepare", "--patch-node", node="gpu-node-1",
                  kubeconfig=api_server.kubeconfig)
    assert code == 0
    assert api_server.labels("gpu-node-1")["node.deckhouse.io/gpu-vfio-ready"] == "true"
    off = build_fake_host(tmp_path / "off", "a30x4", iommu=False)
    code, doc = cli(off.root, A30, "vfio", "prepare", "--patch-node", node="gpu-node-1",
                    kubeconfig=api_server.kubeconfig)
    assert (code, doc["problems"]) == (1, ["iommu-off"])
    assert "node.deckhouse.io/gpu-vfio-ready" not in api_server.labels("gpu-node-1")


def test_bind_and_unbind_round_trip(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    ctx = _ctx(host)
    vfio.prepare(ctx.host)
    assert vfio.bind(ctx.host, ctx.nvml, GPU1).driver == "vfio-pci"
    assert host.path(f"/sys/bus/pci/devices/{GPU1}/driver_override").read_text() == "vfio-pci\n"
    assert vfio.bind(ctx.host, ctx.nvml, GPU1).driver == "vfio-pci"  # idempotent
    assert read_device(ctx.host, "0000:17:00.0").driver == "nvidia"
    assert vfio.unbind(ctx.host, GPU1).driver == "nvidia"
    assert vfio.unbind(ctx.host, GPU1).driver == "nvidia"


def test_bind_refuses_a_gpu_in_use(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    assert host.machine is not None
    host.machine.set_processes(1, [SimProcess(pid=31337, used_mib=2048)])
    ctx = _ctx(host)
    vfio.prepare(ctx.host)
    with pytest.raises(vfio.Refused, match=r"still in use after 0\.2s by process\(es\) 31337"):
        vfio.bind(ctx.host, ctx.nvml, GPU1, timeout_s=0.2, poll_s=0.05)
    assert read_device(ctx.host, GPU1).driver == "nvidia"
    assert host.path(f"/sys/bus/pci/devices/{GPU1}/driver_override").read_text() == "(null)\n"


def test_bind_refuses_when_nvml_cannot_confirm(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    assert host.machine is not None
    host.machine.fail_init("driver-not-loaded")
    ctx = _ctx(host)
    vfio.prepare(ctx.host)
    with pytest.raises(vfio.Refused, match="cannot confirm"):
        vfio.bind(ctx.host, ctx.nvml, GPU1)


def test_unbind_refuses_a_vfio_group_held_by_a_vm(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    ctx = _ctx(host)
    vfio.prepare(ctx.host)
    bound = vfio.bind(ctx.host, ctx.nvml, GPU1)
    fd_dir = host.path("/proc/4242/fd")
    fd_dir.mkdir(parents=True)
    os.symlink(f"/dev/vfio/{bound.iommu_group}", fd_dir / "17")
    with pytest.raises(vfio.Refused, match="4242"):
        vfio.unbind(ctx.host, GPU1)
    assert read_device(ctx.host, GPU1).driver == "vfio-pci"


def test_bind_needs_prepare_and_a_gpu(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    ctx = _ctx(host)
    with pytest.raises(HostError, match="vfio prepare"):
        vfio.bind(ctx.host, ctx.nvml, GPU1)
    vfio.prepare(ctx.host)
    with pytest.raises(HostError, match="not an NVIDIA GPU"):
        vfio.bind(ctx.host, ctx.nvml, "0000:00:1f.6")
    code, _ = cli(host.root, A30, "vfio", "bind")
    assert code == 2
    code, _ = cli(host.root, A30, "vfio", "bind", "garbage")
    assert code == 2
