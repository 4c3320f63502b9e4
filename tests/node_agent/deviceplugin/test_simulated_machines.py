"""The plugin over the agent's NVML facade on every simulated machine (nvidia-ml-py underneath)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node_agent import nvml
from node_agent.deviceplugin import config
from node_agent.deviceplugin.health import HealthPolicy
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices
from node_agent.deviceplugin.plugin import NodePlugins
from node_agent.deviceplugin.preferred import best_set, set_score
from node_agent.host import HostRoot
from nvml_sim import MACHINE_NAMES, SimulatedMachine
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.migcaps import write_mig_minors
from tests.node_agent.deviceplugin.conftest import Running


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Callable[[str], tuple[SimulatedMachine, nvml.NvmlSession]]]:
    with_sessions = []

    def open_machine(name: str) -> tuple[SimulatedMachine, nvml.NvmlSession]:
        state = tmp_path / f"{name}.json"
        machine = SimulatedMachine(name, state)
        cm = nvml.open_nvml(nvml.NvmlBackend.parse(f"simulated:{name}", state_file=state))
        session = cm.__enter__()
        with_sessions.append(cm)
        return machine, session

    yield open_machine
    for cm in reversed(with_sessions):
        cm.__exit__(None, None, None)


SPECS = "flags: {plugin: {passDeviceSpecs: true}}\n"
MODES = {
    "exclusive": (SPECS, 1),
    "time-slicing": (SPECS + "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}", 4),
    "mps": (SPECS + "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}", 2),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_every_simulated_machine_and_sharing_mode(run_plugin: Callable[..., Running], tmp_path: Path,
                                                  name: str, mode: str) -> None:
    fake = build_fake_host(tmp_path / "root", name)
    assert fake.machine is not None
    machine = fake.machine
    host = HostRoot(fake.root)  # what production passes, over a fake host root
    text, replicas = MODES[mode]
    metrics = PluginMetrics()
    with nvml.open_nvml(nvml.NvmlBackend.parse(f"simulated:{name}", machine.store.path)) as session:
        node = NvmlNodeDevices(session)

        def build() -> NodePlugins:
            return NodePlugins(node, config.load(text), host, metrics=metrics,
                               policy=HealthPolicy(recovery_quiet_s=3600, recheck_interval_s=3600))

        r = run_plugin(node, build=build)
        try:
            _exercise(r, node, machine, replicas)
        finally:
            r.stop()
            node.close()


def _exercise(r: Running, node: NvmlNodeDevices, machine: SimulatedMachine, replicas: int) -> None:
    r.kubelet.wait_registered({"nvidia.com/gpu"})
    n = machine.spec.gpu_count
    ep = r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == n * replicas)
    uuids = {machine.spec.gpu_uuid(i) for i in range(n)}
    assert {i.split("::")[0] for i in ep.devices} == uuids
    # NUMA from the host's sysfs, per device.
    for i in range(n):
        assert ep.topology[next(d for d in ep.devices if d.startswith(machine.spec.gpu_uuid(i)))] == [
            machine.spec.numa_nodes[i]]
    first = sorted(ep.devices)[0]
    c = r.kubelet.allocate("nvidia.com/gpu", [first]).container_responses[0]
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == first.split("::")[0]
    # Device specs: the control nodes the fake host has, then the GPU's own node.
    assert [d.host_path for d in c.devices] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
        f"/dev/nvidia{next(g.minor for g in node.gpus() if g.uuid == first.split('::')[0])}"]
    if replicas == 1 and n >= 4:
        ids = sorted(ep.devices)
        chosen = r.kubelet.preferred("nvidia.com/gpu", ids, [], 4)
        gpus = {g.uuid: g for g in node.gpus()}
        idx = [gpus[i].index for i in chosen]

        def score(a: int, b: int) -> int:
            return node.link(node.gpus()[a], node.gpus()[b]).score

        best = best_set(n, score, [], 4)
        assert set_score(idx, score) == set_score(best, score)
    # An XID from the simulator reaches the stream; a lost GPU turns Unhealthy.
    machine.inject_xid(0, 48)
    t0 = time.monotonic()
    u0 = machine.spec.gpu_uuid(0)
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: all(h == "Unhealthy" for i, h in d.items() if i.startswith(u0)),
                           timeout=2)
    assert time.monotonic() - t0 < 0.5
    if n > 1:
        machine.lose_gpu(n - 1)
        u = machine.spec.gpu_uuid(n - 1)
        r.kubelet.wait_devices("nvidia.com/gpu", lambda d: all(h == "Unhealthy" for i, h in d.items()
                                                               if i.startswith(u)), timeout=2)


def test_simulated_mig_mixed(run_plugin: Callable[..., Running], host: FakeHost,
                             sim: Callable[[str], tuple[SimulatedMachine, nvml.NvmlSession]]) -> None:
    machine, session = sim("dgx-a100-40gb")
    session.set_mig_mode(0, True)
    machine.reset_gpu(0)
    p3 = next(p for p in session.gpu_instance_profiles(0) if p.name == "3g.20gb")
    p1 = next(p for p in session.gpu_instance_profiles(0) if p.name == "1g.5gb")
    for prof in (p3, p1, p1):
        gi = session.create_gpu_instance(0, prof.id)
        session.create_compute_instance(0, gi.id)
    # MIG capability minors, as the driver publishes them.
    gpu0 = session.gpu(0)
    write_mig_minors(host.root, [g.minor for g in session.gpus()])
    node = NvmlNodeDevices(session)
    metrics = PluginMetrics()

    def build() -> NodePlugins:
        return NodePlugins(node, config.load("flags: {migStrategy: mixed}"), host, metrics=metrics,
                           policy=HealthPolicy(recovery_quiet_s=3600, recheck_interval_s=3600))

    r = run_plugin(node, build=build)
    r.kubelet.wait_registered({"nvidia.com/gpu", "nvidia.com/mig-3g.20gb", "nvidia.com/mig-1g.5gb"})
    r.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 7)
    ep = r.kubelet.wait_devices("nvidia.com/mig-1g.5gb", lambda d: len(d) == 2)
    # An XID on one GPU instance marks only that MIG device.
    mig = next(m for m in gpu0.mig_devices if m.profile == "1g.5gb")
    machine.inject_xid(0, 48, gi_id=mig.gi_id, ci_id=mig.ci_id)
    ep = r.kubelet.wait_devices("nvidia.com/mig-1g.5gb", lambda d: d[str(mig.uuid)] == "Unhealthy")
    assert sorted(ep.devices.values()) == ["Healthy", "Unhealthy"]
    # Registered is not listed yet: the stand-in's ListAndWatch may still be on its way on a busy machine.
    big = r.kubelet.wait_devices("nvidia.com/mig-3g.20gb", lambda d: len(d) == 1)
    assert list(big.devices.values()) == ["Healthy"]
    c = r.kubelet.allocate("nvidia.com/mig-3g.20gb", list(big.devices))
    assert c.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    node.close()
