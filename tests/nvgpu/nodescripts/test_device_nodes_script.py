"""The Deckhouse path on a freshly booted node: ``gpu-devices.sh`` loads ``nvidia-uvm`` and makes the
``/dev/nvidia*`` nodes as the agent's setup does (``node_agent.setup.devnodes``, itself NVIDIA's ``nvidia-ctk
system create-device-nodes --control-devices --load-kernel-modules``), records them in the same journal, and the
agent's teardown removes exactly those.

The simulated host's fresh-boot mode (``lay_out(fresh_boot=True)``) is a node right after boot: only ``nvidia``
loaded, ``/proc/devices`` and ``mig-minors`` as the driver writes them, no ``/dev/nvidia*`` node. Its ``mknod``
and ``modprobe`` are the simulator's stand-ins (``nvml_sim.host``): a node is a file holding
``c <major>:<minor>``; ``unloadable_modules`` makes modprobe fail as kmod's does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node_agent.cli import main
from node_agent.host import HostRoot
from node_agent.setup import devnodes
from nvgpu.nodescripts import WEIGHTS, render_node_scripts
from nvml_sim.host import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR, device_node_stand_in
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.nvgpu.nodescripts.nodescript_helpers import RunScript, summary

JOURNAL = "/var/lib/nvidia-gpu-agent/rollback/devnodes/manifest.json"
KMOD_FATAL = "modprobe: FATAL: Module nvidia-uvm not found in directory /lib/modules/5.15.0-105-generic"


def _agent(host: FakeHost, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["--host-root", str(host.root), "--host-exec", "direct", "--nvml", host.nvml_spec, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _bashible(host: FakeHost, run_script: RunScript) -> dict[str, str]:
    """Every rendered script in weight order, as bashible runs them; the setup gate's summary."""
    out = ""
    for script in render_node_scripts():
        ran = run_script(host, script.name)
        assert ran.returncode == 0, (script.name, ran.stderr)
        out = ran.stdout
    verdict: dict[str, str] = summary(out, "nvidia-gpu-setup")
    return verdict


def _dev(host: FakeHost) -> dict[str, tuple[str, int]]:
    """Every NVIDIA node under /dev: what the stand-in mknod wrote and the mode."""
    dev = host.path("/dev")
    return {str(p.relative_to(dev)): (p.read_text(), p.stat().st_mode & 0o777)
            for p in sorted(dev.rglob("nvidia*")) if p.is_file()}


def test_devices_runs_before_the_check() -> None:
    assert WEIGHTS["gpu-devices.sh"] < WEIGHTS["gpu-check.sh"]
    assert [s.name for s in render_node_scripts()][:2] == ["gpu-devices.sh", "gpu-check.sh"]


def test_fresh_boot_node_is_set_up_alike_by_the_scripts_and_the_agent(tmp_path: Path, run_script: RunScript,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    by_script, by_agent = (build_fake_host(tmp_path / side, "a30x4", containerd=2, fresh_boot=True)
                           for side in ("script", "agent"))
    assert _bashible(by_script, run_script)["complete"] == "true"
    code, doc = _agent(by_agent, capsys, "setup", "--no-patch-node", "--no-restart")
    assert (code, doc["complete"]) == (0, True), doc
    made = _dev(by_script)
    assert made == _dev(by_agent)
    assert made["nvidiactl"] == (f"c {NVIDIA_MAJOR}:255\n", 0o666)
    assert made["nvidia-uvm"] == (f"c {UVM_MAJOR}:0\n", 0o666)
    assert made["nvidia-uvm-tools"] == (f"c {UVM_MAJOR}:1\n", 0o666)
    assert [made[f"nvidia{i}"] for i in range(4)] == [(f"c {NVIDIA_MAJOR}:{i}\n", 0o666) for i in range(4)]
    assert made["nvidia-caps/nvidia-cap1"] == (f"c {CAPS_MAJOR}:1\n", 0o400)  # config: root only
    assert made["nvidia-caps/nvidia-cap2"] == (f"c {CAPS_MAJOR}:2\n", 0o444)  # monitor
    assert by_script.log("modprobe") == by_agent.log("modprobe") == ["nvidia-uvm"]
    # The same journal, byte for byte, so either side's teardown undoes the other's setup.
    assert by_script.path(JOURNAL).read_bytes() == by_agent.path(JOURNAL).read_bytes()
    assert by_script.path(JOURNAL).stat().st_mode & 0o777 == 0o600


def test_uvm_that_cannot_be_loaded_fails_both_naming_it(tmp_path: Path, run_script: RunScript,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    by_script, by_agent = (build_fake_host(tmp_path / side, "a30x4", containerd=2, fresh_boot=True,
                                           unloadable_modules=("nvidia-uvm",)) for side in ("script", "agent"))
    devices = run_script(by_script, "gpu-devices.sh")
    assert devices.returncode == 0, devices.stderr  # not strict: the check that follows closes the gate
    assert summary(devices.stdout, "nvidia-gpu-devices")["result"] == "failed"
    assert f"modprobe nvidia-uvm failed (exit 1): {KMOD_FATAL}" in devices.stderr
    assert _bashible(by_script, run_script)["complete"] == "false"
    check = by_script.path("/var/lib/nvidia-gpu-agent/check.verdict").read_text()
    assert "reasons=device-node-missing,module-missing" in check
    code, doc = _agent(by_agent, capsys, "setup", "--no-patch-node", "--no-restart")
    assert (code != 0, doc["complete"]) == (True, False)
    assert doc["steps"][-1] == {"name": "devices", "ok": False,
                                "detail": f"modprobe nvidia-uvm failed (exit 1): {KMOD_FATAL}"}
    for host in (by_script, by_agent):
        assert _dev(host) == {} and not host.path(JOURNAL).exists()  # nothing made once the module failed
    strict = run_script(by_script, "gpu-devices.sh", NVIDIA_GPU_CHECK_STRICT="true")
    assert strict.returncode == 1


def test_the_journal_holds_exactly_the_nodes_made_and_teardown_removes_only_those(
        tmp_path: Path, run_script: RunScript, capsys: pytest.CaptureFixture[str]) -> None:
    host = build_fake_host(tmp_path, "a30x4", containerd=2, fresh_boot=True)
    host.put("/dev/nvidia-modeset", "an admin's node\n")  # there before setup: never touched, never recorded
    first = run_script(host, "gpu-devices.sh")
    assert first.returncode == 0, first.stderr
    result = summary(first.stdout, "nvidia-gpu-devices")
    made = result["made"].split(",")
    assert (result["result"], result["loaded"]) == ("ok", "nvidia-uvm")
    assert sorted(made) == sorted(f"/dev/{p}" for p in _dev(host) if p != "nvidia-modeset")
    manifest = json.loads(host.path(JOURNAL).read_text())
    assert [f["path"] for f in manifest["files"]] == made
    assert not any(f["existed"] for f in manifest["files"])
    assert manifest["created_dirs"] == ["/dev/nvidia-caps"]
    journal = host.path(JOURNAL).read_bytes()

    again = summary(run_script(host, "gpu-devices.sh").stdout, "nvidia-gpu-devices")
    assert (again["result"], again["loaded"], again["made"]) == ("ok", "", "")  # idempotent
    assert host.path(JOURNAL).read_bytes() == journal and host.log("modprobe") == ["nvidia-uvm"]

    code, doc = _agent(host, capsys, "teardown", "--no-patch-node", "--no-restart")
    assert code == 0, doc
    assert sorted(p.name for p in host.path("/dev").iterdir()) == ["nvidia-modeset"]
    assert host.path("/dev/nvidia-modeset").read_text() == "an admin's node\n"
    assert not host.path(JOURNAL).exists()


def test_the_script_extends_the_agents_journal(tmp_path: Path, run_script: RunScript,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The agent made the nodes it could before nvidia-uvm was loaded; the script adds uvm's to the same journal,
    and the agent's teardown removes both sides' nodes."""
    host = build_fake_host(tmp_path, "a30x4", containerd=2, fresh_boot=True)
    first = devnodes.ensure(HostRoot(host.root, mknod=device_node_stand_in), load_modules=False)
    assert "/dev/nvidia-uvm" not in first.created
    result = summary(run_script(host, "gpu-devices.sh").stdout, "nvidia-gpu-devices")
    assert result["made"] == "/dev/nvidia-uvm,/dev/nvidia-uvm-tools"
    manifest = json.loads(host.path(JOURNAL).read_text())
    assert [f["path"] for f in manifest["files"]] == [*first.created, "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    code, _ = _agent(host, capsys, "teardown", "--no-patch-node", "--no-restart")
    assert code == 0 and _dev(host) == {}


def test_a_journal_the_script_does_not_know_is_left_alone(tmp_path: Path, run_script: RunScript) -> None:
    host = build_fake_host(tmp_path, "a30x4", fresh_boot=True)
    host.put(JOURNAL, '{"version": 1, "files": [{"path": "/dev/x", "existed": true, "content_b64": "eA=="}]}')
    ran = run_script(host, "gpu-devices.sh")
    assert summary(ran.stdout, "nvidia-gpu-devices")["result"] == "failed"
    assert f"the rollback journal {JOURNAL} is not one this script wrote" in ran.stderr
    assert _dev(host) == {}


def test_a_node_without_a_gpu_is_left_alone(tmp_path: Path, run_script: RunScript) -> None:
    host = build_fake_host(tmp_path, None)
    before = host.snapshot("/")
    ran = run_script(host, "gpu-devices.sh")
    assert ran.returncode == 0 and "nvidia-gpu-devices" not in ran.stdout
    assert host.snapshot("/") == before and host.log("modprobe") == []
