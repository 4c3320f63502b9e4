"""``check`` on NVSwitch machines: Fabric Manager must have registered every GPU before CUDA runs.

On HGX/DGX H100 and H200 every CUDA program fails with error 802 (cudaErrorSystemNotReady) until Fabric
Manager has registered the GPUs with the NVLink fabric; NVML reports where that stands through
``nvmlDeviceGetGpuFabricInfo`` (Hopper or newer only). The rule is NVIDIA's ``getCliqueIDStrict``
(kubernetes-sigs/dra-driver-nvidia-gpu ``cmd/compute-domain-kubelet-plugin/nvlib.go``): NOT_SUPPORTED is no
fabric, any state but COMPLETED is not ready, COMPLETED with an error status is a failed registration.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from node_agent.nvml import FabricInfo, FabricState, NvmlBackend, open_nvml
from nvgpu import labels
from nvml_sim import SimulatedMachine
from nvml_sim.state import FabricStateName, SimFabric
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.node_agent.agent_testkit import ApiServer, Cli

ZERO_CLUSTER = str(uuid.UUID(int=0))
NVML_ERROR_TIMEOUT = 10
SETUP = "node.deckhouse.io/gpu-setup-complete"


def _machine(host: FakeHost) -> SimulatedMachine:
    assert host.machine is not None
    return host.machine


def _check(cli: Cli, host: FakeHost, machine: str) -> tuple[int, list[str], list[str]]:
    code, doc = cli(host.root, f"simulated:{machine}", "check", "--phase", "host")
    return code, doc["reasons"], [f["message"] for f in doc["findings"]]


@pytest.mark.parametrize("machine", ["dgx-h100", "hgx-h200"])
def test_hopper_nvswitch_gpus_are_registered_by_default(tmp_path: Path, machine: str) -> None:
    """A booted HGX board whose Fabric Manager ran: each GPU COMPLETED, no multi-node cluster, clique 0."""
    host = build_fake_host(tmp_path, machine)
    with open_nvml(NvmlBackend("simulated", machine, _machine(host).store.path)) as nvml:
        infos = [nvml.fabric_info(g.index) for g in nvml.inventory().gpus]
    assert infos == [FabricInfo(ZERO_CLUSTER, 0, FabricState.COMPLETED, 0)] * 8


@pytest.mark.parametrize("machine", ["dgx-a100-40gb", "dgx-a100-80gb", "a30x4", "l4x2", "t4x1"])
def test_pre_hopper_and_pcie_gpus_report_no_fabric(tmp_path: Path, machine: str) -> None:
    """A DGX A100 has NVSwitches and a Fabric Manager, but NVML's fabric call is Hopper-or-newer: NOT_SUPPORTED,
    even when the state file says otherwise, and the simulator refuses to register such a GPU."""
    host = build_fake_host(tmp_path, machine)
    m = _machine(host)
    with pytest.raises(ValueError, match=r"Hopper \(9\.0\) or newer"):
        m.set_fabric(ZERO_CLUSTER, 0, gpus=[0])
    with m.store.mutate() as s:  # forced into the state file behind the helper's back
        s.gpus[0].fabric = SimFabric(cluster_uuid=uuid.UUID(int=0), clique_id=0, state="in-progress")
    with open_nvml(NvmlBackend("simulated", machine, m.store.path)) as nvml:
        assert nvml.fabric_info(0) is None


@pytest.mark.parametrize("machine", ["dgx-h100", "hgx-h200", "dgx-a100-80gb", "l4x2"])
def test_registered_or_fabricless_gpus_pass(tmp_path: Path, cli: Cli, machine: str) -> None:
    host = build_fake_host(tmp_path, machine)
    assert _check(cli, host, machine)[:2] == (0, [])


FAILED_WORDS = f"failed to register it with the NVLink fabric (NVML status {NVML_ERROR_TIMEOUT})"


@pytest.mark.parametrize("case", [
    ("not-started", 0, "registration is Not Started"),
    ("in-progress", 0, "registration is In Progress"),
    ("completed", NVML_ERROR_TIMEOUT, FAILED_WORDS),
])
@pytest.mark.parametrize("machine", ["dgx-h100", "hgx-h200"])
def test_fabric_not_ready_fails_the_node(tmp_path: Path, cli: Cli, machine: str,
                                         case: tuple[FabricStateName, int, str]) -> None:
    state, status, words = case
    host = build_fake_host(tmp_path, machine)
    _machine(host).set_fabric_manager(state, status, gpus=[5])
    code, reasons, messages = _check(cli, host, machine)
    assert (code, reasons) == (1, ["fabric-not-ready"])
    [message] = messages
    assert message.startswith("GPU 5 ") and words in message and "802" in message
    _machine(host).set_fabric_manager("completed")
    assert _check(cli, host, machine)[:2] == (0, [])


def test_whole_fabric_manager_down_names_every_gpu(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    _machine(host).set_fabric_manager("not-started")
    code, reasons, messages = _check(cli, host, "dgx-h100")
    assert (code, reasons) == (1, ["fabric-not-ready"])
    assert [m.split(" ", 2)[:2] for m in messages] == [["GPU", str(i)] for i in range(8)]


def test_fabric_query_errors_are_nvml_failures(tmp_path: Path, cli: Cli) -> None:
    """Any error but NOT_SUPPORTED is raised (NVIDIA's strict path refuses to start on it), not read as no fabric."""
    host = build_fake_host(tmp_path, "dgx-h100")
    _machine(host).fail_call(2, "nvmlDeviceGetGpuFabricInfo", 999)
    code, reasons, messages = _check(cli, host, "dgx-h100")
    assert (code, reasons) == (1, ["nvml-failed"])
    assert "nvmlDeviceGetGpuFabricInfo(2)" in messages[0]


def test_setup_keeps_the_gate_closed_and_labels_the_reason(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    """The finding flows as every check finding does: setup fails its check step, the gate label stays off,
    the check labels (read back by the labeller into each GPU object's ``nodeCheck``) carry the reason."""
    host = build_fake_host(tmp_path, "hgx-h200", containerd=2, deckhouse=False)
    _machine(host).set_fabric_manager("in-progress")
    kube = {"node": "gpu-node-1", "kubeconfig": api_server.kubeconfig}
    code, doc = cli(host.root, "simulated:hgx-h200", "setup", **kube)
    assert (code, doc["complete"]) == (1, False), doc
    assert doc["steps"][-1]["name"] == "check" and "fabric-not-ready" in doc["steps"][-1]["detail"]
    node = api_server.labels("gpu-node-1")
    assert SETUP not in node
    assert (node[labels.NODE_CHECK], node[labels.NODE_CHECK_REASONS]) == ("unusable", "fabric-not-ready")
    assert host.path("/var/lib/nvidia-gpu-agent/check.verdict").read_text().startswith(
        "verdict=unusable\nreasons=fabric-not-ready\n")
    _machine(host).set_fabric_manager("completed")
    code, doc = cli(host.root, "simulated:hgx-h200", "setup", **kube)
    assert (code, doc["complete"]) == (0, True), doc
    node = api_server.labels("gpu-node-1")
    assert node[SETUP] == "" and node[labels.NODE_CHECK] == "ok" and labels.NODE_CHECK_REASONS not in node


def test_sim_fabric_manager_refuses_a_gpu_without_fabric(tmp_path: Path) -> None:
    m = _machine(build_fake_host(tmp_path, "l4x2"))
    m.set_fabric_manager("in-progress")  # every GPU with a fabric: none here, nothing changes
    assert all(g.fabric is None for g in m.state.gpus)
    with pytest.raises(ValueError, match=r"GPU 1 .* no NVLink fabric"):
        m.set_fabric_manager("in-progress", gpus=[1])
