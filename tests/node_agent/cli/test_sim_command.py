"""``sim``: fault injection into a simulated machine reaches other agent commands through the state file."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.nvml import EventKind, NvmlBackend, open_nvml
from tests.kit.fakehost import build_fake_host
from tests.node_agent.agent_testkit import Cli

H100 = "simulated:dgx-h100"


def test_lose_and_restore_reach_check(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100", containerd=2)
    code, doc = cli(host.root, H100, "sim", "lose", "5")
    assert code == 0 and doc["gpus"][5]["lost"] is True
    assert doc["events"][-1] == {"seq": 1, "gpu": 5, "kind": "xid", "data": 79, "gi_id": None, "ci_id": None}
    assert cli(host.root, H100, "check", "--phase", "host")[1]["reasons"] == ["nvml-failed"]
    cli(host.root, H100, "sim", "restore", "5")
    assert cli(host.root, H100, "check", "--phase", "host")[1]["verdict"] == "ok"


def test_xid_reaches_an_event_watcher(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    backend = NvmlBackend("simulated", "dgx-h100", host.machine.store.path)
    with open_nvml(backend) as nvml, nvml.watch_events([2]) as watcher:
        assert cli(host.root, H100, "sim", "xid", "2", "48", "--gi", "1", "--ci", "0")[0] == 0
        event = watcher.wait(2.0)
    assert event is not None and (event.gpu_index, event.kind, event.data, event.gi_id) == (2, EventKind.XID, 48, 1)


def test_processes_driver_and_init(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    _, doc = cli(host.root, "simulated:l4x2", "sim", "processes", "1", "100:512", "200")
    assert doc["gpus"][1]["processes"] == [{"pid": 100, "used_mib": 512, "gi_id": None, "ci_id": None},
                                           {"pid": 200, "used_mib": None, "gi_id": None, "ci_id": None}]
    assert cli(host.root, "simulated:l4x2", "sim", "driver", "535.1.1")[1]["driver_version"] == "535.1.1"
    assert cli(host.root, "simulated:l4x2", "sim", "fail-init", "driver-not-loaded")[0] == 0
    assert cli(host.root, "simulated:l4x2", "labels")[0] == 1
    assert cli(host.root, "simulated:l4x2", "sim", "fail-init", "none")[1]["init_error"] is None


def test_bad_input(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "t4x1")
    assert cli(host.root, "simulated:t4x1", "sim", "lose", "3")[0] == 2
    assert cli(host.root, "simulated:t4x1", "sim", "processes", "0", "abc")[0] == 2
    assert cli("/", "simulated:t4x1", "sim", "status")[0] == 2
    assert cli(host.root, "real", "sim", "status")[0] == 2


def test_mig_monitor_and_empty_slot_faults_reach_the_labeller(tmp_path: Path, cli: Cli,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``sim mig-monitor required`` and ``sim mig-empty-slot``: the harsh answers of a real MIG node, on
    demand; the labeller still counts every GPU and says what it could not read."""
    monkeypatch.delenv("NVIDIA_MIG_MONITOR_DEVICES", raising=False)
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    with open_nvml(NvmlBackend("simulated", "dgx-h100", host.machine.store.path)) as nvml:
        nvml.set_mig_mode(4, True)
        gi = nvml.create_gpu_instance(4, 19)  # 1g.10gb
        nvml.create_compute_instance(4, gi.id)
    code, doc = cli(host.root, H100, "sim", "mig-empty-slot", "4", "invalid-argument")
    assert code == 0 and doc["gpus"][4]["mig_empty_slot_error"] == 2
    assert cli(host.root, H100, "sim", "mig-monitor", "required")[1]["mig_monitor_required"] is True
    _, labels = cli(host.root, H100, "labels", "--mig-strategy", "mixed", "--no-timestamp")
    assert labels["labels"]["nvidia.com/gpu.count"] == "8"
    assert any(w.startswith("GPU 4 labelled without its MIG devices") for w in labels["warnings"])
    cli(host.root, H100, "sim", "mig-monitor", "off")
    _, labels = cli(host.root, H100, "labels", "--mig-strategy", "mixed", "--no-timestamp")
    assert labels["labels"]["nvidia.com/mig-1g.10gb.count"] == "1"
