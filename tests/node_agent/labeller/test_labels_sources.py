"""Where the GFD labels' inputs come from: NVML's fabric info (``gpu.clique``), the PCI config space
(``vgpu.*``) and the device plugin's own config (sharing labels, followed when the plugin switches)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from node_agent.deviceplugin.nodelabel import ConfigSelector
from node_agent.host import HostError, HostRoot, VgpuInfoError, VgpuScanError, vgpu_devices
from node_agent.host.vgpu import host_driver, is_vgpu, vendor_capability
from node_agent.labeller import gfd
from node_agent.labeller.labels import Sharing, SharingSource
from node_agent.nvml import FabricInfo, FabricState, NvmlBackend, open_nvml
from tests.kit.fakehost import FakeHost, build_fake_host, pci_config_space
from tests.node_agent.agent_testkit import ApiServer, Cli

CLUSTER = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
OTHER_CLUSTER = "9b3e1c2a-0000-4000-8000-00000000abcd"
H100 = "simulated:dgx-h100"
NODE = "gpu-node-1"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
TIME_SLICED = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"


# --- nvidia.com/gpu.clique -------------------------------------------------------------------------

def _fabric(cluster: str = CLUSTER, clique: int = 7, state: FabricState = FabricState.COMPLETED,
            status: int = 0) -> FabricInfo:
    return FabricInfo(str(uuid.UUID(cluster)), clique, state, status)


@pytest.mark.parametrize(("fabric", "label", "why"), [
    ({}, None, None),
    ({0: None, 1: None}, None, None),
    ({0: _fabric(), 1: _fabric()}, f"{CLUSTER}.7", None),
    # Only attached GPUs count: registration still running, failed, or without a cluster UUID.
    ({0: _fabric(), 1: _fabric(state=FabricState.IN_PROGRESS), 2: None}, f"{CLUSTER}.7", None),
    ({0: _fabric(status=1), 1: _fabric(clique=8, state=FabricState.NOT_STARTED)}, None, None),
    ({0: _fabric(str(uuid.UUID(int=0)))}, None, None),
    # Disagreement: NVIDIA logs it and leaves the label out.
    ({0: _fabric(), 1: _fabric(clique=8)}, None, "different NVLink cliques (7: GPU 0; 8: GPU 1)"),
    ({0: _fabric(), 1: _fabric(OTHER_CLUSTER)}, None, "different NVLink fabric clusters"),
])
def test_clique_as_nvidia_computes_it(fabric: dict[int, FabricInfo | None], label: str | None,
                                      why: str | None) -> None:
    got, problem = gfd.fabric_clique(fabric)
    assert got == label
    assert (problem is None) == (why is None) and (why is None or why in str(problem))


def test_simulated_fabric_through_both_nvml_symbols(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    backend = NvmlBackend("simulated", "dgx-h100", host.machine.store.path)
    hgx = _fabric(str(uuid.UUID(int=0)), clique=0)  # an HGX board's GPUs once Fabric Manager ran: no cluster
    with open_nvml(backend) as nvml:
        assert nvml.fabric_info(0) == hgx
    host.machine.set_fabric(CLUSTER, 3, gpus=[0])
    with open_nvml(backend) as nvml:
        assert nvml.fabric_info(0) == _fabric(clique=3) and nvml.fabric_info(1) == hgx
    host.machine.set_fabric(None, gpus=[1])
    with open_nvml(backend) as nvml:
        assert nvml.fabric_info(1) is None  # out of any fabric: NVML answers NOT_SUPPORTED
    host.machine.remove_functions(["nvmlDeviceGetGpuFabricInfo"])  # a library with only the V symbol
    with open_nvml(backend) as nvml:
        assert nvml.fabric_info(0) == _fabric(clique=3)
    host.machine.remove_functions(["nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"])
    with open_nvml(backend) as nvml:
        assert nvml.fabric_info(0) is None  # neither: an old driver, no fabric


def test_clique_label_on_a_fabric_attached_machine(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    _, doc = cli(host.root, H100, "labels", "--no-timestamp")
    assert "nvidia.com/gpu.clique" not in doc["labels"]
    host.machine.set_fabric(CLUSTER, 32766)  # a GB200 NVL72-style tray: every GPU in one clique
    _, doc = cli(host.root, H100, "labels", "--no-timestamp")
    assert doc["labels"]["nvidia.com/gpu.clique"] == f"{CLUSTER}.32766"
    assert doc["warnings"] == []
    host.machine.set_fabric(CLUSTER, 2, gpus=[7])
    code, doc = cli(host.root, H100, "labels", "--no-timestamp")
    assert code == 0 and "nvidia.com/gpu.clique" not in doc["labels"]
    [warning] = doc["warnings"]
    assert "different NVLink cliques" in warning and "2: GPU 7" in warning


def test_fabric_errors_fail_the_run_as_nvidias_gfd_does(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    host.machine.set_fabric(CLUSTER, 1)
    host.machine.fail_call(3, "nvmlDeviceGetGpuFabricInfo", 999)
    code, doc = cli(host.root, H100, "labels")
    assert code == 1 and "nvmlDeviceGetGpuFabricInfo(3)" in doc["error"]


def test_sim_fabric_command(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "dgx-h100")
    assert cli(host.root, H100, "sim", "fabric", CLUSTER, "5", "--gpu", "1", "--state", "in-progress")[0] == 0
    assert host.machine is not None
    fabric = host.machine.state.gpus[1].fabric
    assert fabric is not None and (str(fabric.cluster_uuid), fabric.clique_id, fabric.state) == (
        CLUSTER, 5, "in-progress")
    assert cli(host.root, H100, "sim", "fabric", "none")[0] == 0
    assert all(g.fabric is None for g in host.machine.state.gpus)
    assert cli(host.root, H100, "sim", "fabric", "not-a-uuid", "1")[0] == 2


# --- nvidia.com/vgpu.* -----------------------------------------------------------------------------

def _config(host: FakeHost, address: str) -> Path:
    return host.path(f"/sys/bus/pci/devices/{address}/config")


def _first_gpu(host: FakeHost) -> str:
    return next(a for a in sorted(p.name for p in host.path("/sys/bus/pci/devices").iterdir())
                if host.path(f"/sys/bus/pci/devices/{a}/vendor").read_text().strip() == "0x10de")


def test_vgpu_guest_labels(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    _config(host, _first_gpu(host)).write_bytes(pci_config_space(0x27B8, vgpu_host_driver=("550.90.05", "r550_00")))
    _, doc = cli(host.root, "simulated:l4x2", "labels", "--no-timestamp")
    assert {k: v for k, v in doc["labels"].items() if k.startswith("nvidia.com/vgpu.")} == {
        "nvidia.com/vgpu.present": "true", "nvidia.com/vgpu.host-driver-version": "550.90.05",
        "nvidia.com/vgpu.host-driver-branch": "r550_00"}


def test_passthrough_gpus_and_gpu_less_nodes_are_not_vgpu(tmp_path: Path, cli: Cli) -> None:
    for machine in ("l4x2", None):
        host = build_fake_host(tmp_path / str(machine), machine)
        _, doc = cli(host.root, "simulated:l4x2", "labels", "--no-timestamp")
        assert doc["labels"]["nvidia.com/vgpu.present"] == "false"
        assert not any(k.startswith("nvidia.com/vgpu.host") for k in doc["labels"])


def test_unreadable_config_space_leaves_the_vgpu_labels_out(tmp_path: Path, cli: Cli) -> None:
    """What an unprivileged reader gets from sysfs: 64 bytes. NVIDIA's GFD cannot tell then, and says nothing."""
    host = build_fake_host(tmp_path, "l4x2")
    config = _config(host, _first_gpu(host))
    config.write_bytes(config.read_bytes()[:64])
    code, doc = cli(host.root, "simulated:l4x2", "labels", "--no-timestamp")
    assert code == 0 and not any(k.startswith("nvidia.com/vgpu.") for k in doc["labels"])
    assert doc["labels"]["nvidia.com/gpu.count"] == "2"
    [warning] = doc["warnings"]
    assert "64 bytes" in warning and "CAP_SYS_ADMIN" in warning
    config.unlink()
    with pytest.raises(VgpuScanError):
        vgpu_devices(HostRoot(host.root))


def test_vgpu_capability_without_host_driver_record_fails_the_run(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    raw = bytearray(pci_config_space(0x27B8, vgpu_host_driver=("550.90.05", "r550_00")))
    raw[0x68 + 5] = 0x03  # the first record is not the host driver's, and it runs off the capability
    raw[0x68 + 6] = 0x40
    _config(host, _first_gpu(host)).write_bytes(bytes(raw))
    with pytest.raises(VgpuInfoError):
        vgpu_devices(HostRoot(host.root))
    code, doc = cli(host.root, "simulated:l4x2", "labels")
    assert code == 3 and "host driver version record" in doc["error"]


def _cap_space(*caps: tuple[int, int, int, bytes]) -> bytes:
    """A config space with the capability list ``caps``: (offset, ID, next, the bytes after those two)."""
    config = bytearray(256)
    config[0x06] = 0x10
    config[0x34] = caps[0][0] if caps else 0
    for offset, cap_id, nxt, rest in caps:
        data = bytes((cap_id, nxt)) + rest
        config[offset:offset + len(data)] = data
    return bytes(config)


def test_capability_walk_follows_nvidias_rules() -> None:
    vendor = bytes((0x0A,)) + b"VF" + bytes(5)  # length 10: ID, next, length, 'VF', 5 bytes
    power = bytes((0x08,))
    assert vendor_capability(_cap_space((0x40, 0x01, 0x50, power), (0x50, 0x09, 0x00, vendor))) == (
        bytes((0x09, 0x00)) + vendor)
    assert vendor_capability(_cap_space((0x40, 0x01, 0x40, power))) is None  # a looped chain
    assert vendor_capability(_cap_space((0x40, 0xFF, 0x50, power), (0x50, 0x09, 0, vendor))) is None  # broken
    no_list = bytearray(_cap_space((0x40, 0x09, 0x00, vendor)))
    no_list[0x06] = 0
    assert vendor_capability(bytes(no_list)) is None  # the status register says there is no list
    with pytest.raises(ValueError, match="64 bytes"):
        vendor_capability(bytes(64))


def test_host_driver_record_is_found_past_other_records() -> None:
    record0 = bytes((0x00, 22)) + b"535.161.08" + b"r535_00".ljust(10, b"\0")
    cap = bytes((0x09, 0x00, 0)) + b"VF" + bytes((0x05, 0x04, 0xAA, 0xBB)) + record0
    assert is_vgpu(cap) and host_driver(cap) == ("535.161.08", "r535_00")
    assert host_driver(cap[:-1]) is None  # the branch is cut short
    assert host_driver(bytes((0x09, 0, 0)) + b"VF" + bytes((0x05, 0x00))) is None  # a zero-length record
    assert not is_vgpu(bytes((0x09, 0, 0)) + b"XX")


# --- sharing from the device plugin's config --------------------------------------------------------

def _configs(tmp_path: Path, **named: str) -> Path:
    d = tmp_path / "configs"
    d.mkdir(exist_ok=True)
    for name, text in named.items():
        (d / name).write_text(text)
    return d


def _sharing_labels(labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels.get(f"nvidia.com/{k}", "-") for k in (
        "gpu.product", "gpu.replicas", "gpu.sharing-strategy", "mps.capable", "mig.strategy"))


def test_config_file_decides_the_sharing_labels(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    d = _configs(tmp_path, ts=TIME_SLICED, mps=TIME_SLICED.replace("timeSlicing", "mps"),
                 renamed=TIME_SLICED.replace("    resources:", "    renameByDefault: true\n    resources:"),
                 mixed="version: v1\nflags:\n  migStrategy: mixed\n")
    def run(name: str, *extra: str) -> dict[str, str]:
        labels: dict[str, str] = cli(host.root, "simulated:l4x2", "labels", "--no-timestamp",
                                     "--config-file", str(d / name), *extra)[1]["labels"]
        return labels

    assert _sharing_labels(run("ts")) == ("NVIDIA-L4-SHARED", "4", "time-slicing", "false", "-")
    assert _sharing_labels(run("mps")) == ("NVIDIA-L4-SHARED", "4", "mps", "true", "-")
    # Advertised as nvidia.com/gpu.shared: NVIDIA's GFD leaves -SHARED off (the resource is "renamed").
    assert _sharing_labels(run("renamed")) == ("NVIDIA-L4", "4", "time-slicing", "false", "-")
    assert _sharing_labels(run("mixed")) == ("NVIDIA-L4", "1", "none", "false", "mixed")
    assert _sharing_labels(run("mixed", "--mig-strategy", "none")) == ("NVIDIA-L4", "1", "none", "false", "-")


def test_sharing_flags_and_a_config_exclude_each_other(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    d = _configs(tmp_path, ts=TIME_SLICED)
    assert cli(host.root, "simulated:l4x2", "labels", "--config-file", str(d / "ts"), "--replicas", "2")[0] == 2
    assert cli(host.root, "simulated:l4x2", "labels", "--config-dir", str(d), "--sharing-strategy", "mps")[0] == 2
    bad = _configs(tmp_path, bad="version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: x\n")
    code, doc = cli(host.root, "simulated:l4x2", "labels", "--config-file", str(bad / "bad"))
    assert code == 3 and "replicas" in doc["error"]


def test_mixed_mig_resources_take_their_own_replicas(tmp_path: Path, cli: Cli) -> None:
    """NVIDIA's resource labeller looks each resource up in the config: a time-sliced MIG profile is shared,
    the full GPUs and the other profile are not."""
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    with open_nvml(NvmlBackend("simulated", "dgx-h100", host.machine.store.path)) as nvml:
        nvml.set_mig_mode(0, True)
        for profile_id in (19, 19, 9):  # two 1g.10gb, one 3g.40gb
            nvml.create_compute_instance(0, nvml.create_gpu_instance(0, profile_id).id)
    d = _configs(tmp_path, mixed="version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n"
                                 "    resources:\n    - name: nvidia.com/mig-1g.10gb\n      replicas: 3\n")
    _, doc = cli(host.root, H100, "labels", "--no-timestamp", "--config-file", str(d / "mixed"))
    labels = doc["labels"]
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert (labels["nvidia.com/mig-1g.10gb.product"], labels["nvidia.com/mig-1g.10gb.count"],
            labels["nvidia.com/mig-1g.10gb.replicas"], labels["nvidia.com/mig-1g.10gb.sharing-strategy"]) == (
        "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED", "2", "3", "time-slicing")
    assert (labels["nvidia.com/mig-3g.40gb.replicas"], labels["nvidia.com/mig-3g.40gb.sharing-strategy"]) == (
        "1", "none")
    assert _sharing_labels(labels) == ("NVIDIA-H100-80GB-HBM3", "1", "none", "false", "mixed")


def test_named_config_follows_the_node_label(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    """``--config-dir`` as the DaemonSet mounts it: the node label picks the config, the default without one;
    each run reads the label again, so the labels follow the plugin's switch."""
    host = build_fake_host(tmp_path, "l4x2")
    d = _configs(tmp_path, Exclusive="version: v1\n", TimeSlicing=TIME_SLICED)

    def run() -> tuple[str, ...]:
        code, doc = cli(host.root, "simulated:l4x2", "labels", "--no-timestamp", "--config-dir", str(d),
                        "--config-label", CONFIG_LABEL, "--default-config", "Exclusive", node=NODE,
                        kubeconfig=api_server.kubeconfig)
        assert code == 0, doc
        return _sharing_labels(doc["labels"])

    assert run() == ("NVIDIA-L4", "1", "none", "false", "-")
    api_server.set_labels(NODE, {CONFIG_LABEL: "TimeSlicing"})
    assert run() == ("NVIDIA-L4-SHARED", "4", "time-slicing", "false", "-")
    api_server.set_labels(NODE, {CONFIG_LABEL: "NoSuchConfig"})  # at start: the default, as the plugin does
    assert run() == ("NVIDIA-L4", "1", "none", "false", "-")


class _Label:
    def __init__(self, value: str | None) -> None:
        self.value = value

    def label(self) -> str | None:
        return self.value


def test_a_running_labeller_keeps_the_last_good_config(tmp_path: Path) -> None:
    d = _configs(tmp_path, Exclusive="version: v1\n", TimeSlicing=TIME_SLICED)
    label = _Label("TimeSlicing")
    source = SharingSource(ConfigSelector(config_dir=d, labels=label, default="Exclusive"))
    shared = Sharing(shared=(gfd.SharedResource(gfd.GPU, 4),))
    assert source.read() == (shared, None)
    label.value = "NoSuchConfig"  # relabelled to a config that does not exist: the plugin keeps its config
    sharing, warning = source.read()
    assert sharing == shared and warning is not None and "NoSuchConfig" in warning
    label.value = "TimeSlicing"
    (d / "TimeSlicing").write_text("version: v9\n")  # the mounted file changed to something unparsable
    sharing, warning = source.read()
    assert sharing == shared and warning is not None and "v9" in warning
    label.value = "Exclusive"
    assert source.read() == (Sharing(), None)


def test_no_config_at_all_fails_the_first_run(tmp_path: Path) -> None:
    source = SharingSource(ConfigSelector(config_dir=tmp_path / "empty", default="Exclusive"))
    with pytest.raises(HostError, match="Exclusive"):
        source.read()


def test_not_supported_means_no_fabric(tmp_path: Path) -> None:
    """NVML_ERROR_NOT_SUPPORTED (every GPU outside an NVLink fabric) is "no fabric", not a failed run."""
    host = build_fake_host(tmp_path, "dgx-h100")
    assert host.machine is not None
    host.machine.set_fabric(CLUSTER, 1)
    host.machine.fail_call(0, "nvmlDeviceGetGpuFabricInfo", 3)  # NVML_ERROR_NOT_SUPPORTED
    with open_nvml(NvmlBackend("simulated", "dgx-h100", host.machine.store.path)) as nvml:
        assert nvml.fabric_info(0) is None
