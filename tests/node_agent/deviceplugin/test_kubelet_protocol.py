"""End to end over unix sockets: the plugin against a kubelet stand-in speaking the real protocol."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

import grpc
import pytest

from node_agent.deviceplugin import config
from node_agent.deviceplugin.cdi import CDI_KIND
from node_agent.deviceplugin.health import HealthPolicy
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.plugin import NodePlugins
from node_agent.kubelet.deviceplugin import lifecycle
from node_agent.status.server import StatusServer
from tests.kit.fakehost import FakeHost
from tests.kit.kubelet.common import wait_until
from tests.node_agent.deviceplugin.builders import machine
from tests.node_agent.deviceplugin.conftest import Running

MACHINES = ["dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "a30x4", "l4x2", "t4x1"]
TIME_SLICING = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
MPS = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n"
RENAMED = TIME_SLICING.replace("timeSlicing:\n", "timeSlicing:\n    renameByDefault: true\n")



@pytest.mark.parametrize("name", MACHINES)
@pytest.mark.parametrize("mode", ["exclusive", "time-slicing", "mps", "renamed"])
def test_machine_and_sharing_mode(run_plugin: Callable[..., Running], host: FakeHost, name: str, mode: str) -> None:
    node = machine(name, host)
    text = {"exclusive": "", "time-slicing": TIME_SLICING, "mps": MPS, "renamed": RENAMED}[mode]
    r = run_plugin(node, text)
    resource = "nvidia.com/gpu.shared" if mode == "renamed" else "nvidia.com/gpu"
    r.kubelet.wait_registered({resource})
    reg = r.kubelet.registrations[0]
    assert reg[0] == "v1beta1" and reg[1] == resource.replace("nvidia.com/", "nvidia-") + ".sock"
    ep = r.kubelet.endpoints[resource]
    assert ep.options.get_preferred_allocation_available and not ep.options.pre_start_required
    replicas = {"exclusive": 1, "time-slicing": 4, "mps": 3, "renamed": 4}[mode]
    ep = r.kubelet.wait_devices(resource, lambda d: len(d) == len(node.gpu_list) * replicas)
    assert set(ep.devices.values()) == {"Healthy"}
    # NUMA from sysfs on every device.
    per_node = max(1, len(node.gpu_list) // 2)
    for g in node.gpu_list:
        ids = [g.uuid] if replicas == 1 else [f"{g.uuid}::{n}" for n in range(replicas)]
        for i in ids:
            assert ep.topology[i] == [g.index // per_node]
    ids = sorted(ep.devices)
    size = min(2, len(node.gpu_list)) if mode != "mps" else 1
    chosen = r.kubelet.preferred(resource, ids, [], size)
    assert len(chosen) == size and set(chosen) <= set(ids)
    resp = r.kubelet.allocate(resource, chosen)
    c = resp.container_responses[0]
    uuids = [i.split("::")[0] for i in chosen]
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(dict.fromkeys(uuids))
    if mode == "mps":
        assert c.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
        assert c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
        mib = node.gpu_list[0].memory_mib // 3
        assert c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mib}M"
        assert {(m.container_path, m.host_path) for m in c.mounts} == {
            ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"), ("/dev/shm", "/run/nvidia/mps/shm")}
    if mode in ("time-slicing", "renamed") and len(node.gpu_list) > 1:
        # distributed: two replicas land on two different GPUs
        assert len({i.split("::")[0] for i in chosen}) == 2
    assert r.kubelet.prestart(resource, chosen) is not None
    assert r.stop() == 0
    assert not list(r.kubelet.dir.glob("nvidia-*.sock"))


def test_mig_mixed_registers_one_socket_per_profile(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    node = machine("dgx-h100", host, mig=["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
    r = run_plugin(node, "version: v1\nflags:\n  migStrategy: mixed\n")
    want = {"nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-1g.10gb"}
    r.kubelet.wait_registered(want)
    ep = r.kubelet.wait_devices("nvidia.com/mig-1g.10gb", lambda d: len(d) == 16)
    assert all(i.startswith("MIG-") for i in ep.devices)
    assert {p.name for p in r.kubelet.dir.glob("nvidia-*.sock")} == {
        "nvidia-mig-3g.40gb.sock", "nvidia-mig-2g.20gb.sock", "nvidia-mig-1g.10gb.sock"}
    mig = node.gpu_list[3].migs[0]
    resp = r.kubelet.allocate("nvidia.com/mig-3g.40gb", [mig.uuid])
    assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == mig.uuid


def test_mig_single_uses_gpu_resource(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    node = machine("dgx-a100-40gb", host, mig=["1g.5gb"] * 7)
    r = run_plugin(node, "flags: {migStrategy: single}\n")
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 56)


def test_cdi_cri_and_annotations(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    node = machine("l4x2", host)
    r = run_plugin(node, "flags:\n  plugin:\n    deviceListStrategy: [cdi-cri, cdi-annotations]\n")
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    g = node.gpu_list[1]
    c = r.kubelet.allocate("nvidia.com/gpu", [g.uuid]).container_responses[0]
    assert [d.name for d in c.cdi_devices] == [f"{CDI_KIND}={g.uuid}"]
    (key, value), = c.annotations.items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_") and value == f"{CDI_KIND}={g.uuid}"
    assert not c.envs  # only CDI strategies: nothing else
    assert host.exists("/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml")


def test_malformed_requests_are_rejected_with_nvidia_wording(run_plugin: Callable[..., Running],
                                                             host: FakeHost) -> None:
    node = machine("dgx-a100-40gb", host)
    r = run_plugin(node, TIME_SLICING.replace("timeSlicing:\n", "timeSlicing:\n    failRequestsGreaterThanOne: true\n"))
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    with pytest.raises(grpc.RpcError) as e:
        r.kubelet.allocate("nvidia.com/gpu", ["GPU-not-there"])
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert e.value.details() == "invalid allocation request for 'nvidia.com/gpu': unknown device: GPU-not-there"
    u = node.gpu_list[0].uuid
    with pytest.raises(grpc.RpcError) as e:
        r.kubelet.allocate("nvidia.com/gpu", [f"{u}::0", f"{u}::1"])
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert e.value.details() == ("request for 'nvidia.com/gpu: 2' too large: "
                                 "maximum request size for shared resources is 1")
    with pytest.raises(grpc.RpcError) as e:
        r.kubelet.preferred("nvidia.com/gpu", [f"{u}::0"], ["nope"], 1)
    assert "unknown device: nope" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        r.kubelet.preferred("nvidia.com/gpu", [f"{u}::0"], [], 2)
    assert "allocation size 2" in e.value.details()
    with pytest.raises(grpc.RpcError):
        r.kubelet.allocate("nvidia.com/gpu", [])
    # The plugin keeps serving after rejections.
    assert r.kubelet.allocate("nvidia.com/gpu", [f"{u}::0"]).container_responses[0].envs


def test_xid_marks_unhealthy_within_100ms_and_ignored_xids_do_not(run_plugin: Callable[..., Running],
                                                                  host: FakeHost) -> None:
    node = machine("dgx-h100", host)
    r = run_plugin(node)
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    ep = r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    for x in (13, 31, 43, 45, 68, 109):
        node.xid(2, x)
    node.xid(5, 79)
    t0 = time.monotonic()
    ep = r.kubelet.wait_devices("nvidia.com/gpu", lambda d: d[node.gpu_list[5].uuid] == "Unhealthy", timeout=2)
    assert ep.update_times[-1] - t0 < 0.1
    assert ep.devices[node.gpu_list[2].uuid] == "Healthy"
    assert sum(1 for h in ep.devices.values() if h == "Unhealthy") == 1


def test_xid_storm_and_gpu_lost(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    node = machine("dgx-a100-80gb", host)
    r = run_plugin(node, TIME_SLICING)
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 32)
    for _ in range(500):
        node.xid(1, 48)
        node.xid(1, 13)
    node.lose(6)
    lost = node.gpu_list[6].uuid
    ep = r.kubelet.wait_devices(
        "nvidia.com/gpu",
        lambda d: all(d[f"{lost}::{n}"] == "Unhealthy" for n in range(4))
        and all(d[f"{node.gpu_list[1].uuid}::{n}"] == "Unhealthy" for n in range(4)),
    )
    assert sum(1 for h in ep.devices.values() if h == "Unhealthy") == 8
    # A storm produces a handful of stream updates, not one per event.
    assert ep.updates < 10
    assert r.stop() == 0


def test_recovery_after_quiet_period(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    node = machine("l4x2", host)
    r = run_plugin(node, policy=HealthPolicy(recovery_quiet_s=0.3, recheck_interval_s=0.05))
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    # Timed from the XID itself, not from when the stand-in saw Unhealthy (that can lag on a busy machine).
    t = time.monotonic()
    node.xid(0, 79)
    u = node.gpu_list[0].uuid
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: d.get(u) == "Unhealthy")
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: d.get(u) == "Healthy", timeout=10)
    assert time.monotonic() - t >= 0.3
    metrics = r.metrics.render().decode()
    assert 'to="Healthy"' in metrics and 'to="Unhealthy"' in metrics


@pytest.mark.parametrize("use_inotify", [True, False])
def test_kubelet_restart_mid_stream_reregisters_within_1s(run_plugin: Callable[..., Running], host: FakeHost,
                                                         use_inotify: bool) -> None:
    node = machine("dgx-h100", host, mig=["1g.10gb"] * 7)
    r = run_plugin(node, "flags: {migStrategy: mixed}\n", use_inotify=use_inotify)
    r.kubelet.wait_registered({"nvidia.com/mig-1g.10gb"})
    old = r.kubelet.endpoints["nvidia.com/mig-1g.10gb"]
    r.kubelet.wait_devices("nvidia.com/mig-1g.10gb", lambda d: len(d) == 56)
    node.xid(3, 48)  # GPU 3 fails before kubelet restarts
    r.kubelet.wait_devices("nvidia.com/mig-1g.10gb", lambda d: list(d.values()).count("Unhealthy") == 7)
    t = r.kubelet.restart()
    r.kubelet.wait_registered({"nvidia.com/mig-1g.10gb"}, timeout=1.0, after=t)
    assert old.stream_ended.wait(2)
    ep = r.kubelet.wait_devices("nvidia.com/mig-1g.10gb", lambda d: len(d) == 56)
    # The restart did not hide the failure: the first list after re-registration still has it.
    unhealthy = {i for i, h in ep.devices.items() if h == "Unhealthy"}
    assert unhealthy == {m.uuid for m in node.gpu_list[3].migs}
    assert r.supervisor.state.restarts >= 1


def test_at_rest_the_supervisor_sleeps_and_a_reload_wakes_it_at_once(run_plugin: Callable[..., Running],
                                                                      host: FakeHost) -> None:
    """Registered and at rest, the loop waits on the socket directory and its own requests in one wait
    (it used to pass every 0.5 s, polling its queue between 0.1 s looks at inotify); a reload still
    restarts the plugins at once."""
    r = run_plugin(machine("a30x4", host), TIME_SLICING)
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    wait_until(r.supervisor.ready, what="supervisor ready")
    time.sleep(0.2)
    beat = r.supervisor.state.last_beat
    time.sleep(1.2)
    assert r.supervisor.state.last_beat == beat, "the loop passed while nothing happened"
    restarts = r.supervisor.state.restarts
    t0 = time.monotonic()
    r.supervisor.request_reload()
    wait_until(lambda: r.supervisor.state.restarts > restarts, what="the reload's restart")
    assert time.monotonic() - t0 < 1.0

def test_kubelet_restart_keeping_plugin_sockets_reregisters(run_plugin: Callable[..., Running],
                                                            host: FakeHost) -> None:
    r = run_plugin(machine("a30x4", host), TIME_SLICING)
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    t = r.kubelet.restart(wipe=False)  # only kubelet.sock is recreated
    r.kubelet.wait_registered({"nvidia.com/gpu"}, timeout=1.0, after=t)
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 16)
    time.sleep(0.3)  # no second, spurious restart follows
    assert sum(1 for *_, when in r.kubelet.registrations if when >= t) == 1


def test_plugin_started_before_kubelet_registers_when_it_appears(run_plugin: Callable[..., Running],
                                                                  host: FakeHost) -> None:
    r = run_plugin(machine("t4x1", host), kubelet=False)
    time.sleep(0.3)
    assert not r.supervisor.ready()
    t = time.monotonic()
    r.kubelet.start()
    r.kubelet.wait_registered({"nvidia.com/gpu"}, timeout=1.0, after=t)
    # The stand-in records the registration before the plugin has read kubelet's answer.
    wait_until(r.supervisor.ready, what="supervisor ready")


def test_registration_refused_is_fatal(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    r = run_plugin(machine("t4x1", host))
    r.kubelet.stop()
    r.kubelet._reject = lambda req: f"resource {req.resource_name} is already registered"
    r.kubelet.start()
    # Generous: a registration caught mid-restart is retried with backoff before the refusal arrives.
    r.thread.join(30)
    assert r.result == [1]
    assert not list(r.kubelet.dir.glob("nvidia-*.sock"))


def test_reload_rebuilds_with_new_config(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    node = machine("l4x2", host)
    texts = [""]
    metrics = PluginMetrics()

    def build() -> NodePlugins:
        return NodePlugins(node, config.load(texts[-1]), host, metrics=metrics, policy=HealthPolicy())

    r = run_plugin(node, build=build)
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 2)
    texts.append(RENAMED)
    t = time.monotonic()
    r.supervisor.request_reload("sighup")
    r.kubelet.wait_registered({"nvidia.com/gpu.shared"}, timeout=1.0, after=t)
    r.kubelet.wait_devices("nvidia.com/gpu.shared", lambda d: len(d) == 8)
    assert not (r.kubelet.dir / "nvidia-gpu.sock").exists()


def test_fail_on_init_error(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    def broken() -> object:
        raise RuntimeError("NVML Shared Library Not Found")

    r = run_plugin(machine("t4x1", host), build=broken)
    r.thread.join(5)
    assert r.result == [1]

    # failOnInitError off: stay up advertising nothing, and retry until the driver is there.
    node = machine("t4x1", host)
    attempts: list[int] = []

    def late_driver() -> NodePlugins:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("NVML Shared Library Not Found")
        return NodePlugins(node, config.load(""), host, metrics=PluginMetrics(), policy=HealthPolicy())

    r2 = run_plugin(node, "flags: {failOnInitError: false}\n", build=late_driver, init_retry_s=0.1)
    r2.kubelet.wait_registered({"nvidia.com/gpu"}, timeout=5)
    assert len(attempts) == 3 and r2.thread.is_alive()
    assert r2.stop() == 0


def test_status_endpoints(run_plugin: Callable[..., Running], host: FakeHost) -> None:
    r = run_plugin(machine("l4x2", host), kubelet=False)
    status = StatusServer(r.metrics, r.supervisor.live, r.supervisor.ready, "127.0.0.1", 0)
    status.start()
    base = f"http://127.0.0.1:{status.port}"
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
        assert e.value.code == 503
        e.value.close()
        r.kubelet.start()
        r.kubelet.wait_registered({"nvidia.com/gpu"}, timeout=3)
        r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 2)
        r.kubelet.allocate("nvidia.com/gpu", [machine("l4x2", host).gpu_list[0].uuid])
        wait_until(r.supervisor.ready, what="supervisor ready")  # kubelet's answer may still be on its way
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'nvidia_gpu_device_plugin_registered{resource="nvidia.com/gpu"} 1.0' in text
        assert 'nvidia_gpu_device_plugin_allocations_total{resource="nvidia.com/gpu"} 1.0' in text
        assert 'nvidia_gpu_device_plugin_devices{health="Healthy",resource="nvidia.com/gpu"} 2.0' in text
    finally:
        status.stop()


def test_half_started_servers_are_cleaned_up_before_retry(run_plugin: Callable[..., Running], host: FakeHost,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = lifecycle.ResourceServer.start
    calls: list[str] = []
    servers: list[lifecycle.ResourceServer] = []

    def flaky(self: lifecycle.ResourceServer) -> None:
        calls.append(self.plugin.name)
        servers.append(self)
        if len(calls) == 2:  # the second resource's socket does not answer, once
            raise lifecycle.TransientError(f"{self.plugin.name}: own socket does not answer")
        real_start(self)

    monkeypatch.setattr(lifecycle.ResourceServer, "start", flaky)
    node = machine("dgx-a100-40gb", host, mig=["3g.20gb", "1g.5gb"])
    r = run_plugin(node, "flags: {migStrategy: mixed}\n")
    r.kubelet.wait_registered({"nvidia.com/mig-3g.20gb", "nvidia.com/mig-1g.5gb"}, timeout=5)
    assert len(calls) == 4
    assert {p.name for p in r.kubelet.dir.glob("nvidia-*.sock")} == {"nvidia-mig-3g.20gb.sock",
                                                                    "nvidia-mig-1g.5gb.sock"}
    assert len(r.supervisor.servers) == 2
    # The first attempt's server that did start was stopped, not leaked.
    assert servers[0] not in r.supervisor.servers and servers[0]._server is None
