"""gpu-runtime.sh on CRI-O hosts, and parity with the agent where setup stops early."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from node_agent.cli import main
from nvgpu.nodescripts import render_node_scripts
from nvgpu.nodescripts.content import render_crio_dropin
from tests.kit.fakecrio import build_crio_host
from tests.kit.fakehost import FakeHost
from tests.nvgpu.nodescripts.nodescript_helpers import RunScript, summary

DROPIN = "/etc/crio/crio.conf.d/99-nvidia.conf"


def test_runtime_writes_the_crio_dropin_and_restarts_crio_once(tmp_path: Path, run_script: RunScript) -> None:
    host = build_crio_host(tmp_path)
    assert summary(run_script(host, "gpu-check.sh").stdout, "nvidia-gpu-check")["verdict"] == "ok"
    first = run_script(host, "gpu-runtime.sh")
    assert first.returncode == 0, first.stderr
    assert summary(first.stdout, "nvidia-gpu-runtime") == {"runtime": "crio", "dropin": DROPIN, "result": "changed"}
    assert host.path(DROPIN).read_text() == render_crio_dropin("/usr/libexec/crio/conmon")
    assert host.path(DROPIN).stat().st_mode & 0o777 == 0o644
    assert host.log("systemctl") == ["restart crio"]
    again = run_script(host, "gpu-runtime.sh")
    assert summary(again.stdout, "nvidia-gpu-runtime")["result"] == "unchanged"
    assert host.log("systemctl") == ["restart crio"]
    sysctl = run_script(host, "gpu-sysctl.sh")
    assert "complete=true" in sysctl.stdout, sysctl.stderr


def test_runtime_without_conmon(tmp_path: Path, run_script: RunScript) -> None:
    host = build_crio_host(tmp_path, conmon=False)
    assert run_script(host, "gpu-runtime.sh").returncode == 0
    assert host.path(DROPIN).read_text() == render_crio_dropin(None)


def test_runtime_refuses_a_foreign_crio_dropin(tmp_path: Path, run_script: RunScript) -> None:
    host = build_crio_host(tmp_path)
    host.path(DROPIN).write_text("# written by nvidia-ctk\n")
    before = host.snapshot()
    result = run_script(host, "gpu-runtime.sh")
    assert result.returncode == 1 and "not written by nvidia-gpu" in result.stderr
    assert host.snapshot() == before and host.log("systemctl") == []


def test_runtime_refuses_both_runtimes(tmp_path: Path, run_script: RunScript) -> None:
    host = build_crio_host(tmp_path, containerd=True)
    before = host.snapshot()
    result = run_script(host, "gpu-runtime.sh")
    assert result.returncode == 1
    assert "both containerd (/etc/containerd/config.toml) and CRI-O (/etc/crio/crio.conf, " in result.stderr
    assert host.snapshot() == before


def test_runtime_without_nvidia_runtime_writes_nothing(tmp_path: Path, run_script: RunScript) -> None:
    host = build_crio_host(tmp_path, nvidia_container_runtime=False)
    before = host.snapshot()
    result = run_script(host, "gpu-runtime.sh")
    assert result.returncode == 0 and summary(result.stdout, "nvidia-gpu-runtime")["result"] == "skipped"
    assert "not written" in result.stderr and host.snapshot() == before


@pytest.mark.parametrize("scenario", ["crio-no-nvidia-runtime", "crio-and-containerd"])
def test_setup_stops_at_the_runtime_in_both_paths(scenario: str, tmp_path: Path, run_script: RunScript,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Setup fails at the runtime both ways and neither touches the runtime's config (the script's
    sysctl step still writes its drop-in before gating, so only the runtime dirs are compared)."""
    builds: dict[str, Callable[[Path], FakeHost]] = {
        "crio-no-nvidia-runtime": lambda r: build_crio_host(r, nvidia_container_runtime=False),
        "crio-and-containerd": lambda r: build_crio_host(r, containerd=True),
    }
    build = builds[scenario]
    by_script, by_agent = build(tmp_path / "script"), build(tmp_path / "agent")
    for name in ("gpu-check.sh", "gpu-runtime.sh"):
        run_script(by_script, name)
    assert summary(run_script(by_script, "gpu-sysctl.sh").stdout, "nvidia-gpu-setup")["complete"] == "false"
    capsys.readouterr()
    main(["--host-root", str(by_agent.root), "--host-exec", "direct", "--nvml", by_agent.nvml_spec, "--json",
          "setup", "--no-patch-node", "--no-restart"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["complete"] is False and doc["steps"][-1]["name"] == "runtime"
    for d in ("/etc/crio", "/etc/containerd"):
        assert by_agent.snapshot(d) == by_script.snapshot(d), d


def test_the_steps_that_judge_the_runtime_carry_its_detection() -> None:
    for s in render_node_scripts():
        if s.name in ("gpu-check.sh", "gpu-sysctl.sh"):  # the steps that judge the runtime ready
            assert "container_runtime()" in s.content and "crio_ready()" in s.content
