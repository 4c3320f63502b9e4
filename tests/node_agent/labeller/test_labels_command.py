"""GPU feature-discovery labels: NVIDIA's formats, MIG strategies, sharing, the feature file, Node patches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node_agent.labeller import gfd
from node_agent.nvml import NvmlBackend, open_nvml
from nvml_sim.lib import MIG_MONITOR_ENV
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.node_agent.agent_testkit import ApiServer, Cli

FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/gfd"


def _mig_layout(host: FakeHost, gpus: range, layout: list[tuple[int, int | None]]) -> None:
    """Enable MIG on ``gpus`` and create (profile_id, CI slices or None=whole GI) instances."""
    assert host.machine is not None
    with open_nvml(NvmlBackend("simulated", host.machine.spec.name, host.machine.store.path)) as nvml:
        for i in gpus:
            nvml.set_mig_mode(i, True)
            for profile_id, slices in layout:
                gi = nvml.create_gpu_instance(i, profile_id)
                nvml.create_compute_instance(i, gi.id, slices)


def test_full_gpu_labels_match_nvidia_formats(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-a100-40gb")
    code, doc = cli(host.root, "simulated:dgx-a100-40gb", "labels")
    labels = doc["labels"]
    assert code == 0
    assert {k: labels[k] for k in (
        "nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory", "nvidia.com/gpu.family",
        "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor", "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.sharing-strategy", "nvidia.com/mig.capable", "nvidia.com/cuda.driver-version.full",
        "nvidia.com/cuda.driver-version.revision", "nvidia.com/cuda.runtime-version.full", "nvidia.com/gpu.machine",
        "nvidia.com/gpu.mode", "nvidia.com/mps.capable")} == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "40960", "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true", "nvidia.com/cuda.driver-version.full": "535.183.06",
        "nvidia.com/cuda.driver-version.revision": "06", "nvidia.com/cuda.runtime-version.full": "12.2",
        "nvidia.com/gpu.machine": "DGXA100-920-23687-2530-000", "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mps.capable": "false"}
    assert "nvidia.com/mig.strategy" not in labels
    assert int(labels["nvidia.com/gfd.timestamp"]) > 0
    text = host.path(FEATURES).read_text()
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB\n" in text
    assert all("=" in line for line in text.splitlines())


def test_time_slicing_and_mps(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    _, doc = cli(host.root, "simulated:l4x2", "labels", "--replicas", "4")
    assert (doc["labels"]["nvidia.com/gpu.product"], doc["labels"]["nvidia.com/gpu.replicas"],
            doc["labels"]["nvidia.com/gpu.sharing-strategy"]) == ("NVIDIA-L4-SHARED", "4", "time-slicing")
    _, doc = cli(host.root, "simulated:l4x2", "labels", "--replicas", "2", "--sharing-strategy", "mps")
    assert (doc["labels"]["nvidia.com/mps.capable"], doc["labels"]["nvidia.com/gpu.sharing-strategy"]) == (
        "true", "mps")
    assert doc["labels"]["nvidia.com/mig.capable"] == "false"
    assert cli(host.root, "simulated:l4x2", "labels", "--replicas", "0")[0] == 2


def test_mixed_strategy_labels_each_profile(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    _mig_layout(host, range(2), [(9, None), (14, None), (19, None), (19, None)])  # all-balanced
    _, doc = cli(host.root, "simulated:dgx-h100", "labels", "--mig-strategy", "mixed", "--no-timestamp")
    labels = doc["labels"]
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    # nvidia.com/gpu.* counts every GPU, MIG mode or not (NVIDIA's GFD, checked against its binary); the
    # six full GPUs keep the sharing settings.
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"]) == ("8", "1")
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-1g.10gb.")} == {
        "nvidia.com/mig-1g.10gb.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        "nvidia.com/mig-1g.10gb.count": "4", "nvidia.com/mig-1g.10gb.replicas": "1",
        "nvidia.com/mig-1g.10gb.sharing-strategy": "none", "nvidia.com/mig-1g.10gb.memory": "9984",
        "nvidia.com/mig-1g.10gb.multiprocessors": "16", "nvidia.com/mig-1g.10gb.slices.gi": "1",
        "nvidia.com/mig-1g.10gb.slices.ci": "1", "nvidia.com/mig-1g.10gb.engines.copy": "1",
        "nvidia.com/mig-1g.10gb.engines.decoder": "1", "nvidia.com/mig-1g.10gb.engines.encoder": "0",
        "nvidia.com/mig-1g.10gb.engines.jpeg": "0", "nvidia.com/mig-1g.10gb.engines.ofa": "0"}
    assert labels["nvidia.com/mig-3g.40gb.count"] == "2"
    assert labels["nvidia.com/mig-3g.40gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-2g.20gb.memory"] == "20096"


def test_single_strategy_valid_and_invalid(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path / "a", "a30x4")
    _mig_layout(host, range(4), [(14, None), (14, None)])
    _, doc = cli(host.root, "simulated:a30x4", "labels", "--mig-strategy", "single")
    labels = doc["labels"]
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"],
            labels["nvidia.com/gpu.slices.gi"], labels["nvidia.com/gpu.family"]) == (
        "NVIDIA-A30-MIG-1g.6gb", "8", "5836", "1", "ampere")
    mixed = build_fake_host(tmp_path / "b", "a30x4")
    _mig_layout(mixed, range(1), [(14, None)])
    _, doc = cli(mixed.root, "simulated:a30x4", "labels", "--mig-strategy", "single")
    labels = doc["labels"]
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"],
            labels["nvidia.com/gpu.memory"], labels["nvidia.com/gpu.sharing-strategy"]) == (
        "NVIDIA-A30-MIG-INVALID", "0", "0", "0", "")


def test_partial_compute_instance_slices(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-a100-80gb")
    _mig_layout(host, range(1), [(9, 1)])
    _, doc = cli(host.root, "simulated:dgx-a100-80gb", "labels", "--mig-strategy", "mixed")
    labels = doc["labels"]
    assert (labels["nvidia.com/mig-1c.3g.40gb.slices.gi"], labels["nvidia.com/mig-1c.3g.40gb.slices.ci"]) == ("3", "1")


def test_no_gpu_and_no_change(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, None)
    _, doc = cli(host.root, "simulated:t4x1", "labels", "--no-timestamp")
    assert doc["labels"] == {"nvidia.com/vgpu.present": "false"}
    gpu = build_fake_host(tmp_path / "t4", "t4x1")
    assert cli(gpu.root, "simulated:t4x1", "labels", "--no-timestamp")[1]["fileChanged"] is True
    assert cli(gpu.root, "simulated:t4x1", "labels", "--no-timestamp")[1]["fileChanged"] is False


def test_nvml_failure_keeps_the_old_file(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "t4x1")
    assert cli(host.root, "simulated:t4x1", "labels")[0] == 0
    before = host.path(FEATURES).read_text()
    assert host.machine is not None
    host.machine.fail_init()
    code, doc = cli(host.root, "simulated:t4x1", "labels")
    assert code == 1 and "NVML" in doc["error"]
    assert host.path(FEATURES).read_text() == before


def test_patch_node_sets_labels_and_removes_stale_owned_ones(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    api_server.set_labels("gpu-node-1", {
        "nvidia.com/mig-1g.10gb.count": "7",  # stale: ours, no longer true
        "nvidia.com/gpu.deploy.device-plugin": "true",  # the operator's, not ours
        "nvidia.com/mig.config": "all-disabled",  # the MIG manager's
        "team": "ml",
    })
    code, doc = cli(host.root, "simulated:l4x2", "labels", "--patch-node", "--no-timestamp", node="gpu-node-1",
                    kubeconfig=api_server.kubeconfig)
    assert code == 0, doc
    labels = api_server.labels("gpu-node-1")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert "nvidia.com/mig-1g.10gb.count" not in labels
    assert (labels["nvidia.com/gpu.deploy.device-plugin"], labels["nvidia.com/mig.config"], labels["team"]) == (
        "true", "all-disabled", "ml")
    code, doc = cli(host.root, "simulated:l4x2", "labels", "--patch-node", "--no-timestamp", node="gpu-node-1",
                    kubeconfig=api_server.kubeconfig)
    assert doc["nodeChanges"] == {}


def test_a_new_timestamp_alone_writes_neither_the_file_nor_the_node(
        tmp_path: Path, cli: Cli, api_server: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timestamp says when the labels last changed: a run an hour later that finds nothing else
    changed leaves the feature file and the Node alone (NVIDIA's GFD stamps every run, which made every
    labeller write its Node once a minute); a real change carries the new stamp."""
    host = build_fake_host(tmp_path, "l4x2")
    clock = [1_700_000_000.0]
    monkeypatch.setattr("node_agent.labeller.labels.time.time", lambda: clock[0])

    def run(model: str = "simulated:l4x2") -> dict[str, Any]:
        code, doc = cli(host.root, model, "labels", "--patch-node", node="gpu-node-1",
                        kubeconfig=api_server.kubeconfig)
        assert code == 0 and isinstance(doc, dict), doc
        return doc

    first = run()
    assert first["fileChanged"] and first["nodeChanges"]["nvidia.com/gfd.timestamp"] == "1700000000"
    clock[0] += 3600
    again = run()
    assert (again["fileChanged"], again["nodeChanges"]) == (False, {})
    assert api_server.labels("gpu-node-1")["nvidia.com/gfd.timestamp"] == "1700000000"
    assert "nvidia.com/gfd.timestamp=1700000000" in host.path(FEATURES).read_text()
    api_server.set_labels("gpu-node-1", {"nvidia.com/gpu.product": "hand-edited"})
    healed = run()
    assert healed["nodeChanges"] == {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gfd.timestamp": "1700003600"}
    assert not healed["fileChanged"]


def test_loop_mode_runs_the_requested_iterations(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "t4x1")
    code, doc = cli(host.root, "simulated:t4x1", "labels", "--loop", "--interval", "0.01", "--iterations", "3")
    assert (code, doc) == (0, None)
    assert host.path(FEATURES).exists()


def test_patch_node_needs_a_node_name(tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    host = build_fake_host(tmp_path, "t4x1")
    assert cli(host.root, "simulated:t4x1", "labels", "--patch-node")[0] == 2


@pytest.mark.parametrize(("key", "ours"), [
    ("nvidia.com/gpu.product", True), ("nvidia.com/mig-2g.20gb.count", True), ("nvidia.com/cuda.driver.major", True),
    ("nvidia.com/mig.strategy", True), ("nvidia.com/gpu.deploy.dcgm", False), ("nvidia.com/mig.config", False),
    ("nvidia.com/mig.config.state", False), ("node.deckhouse.io/gpu", False),
])
def test_label_ownership(key: str, ours: bool) -> None:
    assert gfd.owned(key) is ours


def test_sanitize() -> None:
    assert gfd.sanitize("NVIDIA A100-SXM4-40GB") == "NVIDIA-A100-SXM4-40GB"
    assert gfd.sanitize("Tesla T4 (rev a1)/x") == "Tesla-T4-rev-a1x"
    assert len(gfd.sanitize("x" * 100)) == 63


def test_mig_gpus_read_without_the_monitor_capability_stay_counted(tmp_path: Path, cli: Cli,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On an HGX H200 with GPUs 2 and 5 in MIG mode, a labeller without the MIG monitor capability gets
    NO_PERMISSION for those GPUs' memory and MIG devices (NVIDIA/gpu-feature-discovery#6); they used to be
    dropped (``gpu.count`` 6). Now all 8 are counted and the run says what it could not read."""
    monkeypatch.delenv(MIG_MONITOR_ENV, raising=False)
    host = build_fake_host(tmp_path, "hgx-h200")
    _mig_layout(host, range(2, 6, 3), [(9, None)])  # GPUs 2 and 5: one 3g.71gb each
    assert host.machine is not None
    host.machine.require_mig_monitor()
    code, doc = cli(host.root, "simulated:hgx-h200", "labels", "--mig-strategy", "mixed", "--no-timestamp")
    assert code == 0
    assert (doc["labels"]["nvidia.com/gpu.count"], doc["labels"]["nvidia.com/gpu.memory"]) == ("8", "143771")
    assert sorted(w.split(":")[0] for w in doc["warnings"] if "labelled without" in w) == [
        "GPU 2 labelled without its MIG devices", "GPU 2 labelled without its memory",
        "GPU 5 labelled without its MIG devices", "GPU 5 labelled without its memory"]
    monkeypatch.setenv(MIG_MONITOR_ENV, "all")  # what the labeller's container sets on MIG groups
    _, doc = cli(host.root, "simulated:hgx-h200", "labels", "--mig-strategy", "mixed", "--no-timestamp")
    assert doc["labels"]["nvidia.com/mig-3g.71gb.count"] == "2"
    assert not [w for w in doc["warnings"] if "labelled without" in w]
