"""What NVML says a GPU still needs after an error, on simulated machines that fail like real ones.

The simulator leaves after each XID what NVIDIA documents ("GPU Memory Error Management", the Xid
catalogue): a pending row remap (Ampere and later) or retired page (earlier), a failed remap, a recovery
action (drivers from 565 only); a GPU reset settles what a reset settles. ``NvmlSession.recovery`` reads
it back through nvidia-ml-py, and event watchers name an event's GPU by the UUID NVML gives for it.
"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from node_agent.nvml import GpuRecovery, NvmlBackend, RecoveryNeed, open_nvml
from nvml_sim import SimulatedMachine
from tests.kit.fakehost import build_fake_host
from tests.node_agent.agent_testkit import Cli


def _machine(tmp_path: Path, name: str) -> SimulatedMachine:
    return SimulatedMachine(name, tmp_path / f"{name}.json")


def _backend(m: SimulatedMachine) -> NvmlBackend:
    return NvmlBackend("simulated", m.spec.name, m.store.path)


def test_reads_each_architecture_supports(tmp_path: Path) -> None:
    a100, t4 = _machine(tmp_path, "dgx-a100-40gb"), _machine(tmp_path, "t4x1")
    with open_nvml(_backend(a100)) as nvml:  # driver 535: no recovery action field yet; rows, no pages
        assert nvml.recovery(0) == GpuRecovery(action=None, remap_pending=False, remap_failure=False)
    a100.set_driver_version("565.57.01")
    with open_nvml(_backend(a100)) as nvml:
        assert nvml.recovery(0).action == "NONE"
    with open_nvml(_backend(t4)) as nvml:  # Turing: pages, no row remapper
        r = nvml.recovery(0)
    assert r == GpuRecovery(retired_pages_pending=False) and r.known and r.need is None


def test_field_values_answer_per_field(tmp_path: Path) -> None:
    h100 = _machine(tmp_path, "dgx-h100")
    h100.set_driver_version("570.86.15")
    h100.set_recovery_action(3, pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET)
    with open_nvml(_backend(h100)):
        values = pynvml.nvmlDeviceGetFieldValues(pynvml.nvmlDeviceGetHandleByIndex(3),
                                                 [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                                                  pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert (values[0].nvmlReturn, values[0].value.uiVal) == (pynvml.NVML_SUCCESS, 4)
    assert values[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize(("name", "xid", "after_xid", "need"), [
    ("dgx-h100", 95, GpuRecovery(action="GPU_RESET", remap_pending=True, remap_failure=False), RecoveryNeed.RESET),
    ("dgx-h100", 94, GpuRecovery(action="NONE", remap_pending=True, remap_failure=False), RecoveryNeed.RESET),
    ("dgx-h100", 64, GpuRecovery(action="GPU_RESET", remap_pending=False, remap_failure=True),
     RecoveryNeed.REPLACEMENT),
    ("dgx-h100", 119, GpuRecovery(action="GPU_RESET", remap_pending=False, remap_failure=False), RecoveryNeed.RESET),
    ("dgx-h100", 13, GpuRecovery(action="NONE", remap_pending=False, remap_failure=False), None),
    ("t4x1", 48, GpuRecovery(action="NONE", retired_pages_pending=True), RecoveryNeed.RESET),
])
def test_xid_aftermath_and_reset(tmp_path: Path, name: str, xid: int, after_xid: GpuRecovery,
                                 need: RecoveryNeed | None) -> None:
    m = _machine(tmp_path, name)
    m.set_driver_version("570.86.15")
    m.inject_xid(0, xid)
    with open_nvml(_backend(m)) as nvml:
        r = nvml.recovery(0)
        assert (r, r.need) == (after_xid, need)
        m.reset_gpu(0)
        after_reset = nvml.recovery(0)
    assert after_reset.need is (RecoveryNeed.REPLACEMENT if xid == 64 else None)
    if after_xid.remap_pending:  # the pending remap took effect: one more row remapped
        assert m.state.gpus[0].telemetry.remapped_uncorrectable == 1


def test_reboot_outlives_a_reset(tmp_path: Path) -> None:
    m = _machine(tmp_path, "hgx-h200")
    m.set_driver_version("570.86.15")
    m.set_recovery_action(1, pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    m.inject_xid(1, 95)  # a later reset-only error does not downgrade it
    m.reset_gpu(1)
    with open_nvml(_backend(m)) as nvml:
        r = nvml.recovery(1)
    assert (r.action, r.need, r.out_of_service) == ("NODE_REBOOT", RecoveryNeed.REBOOT, True)


def test_event_device_is_named_by_uuid(tmp_path: Path) -> None:
    """A watcher that does not know the event's handle address still names the GPU (by NVML's UUID)."""
    m = _machine(tmp_path, "dgx-a100-40gb")
    with open_nvml(_backend(m)) as nvml, nvml.watch_events([2, 5]) as watcher:
        watcher._by_handle = {addr: entry for addr, entry in watcher._by_handle.items() if entry[0] != 5}
        m.inject_xid(5, 95)
        event = watcher.wait(2.0)
        uuid5 = nvml.gpu(5).uuid
    assert event is not None and (event.gpu_uuid, event.data) == (uuid5, 95)


def test_sim_command_xid_recovery_and_reset(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    machine = "simulated:dgx-h100"
    assert cli(host.root, machine, "sim", "driver", "570.86.15")[0] == 0
    code, doc = cli(host.root, machine, "sim", "xid", "0", "95")
    assert code == 0 and doc["gpus"][0]["telemetry"]["remap_pending"] is True
    assert doc["gpus"][0]["telemetry"]["recovery_action"] == 1
    doc = cli(host.root, machine, "sim", "recovery", "1", "reboot")[1]
    assert doc["gpus"][1]["telemetry"]["recovery_action"] == 2
    doc = cli(host.root, machine, "sim", "reset", "0")[1]
    assert doc["gpus"][0]["telemetry"]["remap_pending"] is False
    assert doc["gpus"][0]["telemetry"]["recovery_action"] == 0
    with pytest.raises(SystemExit) as bad:  # argparse refuses it, naming the choices
        cli(host.root, machine, "sim", "recovery", "1", "bogus")
    assert bad.value.code == 2
