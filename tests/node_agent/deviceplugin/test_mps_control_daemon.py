"""The MPS control daemon apart from the device plugin, as NVIDIA runs it (k8s-device-plugin PR #1045,
``cmd/mps-control-daemon/mps/daemon.go``), on a simulated node: NVML's compute mode and the simulated
``nvidia-cuda-mps-control`` (``nvml_sim.mpsctl``), both persisted where a real node keeps them.

* ``mps-daemon`` puts the GPUs in ``EXCLUSIVE_PROCESS`` *before* the daemon starts, sets each client's share
  and marks the node ready; on stop it quits the daemon and restores each GPU's own earlier mode, also after
  it crashed and restarted (when it finds ``EXCLUSIVE_PROCESS``, which it must not keep);
* the device plugin never starts or quits a daemon: it waits for one to be up with its own settings, and a
  plugin restart leaves the daemon, and so every client's server, running;
* NVML refusing the compute mode (an unprivileged container) or the daemon failing to start leaves the node
  not ready, nothing half-changed after the stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent import nvml
from node_agent.deviceplugin import mps
from node_agent.deviceplugin.mpsdaemon import DaemonOptions, MpsDaemonProcess
from node_agent.deviceplugin.nodelabel import ConfigSource
from node_agent.kubelet.deviceplugin.process import PluginOptions, PluginProcess
from nvml_sim.mpsctl import DaemonState, read_daemon
from tests.kit.fakehost import FakeHost, build_fake_host, sim_state_file

DATA = Path(__file__).parent / "data"
MACHINE = "a30x4"
ROOT = "/run/nvidia/mps"
PIPE = f"{ROOT}/nvidia.com/gpu/pipe"
DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS = 0, 2, 3
NVML_ERROR_NO_PERMISSION = 4


@pytest.fixture
def node(tmp_path: Path) -> FakeHost:
    return build_fake_host(tmp_path / "host", MACHINE)


@pytest.fixture
def session(node: FakeHost) -> Iterator[nvml.NvmlSession]:
    backend = nvml.NvmlBackend("simulated", MACHINE, sim_state_file(node.root, MACHINE))
    with nvml.open_nvml(backend) as s:
        yield s


def _daemon_process(node: FakeHost, session: nvml.NvmlSession) -> MpsDaemonProcess:
    source = ConfigSource(config_file=DATA / "nvidia-device-plugin-config-mps.yaml")
    return MpsDaemonProcess(DaemonOptions(source=source), {}, session, None, node.host)


def _daemon(node: FakeHost) -> DaemonState | None:
    return read_daemon(node.path(PIPE))


def _modes(node: FakeHost) -> list[int]:
    assert node.machine is not None
    return [node.machine.compute_mode(i) for i in range(node.machine.spec.gpu_count)]


def test_the_daemon_runs_the_gpus_exclusive_and_stop_restores_their_own_modes(
        node: FakeHost, session: nvml.NvmlSession) -> None:
    assert node.machine is not None
    node.machine.set_compute_mode(1, PROHIBITED)  # an operator's choice, to be given back as it was
    proc = _daemon_process(node, session)
    assert proc.reconcile()
    daemon = _daemon(node)
    assert daemon is not None
    uuids = [node.machine.spec.gpu_uuid(i) for i in range(4)]
    assert daemon.visible == uuids
    # EXCLUSIVE_PROCESS was set before the daemon started (NVIDIA's Start), and stays while it serves.
    assert daemon.compute_modes == dict.fromkeys(uuids, EXCLUSIVE_PROCESS)
    assert _modes(node) == [EXCLUSIVE_PROCESS] * 4
    assert daemon.active_thread_percentage == 10.0  # 100 / 10 replicas
    limit = session.gpu(0).memory_mib // 10
    assert daemon.pinned_mem_limits == {str(i): f"{limit}M" for i in range(4)}
    assert node.exists(f"{ROOT}/.ready")
    assert proc.stop() == 0
    assert _daemon(node) is None  # echo quit | nvidia-cuda-mps-control
    assert _modes(node) == [DEFAULT, PROHIBITED, DEFAULT, DEFAULT]
    assert not node.exists(f"{ROOT}/.ready")


def test_a_crashed_daemon_container_restarts_adopts_the_daemon_and_still_restores_the_first_modes(
        node: FakeHost, session: nvml.NvmlSession) -> None:
    assert node.machine is not None
    node.machine.set_compute_mode(2, PROHIBITED)
    assert _daemon_process(node, session).reconcile()
    # The container is killed (no stop): the daemon lives on in the host's PID namespace, the GPUs stay
    # EXCLUSIVE_PROCESS. The restarted container must neither fail on "already running" nor take
    # EXCLUSIVE_PROCESS for the GPUs' own mode.
    assert _modes(node) == [EXCLUSIVE_PROCESS] * 4
    restarted = _daemon_process(node, session)
    assert restarted.reconcile()
    assert _daemon(node) is not None
    assert restarted.stop() == 0
    assert _daemon(node) is None
    assert _modes(node) == [DEFAULT, DEFAULT, PROHIBITED, DEFAULT]


def test_the_device_plugin_waits_for_the_daemon_and_its_restart_leaves_the_daemon_running(
        node: FakeHost, session: nvml.NvmlSession, tmp_path: Path) -> None:
    options = PluginOptions(source=ConfigSource(config_file=DATA / "nvidia-device-plugin-config-mps.yaml"),
                            socket_dir=tmp_path, metrics_port=0, mps_wait_s=0.2)
    plugin = PluginProcess(options, {}, session, None, host=node.host)
    try:
        with pytest.raises(RuntimeError, match=r"MPS control daemon for nvidia\.com/gpu is not ready"):
            plugin.build()  # no mps-daemon on the node: the plugin does not start one itself
        assert _daemon(node) is None and _modes(node) == [DEFAULT] * 4
    finally:
        plugin.close()
    daemon = _daemon_process(node, session)
    assert daemon.reconcile()
    for _ in range(2):  # the plugin starts, stops, starts again (an upgrade, a kubelet restart)
        plugin = PluginProcess(options, {}, session, None, host=node.host)
        try:
            resources = plugin.build().resources
            assert [r.name for r in resources] == ["nvidia.com/gpu"]
        finally:
            plugin.close()
        served = _daemon(node)
        assert served is not None, "restarting the device plugin stopped the clients' MPS daemon"
        assert _modes(node) == [EXCLUSIVE_PROCESS] * 4
    assert daemon.stop() == 0


def test_nvml_refusing_the_compute_mode_leaves_the_node_not_ready_and_stop_undoes_the_rest(
        node: FakeHost, session: nvml.NvmlSession) -> None:
    assert node.machine is not None
    node.machine.fail_call(2, "nvmlDeviceSetComputeMode", NVML_ERROR_NO_PERMISSION)  # no root in the container
    proc = _daemon_process(node, session)
    assert not proc.reconcile()
    assert _daemon(node) is None and not node.exists(f"{ROOT}/.ready")
    assert _modes(node)[2] == DEFAULT
    node.machine.fail_call(2, "nvmlDeviceSetComputeMode", None)
    assert proc.stop() == 0
    assert _modes(node) == [DEFAULT] * 4


def test_a_daemon_that_fails_to_start_is_retried_and_the_node_is_ready_only_then(
        node: FakeHost, session: nvml.NvmlSession) -> None:
    assert node.machine is not None
    node.machine.fail_mps_start("Failed to start MPS control daemon: the driver is not loaded")
    proc = _daemon_process(node, session)
    assert not proc.reconcile()
    assert _daemon(node) is None and not node.exists(f"{ROOT}/.ready")
    node.machine.fail_mps_start(None)
    assert proc.reconcile()
    assert _daemon(node) is not None and node.exists(f"{ROOT}/.ready")
    assert proc.stop() == 0
    assert _modes(node) == [DEFAULT] * 4


def test_the_plugin_serves_only_a_daemon_with_its_own_settings(node: FakeHost, session: nvml.NvmlSession,
                                                                tmp_path: Path) -> None:
    """A daemon still running the previous replicas (it has not re-read the config yet) is not ready; once
    it has, with the new shares set on the daemon, the plugin serves."""
    shipped = (DATA / "nvidia-device-plugin-config-mps.yaml").read_text()
    config = tmp_path / "mps.yaml"
    config.write_text(shipped)
    daemon = MpsDaemonProcess(DaemonOptions(source=ConfigSource(config_file=config)), {}, session, None, node.host)
    assert daemon.reconcile()
    config.write_text(shipped.replace("replicas: 10", "replicas: 4"))
    options = PluginOptions(source=ConfigSource(config_file=config), socket_dir=tmp_path, metrics_port=0,
                            mps_wait_s=0.2)
    plugin = PluginProcess(options, {}, session, None, host=node.host)
    try:
        with pytest.raises(RuntimeError, match="other settings"):
            plugin.build()
        assert daemon.reconcile()  # the daemon's next read: its plan changed, it restarts with 25 %
        state = _daemon(node)
        assert state is not None and state.active_thread_percentage == 25.0
        (d,) = mps.plan(plugin.build().resources, plugin.settings)
        assert d.active_thread_percentage == 25
    finally:
        plugin.close()
    assert daemon.stop() == 0
    assert _modes(node) == [DEFAULT] * 4


def test_the_mps_daemon_command_serves_until_sigterm_then_restores(node: FakeHost, tmp_path: Path) -> None:
    """``python -m node_agent mps-daemon`` end to end: the pod's command line, then SIGTERM (pod deletion)."""
    assert node.machine is not None
    node.machine.set_compute_mode(3, PROHIBITED)
    state = sim_state_file(node.root, MACHINE)
    argv = [sys.executable, "-m", "node_agent", "--host-root", str(node.root), "--nvml", f"simulated:{MACHINE}",
            "--nvml-state", str(state), "mps-daemon", "--config-file",
            str(DATA / "nvidia-device-plugin-config-mps.yaml"), "--config-poll-interval", "0.5"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not node.exists(f"{ROOT}/.ready") and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert node.exists(f"{ROOT}/.ready"), f"not ready (exit status {proc.poll()})"
        assert _daemon(node) is not None and _modes(node) == [EXCLUSIVE_PROCESS] * 4
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert _daemon(node) is None
    assert _modes(node) == [DEFAULT, DEFAULT, DEFAULT, PROHIBITED]


def test_a_restarted_container_replaces_a_daemon_left_running_for_another_plan(
        node: FakeHost, session: nvml.NvmlSession) -> None:
    """A GPU fell off the bus while the daemon container was down: the daemon it finds still serves all four
    (``CUDA_VISIBLE_DEVICES`` is fixed when ``-d`` starts it), so it is quit and started for the three left;
    the lost GPU's mode cannot be restored until it is back, and stays recorded until then."""
    assert node.machine is not None
    uuids = [node.machine.spec.gpu_uuid(i) for i in range(4)]
    assert _daemon_process(node, session).reconcile()  # then killed, no stop
    node.machine.lose_gpu(3)
    restarted = _daemon_process(node, session)
    assert restarted.reconcile()
    state = _daemon(node)
    assert state is not None and state.visible == uuids[:3]
    assert restarted.stop() == 1  # GPU 3 is lost: its EXCLUSIVE_PROCESS cannot be undone yet
    assert _modes(node)[:3] == [DEFAULT] * 3
    node.machine.restore_gpu(3)
    assert restarted.stop() == 0  # the next stop (the next container) finishes it
    assert _modes(node) == [DEFAULT] * 4


def test_a_restarted_container_whose_node_left_mps_quits_the_daemon_and_restores_the_modes(
        node: FakeHost, session: nvml.NvmlSession, tmp_path: Path) -> None:
    """MPS switched off (the node relabelled to another config) while the daemon container was down: the new
    plan has no daemon, yet the one left running and the GPUs it made exclusive must not outlive it."""
    assert node.machine is not None
    node.machine.set_compute_mode(0, PROHIBITED)
    config = tmp_path / "config.yaml"
    config.write_text((DATA / "nvidia-device-plugin-config-mps.yaml").read_text())
    options = DaemonOptions(source=ConfigSource(config_file=config))
    assert MpsDaemonProcess(options, {}, session, None, node.host).reconcile()  # then killed, no stop
    config.write_text("version: v1\n")
    restarted = MpsDaemonProcess(options, {}, session, None, node.host)
    assert restarted.reconcile()
    assert _daemon(node) is None
    assert _modes(node) == [PROHIBITED, DEFAULT, DEFAULT, DEFAULT]
    assert node.exists(f"{ROOT}/.ready")  # nothing to serve: ready, as NVIDIA's daemon "waits indefinitely"
    assert restarted.stop() == 0
