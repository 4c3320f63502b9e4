"""The ``device-plugin`` command as a process: signals, config reloads, failOnInitError, label switching."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_agent.cli import device_plugin as device_plugin_cli
from nvml_sim import SimulatedMachine
from tests.kit.fakehost import build_fake_host, sim_state_file
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet
from tests.node_agent.deviceplugin.plugin_process import TS, switching_plugin

ROOT = Path(__file__).resolve().parents[3]


def _start(tmp_path: Path, sock_dir: Path, *extra: str, machine: str = "l4x2") -> tuple[subprocess.Popen[str], Path]:
    host = build_fake_host(tmp_path / "host", machine)
    state = sim_state_file(host.root, machine)
    cmd = [sys.executable, "-m", "node_agent", "--nvml", f"simulated:{machine}", "--nvml-state", str(state),
           "--host-root", str(host.root), "--log-level", "info", "device-plugin", "--socket-dir", str(sock_dir),
           "--metrics-port", "0", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("CONFIG_FILE", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, state


def _reap(proc: subprocess.Popen[str]) -> None:
    """Kill the plugin if a failed test left it running, and close its output pipe (no ResourceWarning)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.slow
def test_sighup_reloads_and_sigterm_removes_sockets(tmp_path: Path, sock_dir: Path) -> None:
    kubelet = DevicePluginKubelet(sock_dir)
    kubelet.start()
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\n")
    proc, _ = _start(tmp_path, sock_dir, "--config-file", str(cfg))
    try:
        kubelet.wait_registered({"nvidia.com/gpu"}, timeout=20)
        cfg.write_text(TS)
        t = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        kubelet.wait_registered({"nvidia.com/gpu.shared"}, timeout=5, after=t)
        kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert not list(sock_dir.glob("nvidia-*.sock"))
    finally:
        _reap(proc)
        kubelet.stop()


@pytest.mark.slow
@pytest.mark.parametrize("fail", [True, False])
def test_nvml_init_failure_and_fail_on_init_error(tmp_path: Path, sock_dir: Path, fail: bool) -> None:
    host = build_fake_host(tmp_path / "host", "t4x1")
    SimulatedMachine("t4x1", sim_state_file(host.root, "t4x1")).fail_init()
    proc, _ = _start(tmp_path, sock_dir, "--fail-on-init-error", str(fail).lower(), machine="t4x1")
    try:
        if fail:
            out, _ = proc.communicate(timeout=20)
            assert proc.returncode == 1
            assert "NVML" in out
        else:
            # Stays up, advertising nothing: it says so, then waits (the SIGTERM comes after its handlers are
            # in place, however slowly the interpreter started).
            assert proc.stdout is not None
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if "event=init-failed" in line:
                    break
            assert any("action=advertise-nothing" in line for line in seen), seen
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(1.0)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
    finally:
        _reap(proc)


def test_invalid_config_fails_loudly_naming_the_field(tmp_path: Path, sock_dir: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    p = argparse.ArgumentParser()
    device_plugin_cli.add_arguments(p)
    args = p.parse_args(["--config-file", str(cfg), "--socket-dir", str(sock_dir), "--metrics-port", "0"])
    args.nvml = "simulated:t4x1"
    args.host_root = str(build_fake_host(tmp_path / "host", "t4x1").root)
    assert device_plugin_cli.run(args, env={}) == 3


def test_node_label_switches_config_live(tmp_path: Path, sock_dir: Path) -> None:
    class Labels:
        value: str | None = None

        def label(self) -> str | None:
            return self.value

    labels = Labels()
    with switching_plugin(tmp_path, sock_dir, labels, default="default", poll_interval="0.05") as (proc, kubelet):
        kubelet.wait_registered({"nvidia.com/gpu"})
        labels.value = "shared"
        start = time.monotonic()
        kubelet.wait_registered({"nvidia.com/gpu.shared"}, timeout=3, after=start)
        kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4)
        assert proc.metrics.render().count(b"nvidia_gpu_device_plugin_restarts_total{cause=\"config-changed\"}")


@pytest.mark.slow
def test_a_taken_status_port_does_not_stop_the_plugin_serving_the_kubelet(tmp_path: Path, sock_dir: Path) -> None:
    """Another process holds the status port: the plugin says so once and registers all the same (the
    kubelet keeps the node's GPUs); with --metrics-port-required it exits naming the address instead."""
    kubelet = DevicePluginKubelet(sock_dir)
    kubelet.start()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc, _ = _start(tmp_path, sock_dir, "--metrics-address", "127.0.0.1", "--metrics-port", str(port))
        try:
            kubelet.wait_registered({"nvidia.com/gpu"}, timeout=30)
            kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 2)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
            assert proc.returncode == 0, out
            assert out.count("event=status-port-unavailable") == 1, out
            assert f"port={port} error=Address already in use" in out
        finally:
            _reap(proc)
            kubelet.stop()
        required, _ = _start(tmp_path / "required", sock_dir, "--metrics-address", "127.0.0.1",
                             "--metrics-port", str(port), "--metrics-port-required")
        try:
            out, _ = required.communicate(timeout=30)
            assert required.returncode == 1, out
            assert f"error: status endpoint 127.0.0.1:{port}: Address already in use (errno 98)" in out
            assert "Traceback" not in out
        finally:
            _reap(required)
