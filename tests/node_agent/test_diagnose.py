"""``python -m node_agent diagnose``: a report of a simulated node, read without changing a byte of it.

Run as a support engineer runs it (a subprocess with the agent's global options): on a simulated DGX H100
and on a DGX A100 with MIG instances, the host tree (every file's content, mode and time) is the same
after as before, the report has its documented sections with a value or an error in each place, and the
bundle holds the same report with the raw files it read. Against the fake API server, the Kubernetes
section shows the node's GPU labels, taints and GPU objects.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from node_agent.nvml import NvmlBackend, open_nvml
from nvgpu import inventory
from tests.kit.fakehost import build_fake_host, sim_state_file
from tests.kit.kmock import api
from tests.node_agent.agent_testkit import ApiServer

REPO = Path(__file__).resolve().parents[2]
SECTIONS = {"format", "collectedAt", "node", "nvmlBackend", "driver", "gpus", "xids", "kernelModules", "deviceNodes",
            "deviceHolders", "runtime", "cdiSpecs", "agentState", "kubernetes"}
GPU_KEYS = {"index", "identity", "brand", "serial", "vbios", "persistenceMode", "computeMode", "migMode", "fabric",
            "remappedRows", "retiredPagesPending", "recoveryAction", "processes", "mig"}


def _tree(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under ``root``: its content hash (or link target), mode and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                what = "-> " + os.readlink(p)
            elif p.is_file():
                what = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                what = "dir" if p.is_dir() else "other"
            out[str(p.relative_to(root))] = (what, st.st_mode, st.st_mtime_ns)
    return out


def _run(root: Path, machine: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m node_agent --host-root ROOT --nvml simulated:MACHINE ARGS`` as a support engineer runs it."""
    return subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(root), "--nvml",
                           f"simulated:{machine}", *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)


def _diagnose(root: Path, machine: str, *args: str) -> dict[str, Any]:
    done = _run(root, machine, *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


@pytest.mark.parametrize("machine", ["dgx-h100", "dgx-a100-80gb"])
def test_diagnose_changes_nothing_and_reports_every_section(machine: str, tmp_path: Path) -> None:
    root = tmp_path / "host"
    host = build_fake_host(root, machine)
    if machine.startswith("dgx-a100"):  # a GPU in MIG mode with instances, as a MIG node has them
        with open_nvml(NvmlBackend("simulated", machine, sim_state_file(root, machine))) as nvml:
            nvml.set_mig_mode(0, True)
            gi = nvml.create_gpu_instance(0, 9)  # 3g.40gb
            nvml.create_compute_instance(0, gi.id)
    host.put("/var/log/kern.log", "Dec  6 10:00:00 node kernel: NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has "
                                  "fallen off the bus.\n")
    before = _tree(root)
    bundle = tmp_path / "support.tar.gz"
    doc = _diagnose(root, machine, "diagnose", "--bundle", str(bundle))
    assert _tree(root) == before, "diagnose changed the host"

    assert set(doc) == SECTIONS
    assert doc["driver"]["driverVersion"] and doc["driver"]["nvmlVersion"]
    assert len(doc["gpus"]) == 8 and all(set(g) == GPU_KEYS for g in doc["gpus"])
    first = doc["gpus"][0]
    assert first["identity"]["uuid"].startswith("GPU-")
    assert doc["xids"] == {"source": "/var/log/kern.log", "lines": [
        "Dec  6 10:00:00 node kernel: NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has fallen off the bus."]}
    assert {e["path"] for e in doc["deviceNodes"]["/dev"]} >= {"/dev/nvidiactl", "/dev/nvidia0"}
    assert "/etc/containerd/config.toml" in doc["runtime"]
    assert doc["kubernetes"] is None  # no kubeconfig given
    if machine.startswith("dgx-a100"):
        assert first["migMode"]["current"] is True
        (gi,) = first["mig"]["gpuInstances"]
        assert gi["profile_id"] == 9 and len(gi["computeInstances"]) == 1
        profile = next(p for p in first["mig"]["profiles"] if p["id"] == 9)
        assert profile["placements"] and profile["name"] == "3g.40gb"
    # A value the simulated driver does not answer is an error in its place, never a missing key.
    assert all(isinstance(v, (dict, list, str, int, bool)) or v is None for v in first.values())

    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        report = tar.extractfile("diagnose.json")
        assert report is not None and json.loads(report.read()) == doc
    assert "host/etc/containerd/config.toml" in names and "host/proc/modules" in names


def test_the_kubernetes_section_shows_the_nodes_gpu_state(tmp_path: Path, api_server: ApiServer) -> None:
    root = tmp_path / "host"
    build_fake_host(root, "dgx-h100")
    api_server.set_labels("gpu-node-1", {"nvidia.com/gpu.count": "8"})
    api_server.core().patch_node("gpu-node-1", {"spec": {"taints": [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}})
    client.CustomObjectsApi(api(api_server.url)).create_cluster_custom_object(
        inventory.GROUP, inventory.VERSION, inventory.PLURAL, {
            "apiVersion": inventory.API_VERSION, "kind": inventory.KIND,
            "metadata": {"name": "gpu-node-1-gpu0", "labels": {inventory.NODE_LABEL: "gpu-node-1"}},
            "spec": {"node": "gpu-node-1", "index": 0}})
    doc = _diagnose(root, "dgx-h100", "--node-name", "gpu-node-1", "--kubeconfig", str(api_server.kubeconfig),
                    "diagnose")
    kube = doc["kubernetes"]
    assert kube["labels"] == {"nvidia.com/gpu.count": "8"}  # only the GPU stack's domains
    assert kube["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert [g["name"] for g in kube["gpuObjects"]] == ["gpu-node-1-gpu0"]


def test_a_bundle_path_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "host"
    build_fake_host(root, "dgx-h100")
    done = _run(root, "dgx-h100", "diagnose", "--bundle", str(tmp_path / "missing" / "b.tar.gz"))
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: --bundle ") and "Traceback" not in done.stderr


@pytest.mark.parametrize(("machine", "vbios"), [("t4x1", "90.04.96.00.9F"), ("hgx-h200", "96.00.A5.00.01")])
def test_the_boards_identity_and_modes_are_values_not_errors(machine: str, vbios: str, tmp_path: Path) -> None:
    """Brand, serial, VBIOS, persistence and compute mode are answered by the simulated driver as a real one
    answers them (``nvidia-smi -q`` of a Tesla T4 in NVIDIA/nvidia-docker#1628: brand NVIDIA, a 13-digit
    serial, VBIOS 90.04.96.00.9F, persistence mode on), on every GPU."""
    root = tmp_path / "host"
    build_fake_host(root, machine)
    doc = _diagnose(root, machine, "diagnose")
    serials = set()
    for gpu in doc["gpus"]:
        assert (gpu["brand"], gpu["vbios"], gpu["persistenceMode"], gpu["computeMode"]) == (
            "NVIDIA", vbios, True, "DEFAULT"), gpu["index"]
        assert isinstance(gpu["serial"], str) and len(gpu["serial"]) == 13 and gpu["serial"].isdigit()
        serials.add(gpu["serial"])
    assert len(serials) == len(doc["gpus"])  # one board, one serial
