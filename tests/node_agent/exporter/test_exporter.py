"""The agent exporter on simulated machines: dcgm-exporter's names, units and labels, MIG devices as their
own series, pod labels from a PodResources stand-in in both allocation modes, NVIDIA's dashboard served.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from node_agent.cli import build_parser
from node_agent.cli.exporter import info_labels
from node_agent.dra.devices import mig_device_name
from node_agent.exporter import collector, counters, fields
from node_agent.exporter.holders import ContainerDevices, holders
from node_agent.exporter.service import MetricsService
from node_agent.kubelet.podresources.client import PodResourcesClient
from node_agent.nvml import NvmlBackend, open_nvml
from node_agent.nvml.xidwatch import XidRecorder
from nvgpu import dcgmcounters
from nvgpu.migparted import build_config
from nvgpu.stackconfig import GroupPlan, NodeGroup, load_stack_config
from nvidia_gpu.components.manifests import dashboards, monitoring
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvml_sim import SimulatedMachine
from nvml_sim.lib import MIG_MONITOR_ENV
from tests.kit.fakehost import build_fake_host, sim_state_file
from tests.kit.kubelet.common import short_root
from tests.kit.kubelet.podresources import Container, Pod, pod_resources
from tests.kit.tools import required_bin

REPO = Path(__file__).resolve().parents[3]
#: NVIDIA's dashboard and default counters, as the stack ships them (nvgpu/data; the same bytes as
#: dcgm-exporter's, tests/repo/test_vendored_data.py).
DASHBOARD = dcgmcounters.DATA_DIR / "dcgm-exporter-dashboard.json"
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


class Node:
    def __init__(self, root: Path, machine: str) -> None:
        self.services: list[MetricsService] = []
        self.root = root
        self.machine = machine
        self.backend = NvmlBackend("simulated", machine, sim_state_file(root, machine))
        self.sim = SimulatedMachine(machine, self.backend.state_file)

    def mig(self, layout: str, tmp: Path) -> None:
        config = tmp / "mig.yaml"
        config.write_text(build_config().to_yaml())
        done = subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(self.root), "--nvml",
                               f"simulated:{self.machine}", "mig", "apply", "--config", str(config), "--name", layout],
                              capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    def service(self, hostname: str = "node-a", **kw: Any) -> MetricsService:
        service = MetricsService(lambda: open_nvml(self.backend), kw.pop("selection", counters.default()), hostname,
                                 **kw)
        self.services.append(service)
        return service


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[Node]:
    node = Node(build_fake_host(tmp_path / "host", "dgx-h100").root, "dgx-h100")
    yield node
    for service in node.services:  # each holds an NVML session
        service.close()


def _samples(service: MetricsService) -> Iterator[tuple[str, dict[str, str], float]]:
    """``/metrics`` parsed by Prometheus's client parser: (name, labels, value) per sample, the name as
    Prometheus stores it, which is the TYPE line's (the parser adds ``_total`` to counter samples, and so
    to DCGM's ``*_TOTAL`` counters, where Prometheus does not)."""
    text = service.render().decode()
    assert re.search(r"^# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter$", text, re.M) or "ENERGY" not in text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):  # the client parser's creation stamps, not a served series
                continue
            yield (family.name if f"# TYPE {family.name} counter" in text else s.name), dict(s.labels), s.value


def scrape(service: MetricsService) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Name to (labels, value) samples of one scrape."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in _samples(service):
        out.setdefault(name, []).append((labels, value))
    return out


def test_every_field_is_served_per_gpu_in_dcgms_units_and_labels(dgx: Node) -> None:
    dgx.sim.set_telemetry(3, gpu_temp_c=71, power_mw=612_345, energy_mj=9_000_000, gpu_util=93, memory_util=41,
                          pcie_tx_kbps=2_000, ecc_dbe_volatile=2, remapped_uncorrectable=1, remap_failure=True,
                          clock_events=0x20)
    got = scrape(dgx.service())
    for name in counters.default().fields:
        if name == fields.XID_FIELD:
            continue
        assert len(got[name]) == 8, name
        assert all(set(labels) == DCGM_LABELS for labels, _ in got[name]), name
    def value(name: str, gpu: str = "3") -> float:
        return next(v for labels, v in got[name] if labels["gpu"] == gpu)
    assert value("DCGM_FI_DEV_GPU_TEMP") == 71 and value("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(612.345)
    assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 9_000_000 and value("DCGM_FI_DEV_GPU_UTIL") == 93
    assert value("DCGM_FI_DEV_MEM_COPY_UTIL") == 41 and value("DCGM_FI_PROF_PCIE_TX_BYTES") == 2_048_000
    assert value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 2 and value("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 1
    assert value("DCGM_FI_DEV_ROW_REMAP_FAILURE") == 1 and value("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == 0x20
    assert value("DCGM_FI_DEV_FB_USED") + value("DCGM_FI_DEV_FB_FREE") + value("DCGM_FI_DEV_FB_RESERVED") > 80_000
    labels = next(lb for lb, _ in got["DCGM_FI_DEV_GPU_TEMP"] if lb["gpu"] == "3")
    assert labels["device"] == "nvidia3" and labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["Hostname"] == "node-a" and re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", labels["pci_bus_id"])
    assert got["nvidia_gpu_exporter_gpus"] == [({"state": "ok", "Hostname": "node-a"}, 8),
                                              ({"state": "lost", "Hostname": "node-a"}, 0)]


def test_a_reading_the_board_does_not_support_is_left_out_not_zero(dgx: Node) -> None:
    with dgx.sim.store.mutate() as s:
        s.gpus[5].call_errors = {"nvmlDeviceGetEncoderUtilization": 3, "nvmlDeviceGetRemappedRows": 3}
    got = scrape(dgx.service())
    assert sorted(lb["gpu"] for lb, _ in got["DCGM_FI_DEV_ENC_UTIL"]) == [str(i) for i in range(8) if i != 5]
    assert "5" not in {lb["gpu"] for lb, _ in got["DCGM_FI_DEV_ROW_REMAP_FAILURE"]}
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 8


def test_a_lost_gpu_is_counted_and_the_others_served(dgx: Node) -> None:
    dgx.sim.lose_gpu(6)
    got = scrape(dgx.service())
    assert "6" not in {lb["gpu"] for lb, _ in got["DCGM_FI_DEV_GPU_TEMP"]} and len(got["DCGM_FI_DEV_GPU_TEMP"]) == 7
    assert ({"state": "lost", "Hostname": "node-a"}, 1) in got["nvidia_gpu_exporter_gpus"]


def test_mig_devices_are_series_of_their_own(dgx: Node, tmp_path: Path) -> None:
    """56 MIG devices on 8 GPUs: the framebuffer per instance (GPU_I_PROFILE, GPU_I_ID), nothing twice."""
    dgx.mig("all-1g.10gb", tmp_path)
    got = scrape(dgx.service())
    used = got["DCGM_FI_DEV_FB_USED"]
    assert len(used) == 56 and all(lb["GPU_I_PROFILE"] == "1g.10gb" for lb, _ in used)
    assert {(lb["gpu"], lb["GPU_I_ID"]) for lb, _ in used} == {(str(g), lb) for g in range(8)
                                                              for lb in {x["GPU_I_ID"] for x, _ in used}}
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 8 and "GPU_I_ID" not in got["DCGM_FI_DEV_GPU_TEMP"][0][0]


@pytest.fixture
def socket() -> Iterator[Path]:
    with short_root("exporter-") as root:
        yield root / "kubelet.sock"


def _attributed(service: MetricsService, name: str) -> dict[str, tuple[str, str, str] | None]:
    """Per series key (gpu or gpu/GI), the pod labels of ``name``'s series (None: not attributed)."""
    out: dict[str, tuple[str, str, str] | None] = {}
    for labels, _ in scrape(service)[name]:
        key = labels["gpu"] + (f"/{labels['GPU_I_ID']}" if "GPU_I_ID" in labels else "")
        out[key] = (labels["pod"], labels["namespace"], labels["container"]) if "pod" in labels else None
    return out


def test_pod_labels_for_whole_gpus_and_time_sliced_replicas(dgx: Node, socket: Path) -> None:
    with open_nvml(dgx.backend) as nvml:
        uuids = [str(g.uuid) for g in nvml.inventory().gpus]
    pods = [Pod("train", "ml", [Container("main", devices={"nvidia.com/gpu": [uuids[0], uuids[1]]})]),
            Pod("a", "web", [Container("srv", devices={"nvidia.com/gpu": [f"{uuids[4]}::0"]})]),
            Pod("b", "web", [Container("srv", devices={"nvidia.com/gpu": [f"{uuids[4]}::3"]})]),
            Pod("c", "web", [Container("srv", devices={"nvidia.com/gpu": [f"{uuids[5]}::1"]})])]
    with pod_resources(socket, pods):
        client = PodResourcesClient(str(socket))
        try:
            service = dgx.service(pod_resources=client.list)
            seen = _attributed(service, "DCGM_FI_DEV_GPU_UTIL")
            held = scrape(service)["nvidia_gpu_device_holder"]
        finally:
            client.close()
    assert seen["0"] == seen["1"] == ("train", "ml", "main")
    assert seen["4"] is None, "two pods share GPU 4: one series, no pod labels, so sums stay true"
    assert seen["5"] == ("c", "web", "srv"), "one replica held: its pod"
    assert seen["2"] is None
    assert sorted((lb["gpu"], lb["pod"]) for lb, _ in held) == [("0", "train"), ("1", "train"), ("4", "a"),
                                                               ("4", "b"), ("5", "c")]


def test_every_series_carries_the_labels_its_definition_declares(dgx: Node, socket: Path) -> None:
    """The metrics reference (docs/reference/metrics.md) lists each series' labels from its definition
    (``fields.FIELDS`` with the collector's label tuples, ``collector.SERIES``): a sample with a label the
    definition does not name would make the reference wrong."""
    with open_nvml(dgx.backend) as nvml:
        first = str(nvml.inventory().gpus[0].uuid)
    declared = {s.name: set(s.labels) for s in collector.SERIES}
    declared["nvidia_gpu_node_info"] |= {"node_group"}
    per_gpu = {*collector.GPU_LABELS, *collector.MIG_LABELS, *collector.POD_LABELS}
    with pod_resources(socket, [Pod("p", "ns", [Container("c", devices={"nvidia.com/gpu": [first]})])]):
        client = PodResourcesClient(str(socket))
        try:
            got = scrape(dgx.service(pod_resources=client.list, info={"node_group": "a"}))
        finally:
            client.close()
    assert {"nvidia_gpu_device_holder", "nvidia_gpu_node_info", "nvidia_gpu_exporter_gpus"} <= set(got)
    for name, samples in got.items():
        allowed = per_gpu if name in fields.FIELDS else declared[name]
        assert all(set(labels) <= allowed for labels, _ in samples), (name, samples[:1])


def test_pod_labels_for_mig_devices_and_dra_claims(dgx: Node, socket: Path, tmp_path: Path) -> None:
    dgx.mig("all-3g.40gb", tmp_path)
    with open_nvml(dgx.backend) as nvml:
        gpus = nvml.inventory().gpus
    g0, g1 = gpus[0], gpus[1]

    m1 = g1.mig_devices[1]
    pods = [Pod("mig-dp", "ml", [Container("c", devices={"nvidia.com/mig-3g.40gb": [str(g0.mig_devices[0].uuid)]})]),
            Pod("mig-dra", "ml", [Container("c", claims=[("mig", "ml", [("gpu.nvidia.com", "node-a", mig_device_name(
                g1.minor, m1.profile, m1.gi_profile_id, m1.placement.start))])])]),
            Pod("other-driver", "ml", [Container("c", claims=[("x", "ml", [("example.com", "p", "gpu-2")])])])]
    with pod_resources(socket, pods):
        client = PodResourcesClient(str(socket))
        try:
            seen = _attributed(dgx.service(pod_resources=client.list), "DCGM_FI_DEV_FB_USED")
        finally:
            client.close()
    assert seen[f"0/{g0.mig_devices[0].gi_id}"] == ("mig-dp", "ml", "c")
    assert seen[f"1/{m1.gi_id}"] == ("mig-dra", "ml", "c")
    assert seen[f"0/{g0.mig_devices[1].gi_id}"] is None
    assert {k for k, v in seen.items() if v} == {f"0/{g0.mig_devices[0].gi_id}", f"1/{m1.gi_id}"}


def test_whole_gpu_dra_claims_map_to_their_gpu(dgx: Node) -> None:
    with open_nvml(dgx.backend) as nvml:
        gpus = nvml.inventory().gpus
    found = holders([ContainerDevices("p", "ns", "c", (), (("gpu.nvidia.com", "node-a", "gpu-3"),))], gpus,
                    dra_driver="gpu.nvidia.com")
    assert found.sole(str(next(g for g in gpus if g.minor == 3).uuid)) is not None


def test_pod_labels_go_while_kubelet_is_down_and_come_back(dgx: Node, socket: Path) -> None:
    with open_nvml(dgx.backend) as nvml:
        first = str(nvml.inventory().gpus[0].uuid)
    with pod_resources(socket, [Pod("p", "ns", [Container("c", devices={"nvidia.com/gpu": [first]})])]) as kubelet:
        client = PodResourcesClient(str(socket), timeout_s=1)
        try:
            service = dgx.service(pod_resources=client.list)
            assert _attributed(service, "DCGM_FI_DEV_GPU_TEMP")["0"] == ("p", "ns", "c")
            kubelet.down = True
            got = scrape(service)
            assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 8 and "pod" not in got["DCGM_FI_DEV_GPU_TEMP"][0][0]
            assert ({"stage": "pod-resources"}, 1) in got["nvidia_gpu_exporter_failures_total"]
            kubelet.down = False
            assert _attributed(service, "DCGM_FI_DEV_GPU_TEMP")["0"] == ("p", "ns", "c")
        finally:
            client.close()


def test_nvml_going_away_is_counted_and_the_next_scrape_reopens(dgx: Node) -> None:
    """A driver reload: the open session's GPUs answer lost, NVML cannot start while the driver is out,
    then it is back; the exporter follows without a restart."""
    service = dgx.service()
    assert len(scrape(service)["DCGM_FI_DEV_GPU_TEMP"]) == 8

    def lost(yes: bool) -> None:
        with dgx.sim.store.mutate() as s:
            for g in s.gpus:
                g.lost = yes

    lost(True)
    dgx.sim.fail_init()
    gone = scrape(service)
    assert "DCGM_FI_DEV_GPU_TEMP" not in gone
    assert ({"state": "lost", "Hostname": "node-a"}, 8) in gone["nvidia_gpu_exporter_gpus"]
    broken = scrape(service)  # the session was closed: opening NVML fails now
    assert ({"stage": "nvml"}, 1) in broken["nvidia_gpu_exporter_failures_total"] and not service.live()
    assert "nvidia_gpu_exporter_scrape_duration_seconds" not in broken
    lost(False)
    dgx.sim.fail_init(None)
    assert len(scrape(service)["DCGM_FI_DEV_GPU_TEMP"]) == 8 and service.live()


def _dashboard_metrics() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("expr", "query", "definition") and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(o, list):
            for x in o:
                walk(x)

    walk(board)
    return {m for e in exprs for m in re.findall(r"\b(DCGM_[A-Z0-9_]+)\b", e)}


def test_nvidias_dashboard_finds_its_metrics_and_labels(dgx: Node) -> None:
    """Every metric NVIDIA's dashboard queries is served, with the ``gpu`` label its variables use, except
    the one DCGM profiling counter NVML has no reading for (listed, with the reason)."""
    wanted = _dashboard_metrics()
    got = scrape(dgx.service())
    missing = wanted - set(got)
    assert missing == {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} and missing <= set(fields.NOT_FROM_NVML)
    assert all("gpu" in labels for name in wanted - missing for labels, _ in got[name])


def test_nvidias_default_counters_file_is_read_and_what_nvml_cannot_give_is_named() -> None:
    sel = counters.parse(dcgmcounters.default_text(), "default-counters.csv")
    assert "DCGM_FI_DEV_GPU_UTIL" in sel.fields and "DCGM_FI_PROF_PCIE_TX_BYTES" in sel.fields
    not_served = {re.search(r"(DCGM_\w+) is not served", w).group(1) for w in sel.warnings}  # type: ignore[union-attr]
    assert not_served == {"DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                          "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                          "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"}


@pytest.mark.parametrize(("text", "message"), [
    ("DCGM_FI_DEV_GPU_TEMP gauge temp\n", "line 1: 'DCGM_FI_DEV_GPU_TEMP gauge temp' is not 'DCGM_FIELD, type, help'"),
    ("# c\nDCGM_FI_DEV_GPU_TEMP, gague, temp\n", "line 2: type 'gague' of DCGM_FI_DEV_GPU_TEMP is not one of"),
    ("DCGM_FI_DEV_GPU_TEMPERATURE, gauge, t\n", "line 1: 'DCGM_FI_DEV_GPU_TEMPERATURE' is not a DCGM field"),
    ("# nothing\n", "no field listed"),
    ("DCGM_FI_DEV_MEMORY_TEMP, gauge, t\n", "no field to serve"),
])
def test_a_bad_counters_file_is_an_error_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(counters.CountersError, match=re.escape(message)):
        counters.parse(text, "counters.csv")


# --- the dashboards over a live scrape, evaluated by Prometheus's own engine -------------------------------


def _promql_labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))


def _as_series(service: MetricsService, target: dict[str, str], minutes: int) -> list[dict[str, str]]:
    """One scrape of ``service`` as promtool input series, constant for ``minutes``, with the target labels
    the stack's monitor adds (``job``, ``instance``, and its relabelings' ``node`` and ``node_group``)."""
    out = []
    for name, own, value in _samples(service):
        labels = {**target, **own}  # honorLabels: the exporter's own win
        out.append({"series": f"{name}{{{_promql_labels(labels)}}}", "values": f"{value}x{minutes}"})
    return out


def _monitor_target(node: str, group: NodeGroup, cluster: Any) -> dict[str, str]:
    """The labels Prometheus gives a scrape of the group's exporter pod on ``node`` under the stack's
    PodMonitor: its relabelings read the pod's node name and its node-group label."""
    plan = GroupPlan.of(cluster, group)
    ds = monitoring.exporter_daemonset(GroupContext(namespace="nvidia-gpu", cluster=cluster, group=group, plan=plan))
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    meta = {"__meta_kubernetes_pod_node_name": node}
    meta |= {"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in pod_labels.items()}
    (target,) = [t for t in monitoring.targets(cluster, [group], {group.name: plan}) if t.component == "gpu-exporter"]
    endpoint = monitoring.monitor("nvidia-gpu", cluster, target)["spec"]["podMetricsEndpoints"][0]
    out = {"job": target.component, "instance": f"10.0.0.1:{target.port}"}
    for r in endpoint["relabelings"]:
        out[r["targetLabel"]] = ";".join(meta.get(s, "") for s in r["sourceLabels"])
    return out


def _exporter_info(group: NodeGroup, cluster: Any) -> dict[str, str]:
    """The ``--info`` labels the group's rendered exporter command line passes (nvidia_gpu_node_info)."""
    ds = monitoring.exporter_daemonset(GroupContext(namespace="nvidia-gpu", cluster=cluster, group=group,
                                                    plan=GroupPlan.of(cluster, group)))
    argv = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    args = build_parser("exporter").parse_args(argv)
    return dict(info_labels(args.info))


def test_the_dashboards_answer_over_a_live_scrape(dgx: Node, socket: Path, tmp_path: Path) -> None:
    """Every query of the fleet dashboard, and of NVIDIA's (its variables set as Grafana does for "All"),
    evaluated by ``promtool test rules`` over a scrape of two simulated DGX H100s under the stack's
    PodMonitor: one with whole GPUs held by pods and an XID raised, one in all-1g.10gb MIG. Each query
    returns series, and the fleet panels give the numbers the two nodes imply."""
    config = load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "monitoring": {"scrape": "podMonitor"},
                    "agentImage": {"repository": "registry.example.com/agent", "tag": "1.0.0"}},
        "nodeGroups": [
            {"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}}, "gpu": {"model": "H100-80GB"}},
            {"name": "h100-mig", "nodeSelector": {"matchLabels": {"pool": "h100-mig"}},
             "gpu": {"model": "H100-80GB", "sharing": "MIG", "mig": {"partedConfig": "all-1g.10gb"}}},
        ]})
    whole, migs = config.node_groups

    # The counters the stack's ConfigMap hands the exporters (NVIDIA's default plus the alerts' fields).
    deployed = counters.parse(monitoring.counters_text(config.cluster.monitoring), source="the counters ConfigMap")
    mig_node = Node(build_fake_host(tmp_path / "mig-host", "dgx-h100").root, "dgx-h100")
    mig_node.mig("all-1g.10gb", tmp_path)
    with open_nvml(dgx.backend) as nvml:
        uuids = [str(g.uuid) for g in nvml.inventory().gpus]
    pods = [Pod("train", "ml", [Container("main", devices={"nvidia.com/gpu": [uuids[0], uuids[1]]})]),
            Pod("a", "web", [Container("srv", devices={"nvidia.com/gpu": [f"{uuids[4]}::0"]})])]
    recorder = XidRecorder(lambda: open_nvml(dgx.backend), lambda: None)
    recorder.start()
    series: list[dict[str, str]] = []
    try:
        assert recorder.wait_watching(10)
        dgx.sim.inject_xid(3, 48)
        deadline = time.monotonic() + 5
        while not recorder.counts() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pod_resources(socket, pods):
            client = PodResourcesClient(str(socket))
            try:
                live = dgx.service(selection=deployed, pod_resources=client.list, xids=recorder,
                                   info=_exporter_info(whole, config.cluster))
                series += _as_series(live, _monitor_target("node-a", whole, config.cluster), 70)
            finally:
                client.close()
        series += _as_series(mig_node.service("node-b", selection=deployed, info=_exporter_info(migs, config.cluster)),
                             _monitor_target("node-b", migs, config.cluster), 70)
    finally:
        recorder.stop()
        for service in mig_node.services:
            service.close()
    # What kube-state-metrics adds for the two nodes' kubelets.
    series += [{"series": 'kube_node_status_allocatable{node="node-a",resource="nvidia_com_gpu"}', "values": "8x70"},
               {"series": 'kube_node_status_allocatable{node="node-b",resource="nvidia_com_mig_1g_10gb"}',
                "values": "56x70"}]

    fleet = dashboards.queries(dashboards.fleet_dashboard())
    board = json.loads(DASHBOARD.read_text())
    gpus = "|".join(str(i) for i in range(8))
    nvidia = [q.replace("$instance", ".*").replace("$gpu", f"({gpus})") for q in dashboards.queries(board)
              if "label_values" not in q and "DCGM_FI_PROF_" not in q]  # the profiling counter NVML lacks
    # absent() of each query is an alert that must not fire: the query returned series.
    queries = fleet + nvidia
    rules = {"groups": [{"name": "queries", "rules": [
        {"alert": f"Q{i}", "expr": f"absent({q})", "labels": {"query": str(i)}} for i, q in enumerate(queries)]}]}
    expected = {
        "count by (node_group) (DCGM_FI_DEV_GPU_TEMP)": [{"labels": '{node_group="h100"}', "value": 8},
                                                         {"labels": '{node_group="h100-mig"}', "value": 8}],
        "count by (node_group) (count by (node_group, Hostname, gpu) (nvidia_gpu_device_holder))":
            [{"labels": '{node_group="h100"}', "value": 3}],
        "count by (node_group, sharing, allocation_mode) (nvidia_gpu_node_info)": [
            {"labels": '{allocation_mode="devicePlugin",node_group="h100",sharing="Exclusive"}', "value": 1},
            {"labels": '{allocation_mode="devicePlugin",node_group="h100-mig",sharing="MIG"}', "value": 1}],
        'count by (Hostname, GPU_I_PROFILE) (DCGM_FI_DEV_FB_USED{GPU_I_PROFILE!=""})':
            [{"labels": '{GPU_I_PROFILE="1g.10gb",Hostname="node-b"}', "value": 56}],
        'sum by (Hostname, class) (increase(nvidia_gpu_xid_errors_total[1h]))':
            [{"labels": '{Hostname="node-a",class="device"}', "value": 0}],
    }
    assert set(expected) <= set(fleet), set(expected) - set(fleet)
    tests = {"rule_files": ["queries.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [{"eval_time": "65m", "alertname": f"Q{i}", "exp_alerts": []}
                            for i in range(len(queries))],
        "promql_expr_test": [{"expr": q, "eval_time": "65m", "exp_samples": s} for q, s in expected.items()],
    }]}
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([str(required_bin("promtool") / "promtool"), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, "\n".join([*(f"Q{i}: {q}" for i, q in enumerate(queries)), done.stdout,
                                            done.stderr])


def test_mig_gpus_without_the_monitor_capability_keep_their_series_and_say_what_is_missing(
        dgx: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPUs 2 and 5 in MIG mode, read by an exporter without the MIG monitor capability: NVML refuses their
    memory and MIG devices (NO_PERMISSION, NVIDIA/k8s-device-plugin#1683). They stay served (8 GPUs, none
    lost) and ``nvidia_gpu_exporter_unreadable`` names what is missing; with the capability nothing is."""
    monkeypatch.delenv(MIG_MONITOR_ENV, raising=False)
    with open_nvml(dgx.backend) as nvml:
        for index in (2, 5):
            nvml.set_mig_mode(index, True)
            gi = nvml.create_gpu_instance(index, 9)  # 3g.40gb
            nvml.create_compute_instance(index, gi.id)
    dgx.sim.require_mig_monitor()
    got = scrape(dgx.service())
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 8
    assert ({"state": "ok", "Hostname": "node-a"}, 8) in got["nvidia_gpu_exporter_gpus"]
    assert sorted((lb["gpu"], lb["what"]) for lb, _ in got["nvidia_gpu_exporter_unreadable"]) == [
        ("2", "MIG devices"), ("2", "memory"), ("5", "MIG devices"), ("5", "memory")]
    monkeypatch.setenv(MIG_MONITOR_ENV, "all")
    got = scrape(dgx.service("node-b"))
    assert "nvidia_gpu_exporter_unreadable" not in got
    assert sorted(lb["gpu"] for lb, _ in got["DCGM_FI_DEV_FB_USED"] if "GPU_I_ID" in lb) == ["2", "5"]
