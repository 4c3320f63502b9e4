"""A GPU's object says what NVML says it still needs after an error (issue 33, item 4): ``health.needs``
(reset, reboot, replacement ...), and ``Unhealthy`` for as long as the device plugin holds the GPU.

Read from simulated machines whose XIDs leave what they leave on real GPUs, through the labeller's own
run (``sync_inventory``, which reads ``NvmlSession.recovery``) and against the CRD's schema.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from node_agent.labeller import inventory
from node_agent.labeller.inventory import InventoryContext
from node_agent.labeller.labels import LabelOptions, sync_inventory
from node_agent.labeller.nodepatch import KubeNodeApi
from node_agent.nvml import NvmlBackend, RecoveryNeed, open_nvml
from node_agent.nvml.xidwatch import XidSeen
from nvgpu import inventory as api
from nvidia_gpu.components.manifests.inventory import SCHEMA
from nvml_sim import SimulatedMachine
from tests.kit.fakehost import build_fake_host, sim_state_file
from tests.node_agent.labeller.test_inventory import FakeKube

CTX = InventoryContext(sharing="Exclusive")
T0 = datetime.datetime(2026, 12, 3, 10, 0, 0, tzinfo=datetime.UTC)
LATER = T0 + datetime.timedelta(hours=1)  # far past the quiet period


def _valid(status: dict[str, Any]) -> None:
    health = {**status["health"], "since": "2026-12-03T10:00:00Z"}
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(
        {"spec": {"node": "n", "index": 0}, "status": {**status, "health": health}})


def test_the_needs_the_crd_allows_are_the_agents() -> None:
    assert [n.value for n in RecoveryNeed] == list(api.RECOVERY_NEEDS)


@pytest.mark.parametrize(("machine", "xid", "driver", "reason"), [
    ("dgx-h100", 95, "570.86.15", "NVML: recovery action GPU_RESET, row remapping pending"),
    ("dgx-a100-40gb", 48, None, "critical XID 48, and NVML: row remapping pending"),
    ("t4x1", 48, None, "critical XID 48, and NVML: page retirement pending"),
])
def test_a_gpu_an_xid_left_needing_a_reset_stays_unhealthy_until_reset(
        tmp_path: Path, machine: str, xid: int, driver: str | None, reason: str) -> None:
    sim = SimulatedMachine(machine, tmp_path / "sim.json")
    if driver:
        sim.set_driver_version(driver)
    sim.inject_xid(0, xid)
    seen = {0: XidSeen(xid, T0)}
    with open_nvml(NvmlBackend("simulated", machine, sim.store.path)) as nvml:
        inv, drv = nvml.inventory(), nvml.driver()
        want = inventory.desired(inv, drv, CTX, {}, xids=seen, now=LATER, recoveries={0: nvml.recovery(0)})
        health = want[0]["health"]
        assert (health["state"], health["needs"], health["reason"]) == ("Unhealthy", "reset", reason)
        _valid(want[0])
        sim.reset_gpu(0)
        want = inventory.desired(inv, drv, CTX, {}, xids=seen, now=LATER, recoveries={0: nvml.recovery(0)})
    assert want[0]["health"] == {"state": "Healthy", "lastXID": xid, "lastXIDTime": "2026-12-03T10:00:00Z"}


def test_a_failed_remap_or_a_reboot_keeps_a_gpu_out_without_an_xid(tmp_path: Path) -> None:
    sim = SimulatedMachine("hgx-h200", tmp_path / "sim.json")
    sim.set_driver_version("570.86.15")
    sim.set_telemetry(1, remap_failure=True)
    sim.set_recovery_action(2, 2)  # NODE_REBOOT
    sim.set_telemetry(3, remap_pending=True)  # alone: new work may still land (NVIDIA), it just says so
    with open_nvml(NvmlBackend("simulated", "hgx-h200", sim.store.path)) as nvml:
        inv, drv = nvml.inventory(), nvml.driver()
        recoveries = {g.index: nvml.recovery(g.index) for g in inv.gpus}
    want = inventory.desired(inv, drv, CTX, {}, now=T0, recoveries=recoveries)
    assert want[1]["health"] == {"state": "Unhealthy", "needs": "replacement", "reason": "NVML: row remapping failed"}
    assert want[2]["health"] == {"state": "Unhealthy", "needs": "reboot", "reason": "NVML: recovery action NODE_REBOOT"}
    assert want[3]["health"] == {"state": "Healthy", "needs": "reset"}
    assert want[0]["health"] == {"state": "Healthy"}
    for i in (1, 2, 3):
        _valid(want[i])


class _Env:
    """What ``sync_inventory`` needs of the labeller's environment: the node API, the node, NVML."""

    def __init__(self, kube: FakeKube, backend: NvmlBackend, root: Path) -> None:
        self._api = KubeNodeApi(kube)  # type: ignore[arg-type]
        self._backend = backend
        self.host = root

    def node_api(self) -> KubeNodeApi:
        return self._api

    def require_node_name(self) -> str:
        return "n"

    def nvml(self) -> Any:
        return open_nvml(self._backend)


def test_the_labellers_run_reads_nvml_and_writes_what_the_gpu_needs(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through the labeller's run: NVML's answer reaches the object the API server holds."""
    root = build_fake_host(tmp_path / "host", "dgx-h100").root
    backend = NvmlBackend("simulated", "dgx-h100", sim_state_file(root, "dgx-h100"))
    sim = SimulatedMachine("dgx-h100", backend.state_file)
    sim.set_driver_version("570.86.15")
    sim.inject_xid(4, 95)
    kube = FakeKube()
    env = _Env(kube, backend, root)
    monkeypatch.setattr(KubeNodeApi, "read_node", lambda self, node: {"metadata": {"uid": "uid-1", "labels": {}}})
    monkeypatch.setattr("node_agent.labeller.labels._kernel_modules", lambda host: None)
    sync_inventory(env, LabelOptions(), CTX, xids={4: XidSeen(95, T0)})  # type: ignore[arg-type]
    health = kube.objects[api.object_name("n", 4)]["status"]["health"]
    assert (health["state"], health["needs"]) == ("Unhealthy", "reset")
    assert "needs" not in kube.objects[api.object_name("n", 0)]["status"]["health"]
    sim.reset_gpu(4)
    sync_inventory(env, LabelOptions(), CTX, xids={4: XidSeen(95, T0)})  # type: ignore[arg-type]
    health = kube.objects[api.object_name("n", 4)]["status"]["health"]
    assert health["state"] == "Healthy" and "needs" not in health
