"""The simulated quick start: an empty ``--host-root`` with ``--nvml simulated:<machine>`` is that machine's node.

Run as the README runs it (``python -m node_agent`` in a subprocess, global options before or after the
command): the node is laid out on first use or by ``sim host``, ``check`` finds the machine's GPUs, a MIG
layout applied by one process is what the next one asserts, and the roots that must not be laid out
(``/``, a directory of something else, another machine's node) are refused with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node_agent.cli import exitcodes
from nvml_sim import host as sim_host

MIG_CONFIG = """\
version: v1
mig-configs:
  all-3g.40gb:
    - devices: all
      mig-enabled: true
      mig-devices: {3g.40gb: 2}
"""


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node_agent", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_an_empty_root_becomes_the_machine_and_keeps_what_commands_change(tmp_path: Path) -> None:
    root = tmp_path / "node"
    opts = ("--host-root", str(root), "--nvml", "simulated:dgx-h100")
    before = agent("check", "--json", *opts)  # options after the command; the root does not exist yet
    assert before.returncode == exitcodes.FAILED, before.stderr
    report = json.loads(before.stdout)
    assert report["verdict"] == "unusable" and len(report["gpus"]) == 8, report
    assert [f["reason"] for f in report["findings"]] == ["runtime-not-ready"], report
    assert sim_host.machine_of(root) == "dgx-h100"

    containerd = {p: p.read_bytes() for p in (root / "etc/containerd").rglob("*") if p.is_file()}
    assert agent(*opts, "runtime", "apply").returncode == 0
    after = json.loads(agent(*opts, "--json", "check").stdout)
    assert after["verdict"] == "ok" and after["runtimeName"] == "containerd", after
    assert "containerd" in (root / "var/log/simulated-systemctl.log").read_text()  # recorded, not run

    labels = agent(*opts, "labels")
    assert labels.returncode == 0, labels.stderr
    assert "nvidia.com/gpu.count=8" in labels.stdout.splitlines(), labels.stdout

    config = tmp_path / "mig.yaml"
    config.write_text(MIG_CONFIG)
    mig = ("--config", str(config), "--name", "all-3g.40gb")
    assert agent(*opts, "mig", "assert", *mig).returncode == exitcodes.FAILED  # not applied yet
    applied = agent(*opts, "mig", "apply", *mig)
    assert applied.returncode == 0, applied.stderr
    assert agent("mig", "assert", *mig, *opts).returncode == 0  # a later process sees the change
    status = json.loads(agent(*opts, "--json", "sim", "status").stdout)
    assert all(g["mig_current"] and len(g["instances"]) == 2 for g in status["gpus"]), status

    assert agent(*opts, "runtime", "rollback").returncode == 0
    assert {p: p.read_bytes() for p in (root / "etc/containerd").rglob("*") if p.is_file()} == containerd


def test_sim_host_lays_out_explicitly_and_again_without_losing_state(tmp_path: Path) -> None:
    opts = ("--host-root", str(tmp_path), "--nvml", "simulated:l4x2")
    first = agent(*opts, "--json", "sim", "host")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"hostRoot": str(tmp_path), "machine": "l4x2", "gpus": 2}
    assert agent(*opts, "sim", "lose", "1").returncode == 0
    assert agent(*opts, "sim", "host").returncode == 0  # idempotent: the lost GPU stays lost
    assert json.loads(agent(*opts, "--json", "sim", "status").stdout)["gpus"][1]["lost"] is True


@pytest.mark.parametrize(("root", "machine", "code", "message"), [
    ("/", "dgx-h100", exitcodes.USAGE, "never on this machine's own root /"),
    ("{foreign}", "dgx-h100", exitcodes.HOST_INPUT, "is not empty and not a simulated host"),
    ("{laid_out}", "dgx-h100", exitcodes.USAGE, "is a simulated l4x2 host; --nvml simulated:dgx-h100 does not match"),
    ("{empty}", "dgx-h999", exitcodes.USAGE, "machine one of dgx-a100-40gb"),
])
def test_roots_that_must_not_be_laid_out_are_refused(tmp_path: Path, root: str, machine: str, code: int,
                                                     message: str) -> None:
    foreign = tmp_path / "foreign"
    (foreign / "etc").mkdir(parents=True)
    (foreign / "etc" / "hostname").write_text("somebody-else\n")
    laid_out = tmp_path / "laid-out"
    sim_host.lay_out(laid_out, "l4x2")
    path = root.format(foreign=foreign, laid_out=laid_out, empty=tmp_path / "empty")
    done = agent("--host-root", path, "--nvml", f"simulated:{machine}", "sim", "host")
    assert done.returncode == code, done.stderr
    assert message in done.stderr, done.stderr
    assert sorted(p.name for p in foreign.rglob("*")) == ["etc", "hostname"]  # nothing written


def test_a_foreign_root_is_used_as_it_is(tmp_path: Path) -> None:
    """A directory that is not empty is a host mounted somewhere: never laid out behind the user's back."""
    (tmp_path / "etc").mkdir()
    done = agent("--host-root", str(tmp_path), "--nvml", "simulated:dgx-h100", "check", "--json")
    assert json.loads(done.stdout)["verdict"] == "no-gpu", done.stdout
    assert not sim_host.is_simulated_host(tmp_path)


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path: Path) -> None:
    """``labels | head -1``: stdout's reader is gone before the output is written; no traceback, exit 0."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(tmp_path), "--nvml",
                               "simulated:l4x2", "labels", "--no-output-file"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert done.returncode == exitcodes.OK and "Traceback" not in done.stderr, done.stderr


def test_sim_host_makes_a_module_unloadable_on_demand(tmp_path: Path) -> None:
    """``sim host --fresh-boot --unloadable-module nvidia-uvm``: the node's modprobe fails as kmod's does, so
    setup stops at its devices step naming the module and the message (a driver installed without nvidia-uvm)."""
    root = tmp_path / "node"
    opts = ("--host-root", str(root), "--nvml", "simulated:l4x2")
    laid = agent("sim", "host", "--fresh-boot", "--unloadable-module", "nvidia-uvm", *opts)
    assert laid.returncode == exitcodes.OK, laid.stderr
    modprobe = subprocess.run([str(root / "usr/sbin/modprobe"), "nvidia-uvm"], capture_output=True, text=True,
                              timeout=30, check=False)
    assert (modprobe.returncode, modprobe.stderr.strip()) == (
        1, "modprobe: FATAL: Module nvidia-uvm not found in directory /lib/modules/5.15.0-105-generic")
    assert "nvidia_uvm" not in (root / "proc/modules").read_text()
    setup = agent("setup", "--json", "--no-patch-node", "--no-restart", "--host-exec", "direct", *opts)
    step = json.loads(setup.stdout)["steps"][-1]
    assert setup.returncode != 0 and step["name"] == "devices"
    assert "modprobe nvidia-uvm failed (exit 1)" in step["detail"]
    assert agent("sim", "host", *opts).returncode == exitcodes.OK  # laid out again without it: modprobe loads it
    assert subprocess.run([str(root / "usr/sbin/modprobe"), "nvidia-uvm"], timeout=30, check=False).returncode == 0
