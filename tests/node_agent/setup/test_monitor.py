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

from node_agent.kube.errors import KubeError
from node_agent.setup.check import CheckReport, Finding
from node_agent.setup.monitor import CheckMonitor
from nvgpu import labels
from nvgpu.nodescripts.facts import Reason, Verdict
from nvgpu.stackconfig import load_stack_config
from nvidia_gpu.components.manifests import driver
from nvidia_gpu.components.manifests.workloads import CONTAINER_DRIVER_ROOT, HOST_ROOT
from nvml_sim.host import driver_version_text
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


def test_a_changed_verdict_is_written_on_the_node_once_and_a_refused_write_again() -> None:
    """With a publisher (node setup's pod), the node's check labels follow the verdict: written when the
    verdict or reasons change, not on every run; a write the API server refuses is tried after the next run."""

    mismatch = CheckReport(Verdict.UNUSABLE, (Finding(Reason.DRIVER_MISMATCH, "driver 550.90.07 is loaded; the "
                                                      "node group declares 550.127.05"),))
    reports = [CheckReport(Verdict.OK), CheckReport(Verdict.OK), mismatch, mismatch, mismatch, CheckReport(Verdict.OK)]
    written: list[dict[str, str | None]] = []
    refuse = [False, True, False, False]  # per write: the first try of the mismatch is refused

    def publish(changes: dict[str, str | None]) -> None:
        if refuse.pop(0):
            raise KubeError("503 the API server is away")
        written.append(changes)

    monitor = CheckMonitor(lambda: reports.pop(0), publish=publish)
    for _ in range(6):
        monitor.run_once()
    assert written == [labels.check_labels("ok", []), labels.check_labels("unusable", ["driver-mismatch"]),
                       labels.check_labels("ok", [])]
    assert written[1] == {labels.NODE_CHECK: "unusable", labels.NODE_CHECK_REASONS: "driver-mismatch"}


def test_the_driver_pods_check_is_ready_only_with_the_declared_driver(tmp_path: Path) -> None:
    """The ``driver-check`` container of a driver pod, its command as the stack renders it (paths mapped onto a
    simulated DGX H100): not Ready while the old driver is loaded, Ready once the declared one is, which is
    what the upgrade's validation waits for."""

    cfg = load_stack_config({"cluster": {"kubernetesVersion": "1.34", "agentImage": {
        "repository": "registry.example.com/agent", "tag": "1.0.0"}}, "nodeGroups": [
        {"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
         "gpu": {"model": "H100-80GB", "driver": {"source": "container", "version": "550.127.05",
                                                  "kernelModules": "open", "osReleases": ["ubuntu22.04"]}}}]})
    container = driver.check_container(cfg.cluster, cfg.node_groups[0])
    host = build_fake_host(tmp_path / "host", "dgx-h100")  # the node still runs 550.90.07
    port = metrics.free_port()
    args = [str(host.root) if a in (HOST_ROOT, CONTAINER_DRIVER_ROOT) else a for a in container["args"]]
    args[args.index("--interval") + 1] = "0.2"
    args[args.index("--metrics-port") + 1] = str(port)
    assert container["command"] == ["python", "-m", "node_agent"]
    proc = subprocess.Popen([sys.executable, "-m", "node_agent", "--nvml", "simulated:dgx-h100", *args,
                             "--metrics-address", "127.0.0.1"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stderr=subprocess.PIPE)
    ready = f"http://127.0.0.1:{port}{container['readinessProbe']['httpGet']['path']}"
    try:
        old = _scrape_until(f"http://127.0.0.1:{port}/metrics", lambda s: _verdict(s) is not None)
        assert metrics.value(old, "nvidia_gpu_node_check_failing", reason="driver-mismatch") == 1
        assert metrics.get(ready)[0] == 503
        # The new driver container loaded the declared release.
        (host.root / "proc/driver/nvidia/version").write_text(driver_version_text("550.127.05"))
        deadline = time.monotonic() + 20
        while metrics.get(ready)[0] != 200:
            assert time.monotonic() < deadline, "the driver check never became ready"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
