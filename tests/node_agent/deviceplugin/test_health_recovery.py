"""A GPU an XID left needing a reset stays Unhealthy until NVML shows it recovered (issue 33, item 4).

NVIDIA's plugin never turns a device Healthy again (k8s-device-plugin ``internal/rm/health.go``); ours
does, but only once NVML shows nothing outstanding: no recovery action, no pending or failed row remap,
no pending retired page. These run the health monitor over the agent's NVML facade on simulated machines
whose XIDs leave what they leave on real GPUs (``nvml_sim.state.xid_aftermath``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node_agent import nvml
from node_agent.deviceplugin.devices import HealthEvent, HealthEventKind, Recovery
from node_agent.deviceplugin.health import HealthBoard, HealthMonitor, HealthPolicy
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices
from nvml_sim import SimulatedMachine
from tests.kit.fakehost import FakeHost
from tests.node_agent.deviceplugin.builders import machine

QUIET_S = 30.0


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[Callable[[str], tuple[SimulatedMachine, HealthMonitor, list[float]]]]:
    """A health monitor over NVML on a simulated machine, with a clock the test moves."""
    opened: list[tuple[object, NvmlNodeDevices]] = []

    def start(name: str) -> tuple[SimulatedMachine, HealthMonitor, list[float]]:
        state = tmp_path / f"{name}.json"
        sim = SimulatedMachine(name, state)
        cm = nvml.open_nvml(nvml.NvmlBackend.parse(f"simulated:{name}", state_file=state))
        devices = NvmlNodeDevices(cm.__enter__())
        opened.append((cm, devices))
        now = [1000.0]
        board = HealthBoard(clock=lambda: now[0])
        mon = HealthMonitor(devices, devices.gpus(), board,
                            HealthPolicy(recovery_quiet_s=QUIET_S, recheck_interval_s=3600), clock=lambda: now[0])
        return sim, mon, now

    yield start
    for cm, devices in reversed(opened):
        devices.close()
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]


def _drain(mon: HealthMonitor, devices: int) -> None:
    """Hand the monitor the events the simulated machine raised."""
    for _ in range(devices):
        mon.step(0.5)


@pytest.mark.parametrize(("name", "xid", "driver"), [
    ("dgx-a100-40gb", 95, None),  # 535: no recovery action field; the pending row remap holds it
    ("dgx-h100", 95, "570.86.15"),  # 570: the recovery action says GPU_RESET as well
    ("dgx-h100", 94, None),  # contained ECC error: the application dies, the remap waits for a reset
    ("dgx-a100-80gb", 48, None),  # double-bit ECC error
    ("t4x1", 48, None),  # Turing retires the page instead, pending until a reset
])
def test_gpu_stays_unhealthy_until_reset(monitor: Callable[[str], tuple[SimulatedMachine, HealthMonitor,
                                                                           list[float]]],
                                         name: str, xid: int, driver: str | None) -> None:
    sim, mon, now = monitor(name)
    if driver is not None:
        sim.set_driver_version(driver)
    uuid = sim.spec.gpu_uuid(0)
    sim.inject_xid(0, xid)
    _drain(mon, 1)
    assert mon.board.unhealthy() == {uuid: f"xid-{xid}"}
    # Quiet for twice the period, the GPU answering NVML every time: still not fit.
    now[0] += 2 * QUIET_S
    assert mon.recheck() == []
    assert not mon.board.healthy(uuid)
    assert mon.board.needs() == {uuid: "reset"}
    sim.reset_gpu(0)
    assert mon.recheck() == [uuid]
    assert mon.board.healthy(uuid) and mon.board.needs() == {}


def test_failed_row_remap_needs_replacement_and_never_recovers(
        monitor: Callable[[str], tuple[SimulatedMachine, HealthMonitor, list[float]]]) -> None:
    sim, mon, now = monitor("dgx-a100-40gb")
    uuid = sim.spec.gpu_uuid(2)
    sim.inject_xid(2, 64)
    _drain(mon, 1)
    sim.reset_gpu(2)
    now[0] += 2 * QUIET_S
    assert mon.recheck() == []
    assert mon.board.needs() == {uuid: "replacement"}


def test_recovery_action_takes_a_healthy_gpu_out_without_an_xid(
        monitor: Callable[[str], tuple[SimulatedMachine, HealthMonitor, list[float]]]) -> None:
    """A reboot asked for before this process started (no XID it could see) still keeps work off the GPU,
    and a GPU reset does not settle it."""
    sim, mon, now = monitor("hgx-h200")
    sim.set_driver_version("570.86.15")
    uuid = sim.spec.gpu_uuid(5)
    sim.set_recovery_action(5, 2)  # NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    mon.recheck()
    assert mon.board.unhealthy() == {uuid: "needs-reboot"} and mon.board.needs() == {uuid: "reboot"}
    sim.reset_gpu(5)
    now[0] += 2 * QUIET_S
    assert mon.recheck() == [] and not mon.board.healthy(uuid)
    sim.set_recovery_action(5, 0)  # the node was rebooted
    assert mon.recheck() == [uuid]


def test_pending_row_remap_alone_keeps_a_healthy_gpu_in_service(
        monitor: Callable[[str], tuple[SimulatedMachine, HealthMonitor, list[float]]]) -> None:
    """NVIDIA: with only the remap pending, "new workloads can be launched"; only the XID that caused it
    (seen by this process) holds the GPU."""
    sim, mon, _ = monitor("dgx-a100-40gb")
    sim.set_telemetry(1, remap_pending=True)
    mon.recheck()
    assert mon.board.unhealthy() == {}


def test_event_for_no_known_gpu_rechecks_every_gpu(host: FakeHost) -> None:
    """An event NVML could not tie to one of our GPUs is not dropped: every GPU is re-checked at once."""
    node = machine("l4x2", host)
    now = [100.0]
    board = HealthBoard(clock=lambda: now[0])
    mon = HealthMonitor(node, node.gpu_list, board, HealthPolicy(recovery_quiet_s=30, recheck_interval_s=3600),
                        clock=lambda: now[0])
    lost = node.gpu_list[1].uuid
    node.failing.add(lost)
    node.events.put(HealthEvent(HealthEventKind.XID, "GPU-00000000-0000-0000-0000-000000000000", 95))
    mon.step(0.1)
    assert board.unhealthy() == {lost: "gpu-lost"}
    node.failing.clear()
    needs_reset = node.gpu_list[0].uuid
    node.recoveries[needs_reset] = Recovery(need="reset", out_of_service=True, detail="recovery action GPU_RESET")
    node.events.put(HealthEvent(HealthEventKind.XID, "", 95))  # the watcher could not name the device
    mon.step(0.1)
    assert board.unhealthy()[needs_reset] == "needs-reset"


def test_a_recheck_probes_each_gpu_in_two_calls_and_still_finds_a_lost_one(
        monitor: Callable[[str], tuple[SimulatedMachine, HealthMonitor, list[float]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-check runs every 5 s for as long as the plugin runs: each healthy GPU is probed by its UUID
    and PCI info (NVML answers GPU_IS_LOST to both for a GPU off the bus), never re-read whole, which on a
    MIG GPU is dozens of calls."""
    sim, mon, _ = monitor("dgx-a100-40gb")

    def whole_read(self: object, index: int) -> object:
        raise AssertionError(f"a re-check read GPU {index} whole")

    monkeypatch.setattr(nvml.NvmlSession, "gpu", whole_read)
    assert mon.recheck() == [] and mon.board.unhealthy() == {}
    sim.lose_gpu(3)
    mon.recheck()
    assert mon.board.unhealthy() == {sim.spec.gpu_uuid(3): "gpu-lost"}


def test_a_healthy_gpus_needs_are_read_once_a_minute_not_at_every_recheck(
        monitor: Callable[[str], tuple[SimulatedMachine, HealthMonitor, list[float]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three NVML reads a GPU (recovery action, row remapper, retired pages) every 5 s were most of what the
    plugin did at rest; a need that comes without an XID is found at the next read, within a minute."""
    sim, mon, now = monitor("hgx-h200")
    sim.set_driver_version("570.86.15")
    reads: list[int] = []
    real = nvml.NvmlSession.recovery

    def counted(self: nvml.NvmlSession, index: int) -> object:
        reads.append(index)
        return real(self, index)

    monkeypatch.setattr(nvml.NvmlSession, "recovery", counted)
    mon.recheck()
    assert sorted(reads) == list(range(8)), "the first re-check reads every GPU's needs"
    sim.set_recovery_action(5, 2)  # NVML_GPU_RECOVERY_ACTION_NODE_REBOOT, no XID
    now[0] += 5
    mon.recheck()
    assert len(reads) == 8 and mon.board.unhealthy() == {}
    now[0] += mon.policy.recovery_read_interval_s
    mon.recheck()
    assert mon.board.unhealthy() == {sim.spec.gpu_uuid(5): "needs-reboot"}
