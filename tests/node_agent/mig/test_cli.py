"""The CLI: ``mig plan|apply|assert`` on simulated machines, and ``mig-manager`` against a fake API server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from node_agent.cli import main
from node_agent.mig.kube import KubeNodeApi, NodePatch
from node_agent.nvml import NvmlBackend, open_nvml
from nvgpu import labels
from nvgpu.migparted import build_config
from nvgpu.taints import NodeTaint
from nvml_sim import SimulatedMachine
from tests.kit.kmock import api, kmock_server, kube, kubeconfig


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "mig.yaml"
    path.write_text(build_config().to_yaml())
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main(["--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_plan_apply_assert(tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "a100.json"
    common = ["--nvml", "simulated:dgx-a100-40gb", "--nvml-state", str(state), "mig"]
    opts = ["--config", str(config_file), "--name", "all-balanced"]
    code, doc = run(capsys, *common, "plan", *opts)
    assert code == 0
    gpu0 = doc["gpus"][0]  # type: ignore[index]
    assert gpu0["instances"] == [{"profile": "2g.10gb", "start": 0}, {"profile": "1g.5gb", "start": 2},
                                 {"profile": "1g.5gb", "start": 3}, {"profile": "3g.20gb", "start": 4}]
    assert run(capsys, *common, "assert", *opts)[0] == 1
    code, doc = run(capsys, *common, "apply", *opts)
    assert code == 0 and doc["changed"] == list(range(8))
    assert run(capsys, *common, "assert", *opts)[0] == 0
    with open_nvml(NvmlBackend("simulated", "dgx-a100-40gb", state)) as nvml:
        assert sorted(d.profile for d in nvml.gpu(7).mig_devices) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    assert run(capsys, *common, "apply", *opts)[1]["changed"] == []  # idempotent


def test_text_plan(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--nvml", "simulated:a30x4", "mig", "plan", "--config", str(config_file), "--name", "all-2g.12gb"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "GPU 3 (A30-24GB): MIG enabled: 2g.12gb@0, 2g.12gb@2" in out


@pytest.mark.parametrize(
    ("machine", "name", "why"),
    [("dgx-h100", "all-9g.99gb", "unknown MIG config"),
     ("dgx-h100", "all-1g.5gb", "selects none of this node's GPUs"),
     ("l4x2", "all-balanced", "selects none")],
)
def test_bad_input_exits_2(config_file: Path, capsys: pytest.CaptureFixture[str], machine: str, name: str,
                           why: str) -> None:
    code, doc = run(capsys, "--nvml", f"simulated:{machine}", "mig", "apply", "--config", str(config_file),
                    "--name", name)
    assert code == 2 and why in str(doc["error"])


def test_unreadable_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n")
    code, doc = run(capsys, "--nvml", "simulated:dgx-h100", "mig", "plan", "--config", str(bad), "--name", "x")
    assert code == 2 and "mig-devices is required" in str(doc["error"])


def test_apply_needing_a_reset_that_fails_exits_3_and_restores(tmp_path: Path, config_file: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "h200.json"
    sim = SimulatedMachine("hgx-h200", state)
    sim.block_reset(2)
    code, doc = run(capsys, "--nvml", "simulated:hgx-h200", "--nvml-state", str(state), "mig", "apply",
                    "--config", str(config_file), "--name", "all-7g.141gb")
    assert code == 5 and "a reboot is needed" in str(doc["error"])
    assert all(not g.mig_current and not g.mig_pending for g in sim.state.gpus)


def _core(url: str) -> Any:
    """kmock's core API as a test drives it: plain dicts in and out (the generated client sends a dict body as
    it is; its stubs name only the model classes), its answers read as the client's models."""
    return client.CoreV1Api(api(url))


def test_node_api_over_http() -> None:
    with kmock_server() as url:
        core = _core(url)
        core.create_node({"metadata": {"name": "n1", "labels": {labels.MIG_CONFIG: "b"}}})
        core.create_namespaced_pod("ml", {"metadata": {"name": "train", "namespace": "ml"}, "spec": {
            "nodeName": "n1", "containers": [{"name": "c", "image": "i", "resources": {
                "limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}})
        core.create_namespaced_pod("ml", {"metadata": {"name": "elsewhere", "namespace": "ml"}, "spec": {
            "nodeName": "n2", "containers": [{"name": "c", "image": "i"}]}})
        node = KubeNodeApi(kube(url), "n1")
        taint = NodeTaint("mig-reconfigure", "true", "NoSchedule")
        # Keys of the MIG manager's only (node_agent.kube.nodeowner refuses others' before any request).
        view = node.patch_node(NodePatch(labels={labels.MIG_CONFIG: None, labels.MIG_CONFIG_STATE: "d"},
                                         annotations={labels.DRAINING: "x"}, taints=(taint,), unschedulable=True))
        assert view.labels == {labels.MIG_CONFIG_STATE: "d"} and view.annotations == {labels.DRAINING: "x"}
        assert view.taints == (NodeTaint("mig-reconfigure", "true", "NoSchedule"),) and view.unschedulable
        (pod,) = node.pods_on_node()
        assert pod.ref == "ml/train" and pod.gpu_requests == ("nvidia.com/mig-1g.10gb",)
        node.evict("ml", "gone")  # no such pod: not an error
        node.delete_pod("ml", "train")
        assert node.pods_on_node() == ()
        node.event(view, "MigReconfigured", "done", warning=False)
        assert node.calls == 6


def test_watch_returns_on_a_node_event() -> None:
    with kmock_server() as url:
        _core(url).create_node({"metadata": {"name": "n1"}})
        node = KubeNodeApi(kube(url), "n1")
        node.wait_for_change("", 5)  # the watch delivers the Node and returns (no sleep until the timeout)
        assert node.calls == 1


def test_cancel_ends_a_watch_at_once() -> None:
    """``cancel_waits`` from another thread breaks off an idle watch (kmock never times one out)."""
    with kmock_server() as url:
        # kmock ignores resourceVersion and replays the Node as ADDED: with its version unchanged the
        # watch sees nothing new and blocks, as on an idle real cluster.
        _core(url).create_node({"metadata": {"name": "n1", "resourceVersion": "7"}})
        node = KubeNodeApi(kube(url), "n1")
        threading.Timer(0.5, node.cancel_waits).start()
        started = time.monotonic()
        node.wait_for_change("7", 30)  # returns, no KubeError
        assert time.monotonic() - started < 5
        started = time.monotonic()
        node.wait_for_change("7", 30)  # once cancelled, later waits return at once
        assert time.monotonic() - started < 1 and node.calls == 1


def test_idle_manager_exits_promptly_on_sigterm(tmp_path: Path, config_file: Path) -> None:
    """SIGTERM while idle in the Node watch exits at once, well inside a pod's 30 s grace period.

    It used to set the stop flag only, and the process sat out the rest of its 60 s watch.
    """
    with kmock_server() as url:
        core = _core(url)
        core.create_node({"metadata": {"name": "gpu-1", "resourceVersion": "1"}})  # no MIG config: idle
        core.create_namespaced_pod("web", {"metadata": {"name": "web", "namespace": "web"}, "spec": {
            "nodeName": "cpu-1", "containers": [{"name": "c", "image": "i"}]}})
        argv = [sys.executable, "-m", "node_agent", "--log-level", "debug", "--nvml", "simulated:dgx-h100",
                "--nvml-state", str(tmp_path / "h100.json"), "--node-name", "gpu-1", "--host-root",
                str(tmp_path / "host"), "--kubeconfig", str(kubeconfig(url, tmp_path / "kubeconfig")),
                "mig-manager", "--drain", "cordon", "--config", str(config_file), "--metrics-port", "0"]
        lines: list[str] = []
        with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
            try:
                watching = threading.Event()

                def read_stderr() -> None:
                    assert proc.stderr is not None
                    for line in proc.stderr:
                        lines.append(line)
                        if "event=watch-open" in line:
                            watching.set()

                reader = threading.Thread(target=read_stderr, daemon=True)
                reader.start()
                assert watching.wait(30), "".join(lines)
                time.sleep(0.3)  # into the blocking read
                assert proc.poll() is None, "".join(lines)
                proc.send_signal(signal.SIGTERM)
                started = time.monotonic()
                code = proc.wait(10)
                elapsed = time.monotonic() - started
                reader.join(5)
            finally:
                if proc.poll() is None:
                    proc.kill()
        log = "".join(lines)
        assert code == 0 and elapsed < 3, (code, elapsed, log)
        assert "event=signal signal=SIGTERM" in log and "act=exit" in log and "watch-failed" not in log


def test_manager_once_against_the_fake_api_server(tmp_path: Path, config_file: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "h100.json"
    with kmock_server() as url:
        core = _core(url)
        core.create_node({"metadata": {"name": "gpu-1", "labels": {
            labels.MIG_CONFIG: "all-1g.20gb", labels.DEVICE_GPU_CONFIG: "MIG", labels.MIG_CAPABLE: "true"}}})
        # kmock answers 404 for a resource it has never stored: give it one pod, on another node.
        core.create_namespaced_pod("web", {"metadata": {"name": "web", "namespace": "web"}, "spec": {
            "nodeName": "cpu-1", "containers": [{"name": "c", "image": "i"}]}})
        argv = ["--nvml", "simulated:dgx-h100", "--nvml-state", str(state), "--node-name", "gpu-1",
                "--host-root", str(tmp_path / "host"), "--kubeconfig", str(kubeconfig(url, tmp_path / "kubeconfig")),
                "mig-manager", "--once", "--drain", "cordon", "--config", str(config_file)]
        code, doc = run(capsys, *argv)
        assert (code, doc.get("action")) == (0, "idle"), doc
        node = core.read_node("gpu-1")
        assert node.metadata.labels[labels.MIG_CONFIG_STATE] == "success"
        assert not node.spec.taints and not node.spec.unschedulable
        assert not any(k.startswith(labels.GPU_DEPLOY_PREFIX) for k in node.metadata.labels)
        events = core.list_namespaced_event("default").items
        assert [e.reason for e in events] == ["MigReconfigured"]
    with open_nvml(NvmlBackend("simulated", "dgx-h100", state)) as nvml:
        assert all(sorted(d.profile for d in g.mig_devices) == ["1g.20gb"] * 4 for g in nvml.gpus())
    assert not (tmp_path / "host/var/lib/nvidia-gpu-agent/mig/journal.json").exists()


def test_through_the_agent_cli_in_separate_processes(tmp_path: Path) -> None:
    """``python -m node_agent mig ...`` as an operator runs it: apply in one process, assert in another."""
    # NVIDIA's, unchanged (tests/nvgpu holds it, beside the tests of nvgpu.migparted)
    nvidia_file = Path(__file__).resolve().parents[2] / "nvgpu" / "nvidia-mig-parted-config-default.yaml"
    base = [sys.executable, "-m", "node_agent", "--nvml", "simulated:hgx-h200", "--nvml-state",
            str(tmp_path / "h200.json"), "--json", "mig"]
    opts = ["--config", str(nvidia_file), "--name", "all-balanced"]

    def agent(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *argv, *opts], capture_output=True, text=True, timeout=60, check=False)

    assert agent("assert").returncode == 1
    applied = agent("apply")
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["changed"] == list(range(8))
    checked = agent("assert")
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"] is True


def test_apply_and_assert_on_gpus_whose_empty_mig_slots_answer_invalid_argument(
        tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Drivers answer INVALID_ARGUMENT as well as NOT_FOUND for an empty MIG device slot (NVIDIA's go-nvlib
    skips both, ``pkg/nvlib/device/device.go``). A layout with empty slots (all-balanced: four devices in
    seven slots) used to cost the GPUs ("MIG device 0:4: Invalid Argument") and the MIG manager the node."""
    state = tmp_path / "a100.json"
    sim = SimulatedMachine("dgx-a100-40gb", state)
    for index in range(8):
        sim.set_mig_empty_slot_error(index, 2)
    common = ["--nvml", "simulated:dgx-a100-40gb", "--nvml-state", str(state), "mig"]
    opts = ["--config", str(config_file), "--name", "all-balanced"]
    code, doc = run(capsys, *common, "apply", *opts)
    assert code == 0 and doc["changed"] == list(range(8))
    assert run(capsys, *common, "assert", *opts)[0] == 0
    assert run(capsys, *common, "apply", *opts)[1]["changed"] == []  # idempotent: the layout reads back
