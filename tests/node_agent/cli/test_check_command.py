"""``check`` against fake host roots: every good and bad node the issue lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.cli import main
from nvml_sim.state import SimProcess
from tests.kit.fakehost import build_fake_host
from tests.node_agent.agent_testkit import Cli


def test_no_gpu_is_silent_success(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, None)
    code, doc = cli(host.root, "simulated:t4x1", "check")
    assert (code, doc["verdict"], doc["reasons"]) == (0, "no-gpu", [])
    assert host.path("/var/lib/nvidia-gpu-agent/check.verdict").read_text() == "verdict=no-gpu\nreasons=\ndriver=\n"


@pytest.mark.parametrize(("containerd", "deckhouse"), [(1, True), (2, True), (1, False), (2, False)])
def test_good_node_after_runtime_apply(tmp_path: Path, cli: Cli, containerd: int, deckhouse: bool) -> None:
    host = build_fake_host(tmp_path, "dgx-h100", containerd=containerd, deckhouse=deckhouse)  # type: ignore[arg-type]
    code, doc = cli(host.root, "simulated:dgx-h100", "check")
    assert (code, doc["reasons"]) == (1, ["runtime-not-ready"])
    assert cli(host.root, "simulated:dgx-h100", "check", "--phase", "host")[0] == 0
    assert cli(host.root, "simulated:dgx-h100", "runtime", "apply")[0] == 0
    code, doc = cli(host.root, "simulated:dgx-h100", "check")
    assert (code, doc["verdict"]) == (0, "ok"), doc
    assert [g["model"] for g in doc["gpus"]] == ["H100-80GB"] * 8
    assert doc["requiredDriver"] == "525.60.13"


def _reasons(cli: Cli, root: Path, nvml: str) -> tuple[int, list[str], list[str]]:
    code, doc = cli(root, nvml, "check", "--phase", "host")
    return code, doc["reasons"], [f["message"] for f in doc["findings"]]


def test_old_driver(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "hgx-h200", driver_version="535.183.06")
    code, reasons, messages = _reasons(cli, host.root, "simulated:hgx-h200")
    assert (code, reasons) == (1, ["driver-too-old"])
    assert "535.183.06 is older than the required 550.54.14" in messages[0]


def test_driver_below_global_floor_on_t4(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "t4x1", driver_version="418.67")
    assert _reasons(cli, host.root, "simulated:t4x1")[:2] == (1, ["driver-too-old"])


def test_compute_5_2_gpu(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "t4x1")
    assert host.machine is not None
    host.machine.override_gpu(0, name="Tesla M60", compute_capability=(5, 2), pci_device_id=0x13F2)
    code, reasons, messages = _reasons(cli, host.root, "simulated:t4x1")
    assert (code, reasons) == (1, ["compute-too-old"])  # an unknown model is a notice, not a reason
    assert any("5.2, below 6.0" in m for m in messages)
    _, doc = cli(host.root, "simulated:t4x1", "check", "--phase", "host")
    assert any("'Tesla M60' (PCI device ID 0x13F2) is not in the catalogue" in n for n in doc["notices"])


def test_known_pci_device_under_an_unknown_name(tmp_path: Path, cli: Cli) -> None:
    """A GPU is identified by its PCI device ID, whatever its name: NVIDIA's mock A100 (0x20B0) calls
    itself "Mock NVIDIA A100-SXM4-40GB", which the name-only lookup refused as an unknown model."""
    host = build_fake_host(tmp_path, "dgx-a100-40gb")
    assert host.machine is not None
    host.machine.override_gpu(0, name="Mock NVIDIA A100-SXM4-40GB")
    code, doc = cli(host.root, "simulated:dgx-a100-40gb", "check", "--phase", "host")
    assert (code, doc["verdict"], doc["reasons"]) == (0, "ok", []), doc
    assert doc["gpus"][0]["name"] == "Mock NVIDIA A100-SXM4-40GB"
    assert [g["model"] for g in doc["gpus"]] == ["A100-40GB"] * 8


def test_modules_and_device_nodes_missing(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2", modules=("nvidia",), device_nodes=False)
    code, reasons, messages = _reasons(cli, host.root, "simulated:l4x2")
    assert (code, reasons) == (1, ["device-node-missing", "module-missing"])
    assert "kernel module nvidia_uvm is not loaded" in messages


def test_driver_not_loaded(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4", driver_loaded=False)
    code, reasons, _ = _reasons(cli, host.root, "simulated:a30x4")
    assert (code, reasons) == (1, ["device-node-missing", "driver-missing", "module-missing", "nvml-failed"])


def test_unknown_driver_format_is_a_clear_error(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2", driver_text="NVRM version: NVIDIA custom build\n")
    before = host.snapshot("/")
    code, reasons, messages = _reasons(cli, host.root, "simulated:l4x2")
    assert (code, reasons) == (1, ["driver-unparseable"])
    assert "NVIDIA custom build" in messages[0]
    after = host.snapshot("/")
    after.pop("var/lib/nvidia-gpu-agent/check.verdict")
    assert after == before


def test_unreadable_proc_entry(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    modules = host.path("/proc/modules")
    modules.unlink()
    modules.mkdir()
    code, reasons, messages = _reasons(cli, host.root, "simulated:l4x2")
    assert (code, reasons) == (1, ["proc-unreadable"])
    assert "/proc/modules" in messages[0]


def test_nvml_init_failure_and_lost_gpu(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path / "a", "dgx-a100-80gb")
    assert host.machine is not None
    host.machine.fail_init("lib-rm-version-mismatch")
    assert _reasons(cli, host.root, "simulated:dgx-a100-80gb")[:2] == (1, ["nvml-failed"])
    lost = build_fake_host(tmp_path / "b", "dgx-a100-80gb")
    assert lost.machine is not None
    lost.machine.lose_gpu(6)
    code, reasons, messages = _reasons(cli, lost.root, "simulated:dgx-a100-80gb")
    assert (code, reasons) == (1, ["nvml-failed"]) and "GPU 6" in messages[0]


def test_gpu_in_use_is_still_usable(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    assert host.machine is not None
    host.machine.set_processes(0, [SimProcess(pid=99, used_mib=100)])
    assert _reasons(cli, host.root, "simulated:l4x2")[:2] == (0, [])


def test_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = build_fake_host(tmp_path, "t4x1", driver_version="418.67")
    code = main(["--host-root", str(host.root), "--host-exec", "direct", "--nvml", "simulated:t4x1", "check"])
    out = capsys.readouterr().out
    assert code == 1
    assert "GPU check: unusable" in out and "FAIL driver-too-old: driver 418.67" in out


def test_bad_nvml_spec_is_a_usage_error(tmp_path: Path, cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = cli(tmp_path, "simulated:dgx-z9", "check")
    assert code == 2
    assert "simulated:<machine>" in capsys.readouterr().err
