"""The agent-side wiring: the NVML inventory source on simulated machines, the uninstall watcher against
the fake API server, and the ``dra-driver`` command as a real process registered by the kubelet stand-in."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from node_agent.dra.api import KubeDraApi
from node_agent.dra.cleanup import FINALIZER, MarkerState, UninstallWatcher
from node_agent.dra.devices import HealthAction, allocatable_devices
from node_agent.dra.driver import DraDriver, DriverSettings
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.host.root import HostRoot
from node_agent.nvml.session import NvmlBackend, open_nvml
from nvml_sim import SimulatedMachine
from tests.kit import metrics
from tests.kit.dra_builders import DRIVER, NODE, RecordingSharing, claim, machine, populate_dev
from tests.kit.kmock import FakeApiServer
from tests.kit.kubelet.common import wait_until
from tests.kit.kubelet.dra import DraKubelet
from tests.node_agent.dra.conftest import Env

REPO = Path(__file__).resolve().parents[3]


def test_dgx_h100_inventory(host_root: Path) -> None:
    source = NvmlInventorySource("simulated:dgx-h100", HostRoot(host_root))
    try:
        inv = source.snapshot()
    finally:
        source.close()
    devices = allocatable_devices(inv)
    assert [d.name for d in devices] == [f"gpu-{i}" for i in range(8)]
    attrs = devices[0].attributes
    assert attrs["architecture"].value == "Hopper" and attrs["brand"].value == "Nvidia"
    assert attrs["driverVersion"].to_api() == {"version": "550.90.7"}
    assert devices[0].capacity["memory"] == 81559 * 2**20


def test_mig_devices_and_lost_gpu_on_a_simulated_a100(host_root: Path, tmp_path: Path) -> None:
    backend = NvmlBackend.parse("simulated:dgx-a100-80gb", state_file=tmp_path / "sim.json")
    with open_nvml(backend) as nvml:
        nvml.set_mig_mode(1, True)
        for profile_id in (9, 14, 19):  # 3g.40gb, 2g.20gb, 1g.10gb
            gi = nvml.create_gpu_instance(1, profile_id)
            nvml.create_compute_instance(1, gi.id)
    minors = host_root / "proc/driver/nvidia-caps/mig-minors"
    minors.parent.mkdir(parents=True)
    minors.write_text("gpu1/gi1/access 21\ngpu1/gi1/ci0/access 22\ngpu1/gi2/access 30\n")
    source = NvmlInventorySource(backend, HostRoot(host_root))
    try:
        devices = allocatable_devices(source.snapshot())
        names = [d.name for d in devices]
        assert "gpu-1" not in names
        # The placement start is NVML's choice; the name carries it (gpu-<minor>-mig-<profile>-<id>-<start>).
        [mig] = [d for d in devices if d.name.startswith("gpu-1-mig-3g40gb-9-")]
        first_slice = min(int(k.removeprefix("memorySlice")) for k in mig.capacity if k.startswith("memorySlice"))
        assert mig.name == f"gpu-1-mig-3g40gb-9-{first_slice}"
        assert mig.device_nodes == ("/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")
        assert mig.capacity["copyEngines"] >= 1
        SimulatedMachine("dgx-a100-80gb", tmp_path / "sim.json").lose_gpu(3)
        inv = source.snapshot()
        assert [g.minor for g in inv.gpus if g.unhealthy == "gpu-lost"] == [3]
        assert "gpu-3" not in [d.name for d in allocatable_devices(inv)]
        tainted = {d.name: d for d in allocatable_devices(inv, DRIVER, HealthAction.TAINT)}
        assert tainted["gpu-3"].taints[0].key == "gpu.nvidia.com/gpu-lost"
    finally:
        source.close()


def _marker(server: FakeApiServer, **meta: object) -> None:
    core = client.CoreV1Api(server.api_client())
    core.create_namespaced_config_map("nvidia-gpu", cast(Any, {"metadata": {"name": "dra-uninstall-marker", **meta}}))


def test_uninstall_marker_withdraws_slices_then_releases(env: Env) -> None:
    env.driver.start()
    assert env.server.slices()
    watcher = UninstallWatcher(kube_api(env), driver=DRIVER, marker="nvidia-gpu/dra-uninstall-marker",
                               withdraw=env.driver.withdraw)
    assert watcher.check() is MarkerState.ABSENT
    _marker(env.server)
    assert watcher.check() is MarkerState.ARMED
    core = client.CoreV1Api(env.server.api_client())
    marker = core.read_namespaced_config_map("dra-uninstall-marker", "nvidia-gpu").metadata
    assert marker is not None and marker.finalizers == [FINALIZER]
    core.delete_namespaced_config_map("dra-uninstall-marker", "nvidia-gpu")  # finalizer holds it
    assert watcher.check() is MarkerState.RELEASED
    assert env.server.slices() == []
    assert env.driver.refresh() is None  # never republished after uninstall
    with pytest.raises(client.ApiException):
        core.read_namespaced_config_map("dra-uninstall-marker", "nvidia-gpu")


def test_uninstall_grace_period_releases_despite_other_nodes_slices(env: Env) -> None:
    env.driver.start()
    other = dict(env.server.slices()[0])
    other["metadata"] = {"name": "other-node-slice"}
    other["spec"] = {**other["spec"], "nodeName": "other-node", "pool": {**other["spec"]["pool"], "name": "other"}}
    client.ResourceV1Api(env.server.api_client()).create_resource_slice(cast(Any, other))
    clock = [1_000_000_000.0]
    watcher = UninstallWatcher(kube_api(env), driver=DRIVER, marker="nvidia-gpu/dra-uninstall-marker",
                               withdraw=env.driver.withdraw, grace=60, wall_clock=lambda: clock[0])
    _marker(env.server, finalizers=[FINALIZER], deletionTimestamp="2001-09-09T01:46:40Z")
    assert watcher.check() is MarkerState.UNINSTALLING  # other node's slice still there
    clock[0] += 61
    assert watcher.check() is MarkerState.RELEASED


def test_the_uninstall_watcher_waits_on_a_watch_not_a_poll(env: Env) -> None:
    """An armed marker is not read again until its watch reports a change: a watch that ends with the
    marker unchanged is resumed from the version it ended at (polling every 5 s cost 12 requests a minute
    on every DRA node); the deletion the watch reports withdraws the slices at once, with the poll slowed
    to a minute. (kmock sends no events for ConfigMaps: the watch itself is scripted here and runs
    against the real API server in the cluster tests.)"""
    env.driver.start()
    _marker(env.server)
    api_ = kube_api(env)
    core = client.CoreV1Api(env.server.api_client())
    reads: list[str] = []
    waits: list[tuple[str, float]] = []
    real_get = api_.get_config_map

    def get_config_map(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(name)
        return real_get(namespace, name)

    def wait(namespace: str, name: str, resource_version: str, timeout_s: float) -> str | None:
        waits.append((resource_version, timeout_s))
        if len(waits) <= 3:
            return f"v{len(waits)}"  # ran its course; bookmarks moved the version on
        core.delete_namespaced_config_map(name, namespace)  # the finalizer holds it: marked for deletion
        return None

    api_.get_config_map = get_config_map  # type: ignore[method-assign]
    api_.wait_config_map_change = wait  # type: ignore[method-assign]
    watcher = UninstallWatcher(api_, driver=DRIVER, marker="nvidia-gpu/dra-uninstall-marker",
                               withdraw=env.driver.withdraw)
    stop = threading.Event()
    loop = threading.Thread(target=watcher.run, args=(stop,), kwargs={"interval": 60}, daemon=True)
    started = time.monotonic()
    loop.start()
    try:
        wait_until(lambda: env.server.slices() == [], timeout=5, what="slices withdrawn")
        assert time.monotonic() - started < 5
        assert len(reads) == 2  # armed it, then read it once more when the watch said it changed
        assert [rv for rv, _ in waits][1:] == ["v1", "v2", "v3"] and {t for _, t in waits} == {300.0}
    finally:
        stop.set()


def kube_api(env: Env) -> KubeDraApi:
    return KubeDraApi(env.server.kube())


def _kubeconfig(api_server: FakeApiServer, path: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: '{api_server.url.rstrip('/')}'}}}}]\n"
        "users: [{name: t, user: {}}]\ncontexts: [{name: t, context: {cluster: t, user: t}}]\n")
    return path


@pytest.mark.slow
def test_dra_driver_command_serves_until_sigterm(host_root: Path, api_server: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(api_server, tmp_path / "kubeconfig")
    populate_dev(host_root, machine(gpus=8))
    port = metrics.free_port()
    status = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "node_agent", "--host-root", str(host_root), "--nvml", "simulated:dgx-h100",
         "--node-name", NODE, "--kubeconfig", str(kubeconfig), "dra-driver", "--poll-interval", "0.2",
         "--metrics-address", "127.0.0.1", "--metrics-port", str(port)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE)
    kubelet = DraKubelet(host_root)
    try:
        kubelet.register(timeout=20)
        assert len(api_server.slices()[0]["spec"]["devices"]) == 8
        assert metrics.get(f"{status}/readyz") == (200, "ok\n")  # kubelet accepted the registration
        body = claim("cli", "uid-cli", [("gpu", "gpu-7")])
        client.ResourceV1Api(api_server.api_client()).create_namespaced_resource_claim("team-a", cast(Any, body))
        resp = kubelet.prepare(DRIVER, [("team-a", "cli", "uid-cli")])
        assert resp.claims["uid-cli"].error == ""
        assert (host_root / "var/run/cdi/k8s.gpu.nvidia.com-claim_uid-cli.json").exists()
        refused = kubelet.prepare(DRIVER, [("team-a", "missing", "uid-missing")])
        assert refused.claims["uid-missing"].error
        code, text = metrics.get(f"{status}/metrics")
        assert code == 200
        got = metrics.parse(text)
        m = "nvidia_gpu_dra_plugin"
        assert metrics.value(got, f"{m}_registered", driver=DRIVER) == 1
        assert metrics.value(got, f"{m}_registrations_total", driver=DRIVER, result="ok") == 1
        assert metrics.value(got, f"{m}_prepares_total", result="ok") == 1
        assert metrics.value(got, f"{m}_prepares_total", result="error") == 1
        assert metrics.value(got, f"{m}_prepare_duration_seconds_count") == 2
        assert metrics.value(got, f"{m}_devices", health="Healthy") == 8
        assert metrics.value(got, f"{m}_devices", health="Unhealthy") == 0
        assert metrics.value(got, f"{m}_prepared_claims") == 1
        assert metrics.value(got, f"{m}_slice_publications_total", result="ok") >= 1
        kubelet.unprepare(DRIVER, [("team-a", "cli", "uid-cli")])
        got = metrics.parse(metrics.get(f"{status}/metrics")[1])
        assert metrics.value(got, f"{m}_unprepares_total", result="ok") == 1
        assert metrics.value(got, f"{m}_prepared_claims") == 0
    finally:
        kubelet.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    # SIGTERM removed both sockets: the kubelet deregisters the plugin.
    assert not list((host_root / "var/lib/kubelet/plugins_registry").glob("*.sock"))
    assert not list((host_root / "var/lib/kubelet/plugins").rglob("*.sock"))


@pytest.mark.slow
def test_a_taken_status_port_does_not_stop_the_dra_plugin(host_root: Path, api_server: FakeApiServer,
                                                           tmp_path: Path) -> None:
    """Another process holds the status port: the plugin publishes, registers and prepares all the same,
    and says once why it serves no metrics; with --metrics-port-required it exits naming the address."""
    kubeconfig = _kubeconfig(api_server, tmp_path / "kubeconfig")
    populate_dev(host_root, machine(gpus=8))
    command = [sys.executable, "-m", "node_agent", "--host-root", str(host_root), "--nvml", "simulated:dgx-h100",
               "--node-name", NODE, "--kubeconfig", str(kubeconfig), "dra-driver", "--poll-interval", "0.2",
               "--metrics-address", "127.0.0.1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        proc = subprocess.Popen([*command, "--metrics-port", port], cwd=REPO, env=env, stderr=subprocess.PIPE)
        kubelet = DraKubelet(host_root)
        try:
            kubelet.register(timeout=20)
            assert len(api_server.slices()[0]["spec"]["devices"]) == 8
        finally:
            kubelet.close()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err.decode()
        assert err.decode().count("event=status-port-unavailable") == 1, err.decode()
        required = subprocess.run([*command, "--metrics-port", port, "--metrics-port-required"], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=60, check=False)
    assert required.returncode == 1, required.stderr
    assert f"error: status endpoint 127.0.0.1:{port}: Address already in use (errno 98)" in required.stdout + \
        required.stderr
    assert "Traceback" not in required.stderr


def test_critical_xid_withdraws_a_gpu_until_it_stays_quiet_and_recovers(host_root: Path, tmp_path: Path) -> None:
    backend = NvmlBackend.parse("simulated:dgx-h100", state_file=tmp_path / "sim.json")
    clock = [0.0]
    source = NvmlInventorySource(backend, HostRoot(host_root), xid_quiet_s=60, clock=lambda: clock[0])
    machine = SimulatedMachine("dgx-h100", tmp_path / "sim.json")
    try:
        source.snapshot()
        machine.inject_xid(2, 13)  # an application error: ignored, as NVIDIA does
        machine.inject_xid(5, 48)  # double-bit ECC: critical
        inv = source.snapshot()
        assert [(g.minor, g.xid) for g in inv.gpus if g.unhealthy] == [(5, 48)]
        assert "gpu-5" not in [d.name for d in allocatable_devices(inv)]
        [tainted] = [d for d in allocatable_devices(inv, DRIVER, HealthAction.TAINT) if d.name == "gpu-5"]
        assert tainted.to_api()["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]
        clock[0] += 61
        # Quiet, but the double-bit error left a row remap pending: the GPU stays withdrawn until a reset.
        assert [(g.minor, g.xid) for g in source.snapshot().gpus if g.unhealthy] == [(5, 48)]
        machine.reset_gpu(5)
        assert not [g for g in source.snapshot().gpus if g.unhealthy]
    finally:
        source.close()


def test_a_critical_xid_wakes_the_inventory_loop_at_once(host_root: Path, tmp_path: Path,
                                                          api_server: FakeApiServer) -> None:
    """The loop sleeps on NVML's XID events: with a 30 s poll, a double-bit ECC error withdraws its GPU within
    seconds (it used to wait for the next poll), an application XID wakes nothing, and a stop ends the
    wait within its 1 s slice."""
    backend = NvmlBackend.parse("simulated:dgx-h100", state_file=tmp_path / "sim.json")
    source = NvmlInventorySource(backend, HostRoot(host_root))
    machine = SimulatedMachine("dgx-h100", tmp_path / "sim.json")
    stop = threading.Event()
    try:
        populate_dev(host_root, source.snapshot())
        t0 = time.monotonic()
        assert source.wait_change(0.3, stop) is False and time.monotonic() - t0 >= 0.25
        driver = DraDriver(DriverSettings(driver=DRIVER, node=NODE, poll_interval=30.0),
                           api=KubeDraApi(api_server.kube()), source=source, host=HostRoot(host_root),
                           backend=RecordingSharing())
        driver.start()
        assert "gpu-5" in driver.devices()
        loop = threading.Thread(target=driver.run_inventory_loop, args=(stop,), daemon=True)
        loop.start()
        machine.inject_xid(2, 13)  # an application error: the loop sleeps on
        time.sleep(0.3)
        assert "gpu-2" in driver.devices()
        t0 = time.monotonic()
        machine.inject_xid(5, 48)
        wait_until(lambda: "gpu-5" not in driver.devices(), timeout=5, what="gpu-5 withdrawn")
        assert time.monotonic() - t0 < 5
        t0 = time.monotonic()
        stop.set()
        loop.join(5)
        assert not loop.is_alive() and time.monotonic() - t0 < 2
        driver.close()
    finally:
        stop.set()
        source.close()
