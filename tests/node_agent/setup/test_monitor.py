"""Node setup's monitor (``setup-monitor``): the check again at an interval on a simulated node, its verdict,
reasons and driver as metrics over HTTP; a host that breaks after setup shows there; SIGTERM exits 0 (the
pod's preStop teardown follows)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from node_agent.setup.check import CheckReport, Finding
from node_agent.setup.monitor import CheckMonitor
from nvgpu.nodescripts.facts import Reason, Verdict
from tests.kit import metrics
from tests.kit.fakehost import build_fake_host

REPO = Path(__file__).resolve().parents[3]


def _scrape_until(url: str, done: Callable[[metrics.Samples], bool], timeout: float = 20.0) -> metrics.Samples:
    deadline = time.monotonic() + timeout
    got: metrics.Samples = {}
    while time.monotonic() < deadline:
        try:
            code, text = metrics.get(url, timeout=2)
        except OSError:
            code, text = 0, ""
        if code == 200:
            got = metrics.parse(text)
            if done(got):
                return got
        time.sleep(0.1)
    raise AssertionError(f"{url} never showed what was expected; last: {got}")


def _verdict(samples: metrics.Samples) -> str | None:
    on = [labels["verdict"] for labels, v in samples.get("nvidia_gpu_node_check_verdict", []) if v == 1]
    return on[0] if on else None


def test_a_node_that_breaks_after_setup_shows_in_the_metrics(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path / "host", "dgx-h100")
    agent = [sys.executable, "-m", "node_agent", "--host-root", str(host.root), "--nvml", "simulated:dgx-h100"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Set up as the init container would (containerd's runtime config, sysctl); no restart, no Node here.
    done = subprocess.run([*agent, "setup", "--no-restart", "--no-patch-node"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    verdict_file = host.root / "var/lib/nvidia-gpu-agent/check.verdict"
    recorded = verdict_file.read_text()
    port = metrics.free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(
        [*agent, "setup-monitor", "--interval", "0.2", "--metrics-address", "127.0.0.1", "--metrics-port", str(port)],
        cwd=REPO, env=env, stderr=subprocess.PIPE)
    try:
        good = _scrape_until(url, lambda s: _verdict(s) is not None)
        assert _verdict(good) == "ok", good
        assert metrics.value(good, "nvidia_gpu_node_check_failing", reason="module-missing") == 0
        assert metrics.value(good, "nvidia_gpu_node_driver_info", version="550.90.07") == 1
        assert metrics.get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        # The nvidia kernel module goes away (unloaded by hand, a failed driver upgrade): the next run sees it.
        modules = host.root / "proc/modules"
        modules.write_text("".join(line + "\n" for line in modules.read_text().splitlines()
                                   if not line.startswith("nvidia ")))
        bad = _scrape_until(url, lambda s: _verdict(s) == "unusable")
        assert metrics.value(bad, "nvidia_gpu_node_check_failing", reason="module-missing") == 1
        assert metrics.value(bad, "nvidia_gpu_node_check_runs_total", result="ok") >= 2
        # setup-monitor never records a verdict: setup's stays as it wrote it (bashible and setup read it).
        assert verdict_file.read_text() == recorded
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()


def test_a_check_that_raises_keeps_the_last_verdict() -> None:
    reports: list[CheckReport | Exception] = [
        CheckReport(Verdict.OK, driver_version="550.90.07"),
        RuntimeError("boom"),
        CheckReport(Verdict.UNUSABLE, (Finding(Reason.DRIVER_MISSING, "no driver"),), driver_version=None),
    ]

    def check() -> CheckReport:
        r = reports.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    monitor = CheckMonitor(check)

    def sample(name: str, **labels: str) -> float | None:
        return monitor.registry.get_sample_value(f"nvidia_gpu_node_{name}", labels)

    assert not monitor.live()
    monitor.run_once()
    assert sample("check_verdict", verdict="ok") == 1 and sample("driver_info", version="550.90.07") == 1
    assert monitor.run_once() is None  # the crash is counted, the verdict stays
    assert sample("check_verdict", verdict="ok") == 1
    assert sample("check_runs_total", result="error") == 1
    monitor.run_once()
    assert sample("check_verdict", verdict="unusable") == 1 and sample("check_verdict", verdict="ok") == 0
    assert sample("check_failing", reason="driver-missing") == 1
    assert sample("driver_info", version="550.90.07") is None  # no driver seen: the old series is gone
