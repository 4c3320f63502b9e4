"""The agent against NVIDIA's model of the hardware, and our simulator against the same model.

``tools/mocknvml`` builds ``libnvidia-ml.so.1``: NVML's C ABI over go-nvml's mock DGX machines
(NVIDIA's own Go models; k8s-test-infra's ready-made mock library is refused by the module proxy).
Each machine runs twice: the agent with ``--nvml real`` and the library on ``LD_LIBRARY_PATH`` (a
subprocess: the loader reads the path when the process starts, and the library's Go runtime stays
out of pytest), and the agent with ``--nvml simulated:<machine>`` on the simulated machine that
models the same server. ``check``, ``labels``, the device plugin's device list, the DRA driver's
devices and MIG profiles must agree wherever both model the same fact.

Where they legitimately differ it is spelled out below (``EXPECTED``): NVIDIA's mock uses random
UUIDs, PCI bus IDs ``0000:<index>:00.0``, round MiB sizes and idealised H100 SM counts, a ``Mock``
prefix on the A100 name, profile IDs equal to the profile enum, and models no NUMA node, topology,
events, processes or MIG device handles. Where they disagree about NVML's behaviour or the hardware
the simulator was checked against nvml.h, real-GPU data (shared/reference) and NVIDIA's tables, and
fixed where it was wrong: profile enums past the end are INVALID_ARGUMENT (``test_error_codes``),
MIG engine counts come from NVIDIA's tables (``test_mig_profiles_agree``).

The library comes from ``tools/build.sh`` (``localcluster.tools_bin()``); without it the tests skip,
unless ``NVIDIA_GPU_REQUIRE_CLUSTER=1`` (``make test``, CI), which turns the skip into a failure.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from node_agent.deviceplugin.config import Settings
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices, to_gpu
from node_agent.deviceplugin.resources import build_resources
from node_agent.dra.devices import Inventory, allocatable_devices, quantity_value, semver
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.exporter import counters, fields
from node_agent.exporter.service import MetricsService
from node_agent.host import HostRoot
from node_agent.nvml import MigMode, NvmlBackend, NvmlError, open_nvml
from nvml_sim import provider
from nvml_sim.lib import FakeNvmlLibrary
from nvml_sim.state import SimStore
from tests.kit.fakehost import build_fake_host, sim_state_file
from tests.kit.mockhost import mock_env, mock_host, probe_mock
from tests.kit.tools import required_bin

#: NVIDIA's mock NVML (go-nvml's machines behind NVML's C ABI, built by make tools): the compare tier.
pytestmark = pytest.mark.compare

REPO = Path(__file__).resolve().parents[2]
LIBRARY = "libnvidia-ml.so.1"
MIG_1_SLICE = 0  # NVML_GPU_INSTANCE_PROFILE_1_SLICE
NO_SUCH_UUID = "GPU-00000000-0000-0000-0000-000000000000"


@dataclasses.dataclass(frozen=True)
class Pair:
    mock: str  #: MOCK_NVML_MACHINE
    sim: str  #: our simulated machine of the same server


#: The sensor and counter calls the metrics exporter makes (``NvmlSession.telemetry``), which go-nvml's mock
#: machines do not model.
TELEMETRY_CALLS = frozenset({
    "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrentClocksEventReasons"})

PAIRS = (Pair("dgxa100", "dgx-a100-40gb"), Pair("dgxh100", "dgx-h100"), Pair("dgxh200", "hgx-h200"))

#: Facts both sides model but state differently, as (mock, simulator), and why the simulator keeps its value.
EXPECTED: dict[str, dict[str, tuple[Any, Any]]] = {
    # The mock names its A100 "Mock NVIDIA ..."; real A100s report "NVIDIA A100-SXM4-40GB".
    "dgxa100": {"name": ("Mock NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB")},
    # Real H100 SXM5 boards report 81559 MiB (catalogue: from nvidia-smi); the mock rounds to 80 GiB.
    "dgxh100": {"memory_mib": (81920, 81559)},
    # Real H200 SXM: "NVIDIA H200", 143771 MiB, PCI device 0x2335 (mig-parted's device filter); the mock
    # invents a longer name, 141 GiB and 0x2333.
    "dgxh200": {"name": ("NVIDIA H200 141GB HBM3e", "NVIDIA H200"), "memory_mib": (144384, 143771),
                "pci_device_id": (0x2333, 0x2335)},
}

#: MIG profile fields that differ, by machine: the mock's H100/H200 tables are idealised (16 SMs per
#: slice, 10 GiB per 1g on H100), the catalogue's come from a real ``nvidia-smi mig -lgip`` dump
#: (shared/reference). Profile ``id`` differs everywhere: the mock sets id = enum, NVML's ids differ
#: from the enum (7g=0, 4g=5, 3g=9, 2g=14, 1g.2x=15, 1g=19, 1g+me=20); ``name`` follows from the id.
PROFILE_DIFFS: dict[str, set[str]] = {
    "dgxa100": {"id", "name"},
    "dgxh100": {"id", "name", "memory_mib", "multiprocessors"},
    "dgxh200": {"id", "name", "multiprocessors"},
}
#: Hopper's whole-GPU profile: the mock gives it no JPEG/OFA engine, the simulator keeps one of each
#: (H100/H200 have NVJPG and OFA engines; the mock's zeros look like an omission, unverified).
HOPPER_FULL_GPU = {"jpegs": (0, 1), "ofas": (0, 1)}
#: Placements are in memory slices (nvml.h: "a created GPU instance occupies memory slices described by
#: its placement"), as the mock's own A100 table has them. Its H100/H200 tables size 3g (4 memory
#: slices), 7g (8) and 1g.2x-memory (2, at 0/2/4/6) in compute slices instead: the simulator keeps
#: memory slices. Enums: 2 = 3_SLICE, 4 = 7_SLICE, 9 = 1_SLICE_REV2.
HOPPER_PLACEMENTS_IN_COMPUTE_SLICES = {"2", "4", "9"}

_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_NVML_BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


# -- the probes: run inside the subprocess, against whichever NVML the process loaded ----------------

def probe_main() -> None:
    """``python -c '...; probe_main()' ROOT NVML WHAT``: print one probe's JSON result."""

    provider.register()  # a process of its own: the simulated side's machines, as the CLI registers them
    root, spec, what = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    machine = spec.partition(":")[2]
    # The same state file the CLI uses under a host root, so probes and commands see one machine.
    backend = NvmlBackend.parse(spec, sim_state_file(root, machine) if machine else None)
    probes: dict[str, Callable[[Path, Any], dict[str, Any]]] = {
        "nvml": _probe_nvml, "mig": _probe_mig, "errors": _probe_errors, "metrics": _probe_metrics}
    print(json.dumps(probes[what](root, backend), sort_keys=True))


def _try(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except NvmlError as e:
        return {"error": type(e).__name__, "code": e.code}


def _probe_nvml(root: Path, backend: Any) -> dict[str, Any]:
    """What check/labels do not print: the inventory, profiles, device-plugin and DRA device lists."""

    with open_nvml(backend) as s:
        driver = s.driver()
        inv = s.inventory()
        profiles = s.gpu_instance_profiles(0)
        placements = {str(p.profile): [[x.start, x.size] for x in s.possible_placements(0, p.id)] for p in profiles}
        # The plugin's own NodeDevices: inventory, topology and an event watcher, as at plugin start.
        node_devices = _try(lambda: NvmlNodeDevices(s).close())
    host = HostRoot(root)
    resources = build_resources([to_gpu(g) for g in inv.gpus], Settings(), host)
    cuda = f"{driver.cuda_driver_version[0]}.{driver.cuda_driver_version[1]}"
    # The DRA driver's GPU mapping (NvmlInventorySource._gpu) on this inventory, then its own snapshot().
    mapped = Inventory(driver.driver_version, cuda, gpus=tuple(NvmlInventorySource._gpu(g) for g in inv.gpus))
    source = NvmlInventorySource(backend, host)
    try:
        snapshot = source.snapshot()
    finally:
        source.close()
    return {
        "driver": [driver.driver_version, cuda],
        "gpus": [dataclasses.asdict(g) for g in inv.gpus],
        "lost": len(inv.lost),
        "profiles": [dataclasses.asdict(p) for p in profiles],
        "placements": placements,
        "nodeDevices": node_devices,
        "resources": [{"name": r.name, "devices": [
            {"id": d.id, "index": d.index, "paths": list(d.paths), "numa": d.numa_node, "memoryMib": d.memory_mib}
            for d in r.devices]} for r in resources],
        "dra": [d.to_api() for d in allocatable_devices(mapped)],
        "draSnapshotGpus": len(snapshot.gpus),
    }


def _probe_metrics(root: Path, backend: Any) -> dict[str, Any]:
    """One scrape of the metrics exporter: metric name to the label sets of its series."""

    service = MetricsService(lambda: open_nvml(backend), counters.default(), "node-a")
    try:
        text = service.render().decode()
    finally:
        service.close()
    out: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} ", line)
        if m:
            out.setdefault(m.group(1), []).append(sorted(re.findall(r'(\w+)="', m.group(2))))
    return out


def _probe_mig(root: Path, backend: Any) -> dict[str, Any]:
    """MIG behaviour on GPU 0: mode switch, GPU and compute instances, MIG devices, mode switch back."""
    def mode(m: MigMode | None) -> list[bool] | None:
        return None if m is None else [m.current, m.pending]

    out: dict[str, Any] = {}
    with open_nvml(backend) as s:
        out["before"] = mode(s.mig_mode(0))
        out["enable"] = mode(s.set_mig_mode(0, True))
        one = next(p for p in s.gpu_instance_profiles(0) if p.profile == MIG_1_SLICE)
        out["create"] = _try(lambda: dataclasses.asdict(s.create_gpu_instance(0, one.id)))
        out["createAt2"] = _try(lambda: dataclasses.asdict(s.create_gpu_instance(0, one.id, start=2)))
        out["instances"] = _try(lambda: [dataclasses.asdict(g) for g in s.gpu_instances(0)])
        out["remaining"] = _try(lambda: s.remaining_capacity(0, one.id))
        gi = out["create"].get("ok", {}).get("id", 0)
        out["computeInstance"] = _try(lambda: dataclasses.asdict(s.create_compute_instance(0, gi)))
        out["migDevices"] = _try(lambda: [len(s.gpu(0).mig_devices)])
        # A GPU NVML cannot fully read is left out of the inventory; the others stay.
        inv = s.inventory()
        out["inventory"] = {"gpus": [g.index for g in inv.gpus], "lost": [lost.index for lost in inv.lost]}
        # Compute-instance profile arguments NVML must reject (nvml.h: INVALID_ARGUMENT for both).
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        gis = (pynvml.c_nvmlGpuInstance_t * one.instance_count)()
        count = ctypes.c_uint(len(gis))
        pynvml.nvmlDeviceGetGpuInstances(h, one.id, gis, ctypes.byref(count))
        out["ciProfile(COUNT)"] = _code(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gis[0],
                                        pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT, 0, 1)
        out["ciProfile(engine 1)"] = _code(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gis[0], 0, 1, 1)
        out["disableWithInstances"] = _try(lambda: mode(s.set_mig_mode(0, False)))
    return out


def _code(fn: Callable[..., Any], *args: Any) -> int:
    try:
        fn(*args)
    except pynvml.NVMLError as e:
        return int(e.value)
    return 0


def _probe_errors(root: Path, backend: Any) -> dict[str, Any]:
    """NVML return codes for the calls and arguments whose answers nvml.h defines."""
    with open_nvml(backend) as s:
        n = s.device_count()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        small = ctypes.create_string_buffer(4)
        by_uuid = pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(h))
        codes = {
            "handleByIndex(count)": _code(pynvml.nvmlDeviceGetHandleByIndex, n),
            "handleByUUID(unknown)": _code(pynvml.nvmlDeviceGetHandleByUUID, NO_SUCH_UUID),
            "handleByUUID(own) is the same handle": int(ctypes.cast(by_uuid, ctypes.c_void_p).value
                                                         == ctypes.cast(h, ctypes.c_void_p).value),
            "name(4-byte buffer)": int(pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")(h, small, ctypes.c_uint(4))),
            "giProfile(8_SLICE)": _code(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h,
                                        pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE, 1),
            "giProfile(COUNT)": _code(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h,
                                      pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT, 1),
            "numaNode": _code(pynvml.nvmlDeviceGetNumaNodeId, h),
        }
        pynvml.nvmlShutdown()
        codes["deviceCount after shutdown"] = _code(pynvml.nvmlDeviceGetCount)
        pynvml.nvmlInit()
    return codes


# -- running the agent --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mock_bin() -> Path:
    """The tools bin directory holding the mock ``libnvidia-ml.so.1`` (built by ``make tools``)."""
    return required_bin(LIBRARY)


@dataclasses.dataclass
class Side:
    """One NVML peer's answers for one machine."""

    nvml: str
    root: Path
    env: dict[str, str]
    probe: dict[str, Any] = dataclasses.field(default_factory=dict)
    check: dict[str, Any] = dataclasses.field(default_factory=dict)
    labels: dict[str, Any] = dataclasses.field(default_factory=dict)
    errors: dict[str, Any] = dataclasses.field(default_factory=dict)
    mig: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)

    def run(self, *args: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run(args, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120, check=False)
        try:
            return done.returncode, json.loads(done.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"{args[1:]} (rc {done.returncode}): {done.stdout}\n{done.stderr}") from None

    def agent(self, *args: str) -> tuple[int, dict[str, Any]]:
        return self.run(sys.executable, "-m", "node_agent", "--host-root", str(self.root), "--nvml", self.nvml,
                        "--json", *args)

    def run_probe(self, what: str) -> dict[str, Any]:
        code = "from tests.compare.test_mock_nvml import probe_main; probe_main()"
        rc, doc = self.run(sys.executable, "-c", code, str(self.root), self.nvml, what)
        assert rc == 0, doc
        return doc

    def collect(self) -> None:
        """Every answer, MIG last: it changes the machine (the simulator's state file persists)."""
        self.check = self.agent("check", "--phase", "host", "--no-record")[1]
        rc, self.labels = self.agent("labels", "--no-timestamp")
        assert rc == 0, self.labels
        self.probe = self.run_probe("nvml")
        self.errors = self.run_probe("errors")
        self.metrics = self.run_probe("metrics")
        self.mig = self.run_probe("mig")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "MOCK_NVML_MACHINE")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


@pytest.fixture(scope="module", params=PAIRS, ids=[p.mock for p in PAIRS])
def pair(request: pytest.FixtureRequest, mock_bin: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Pair, Side, Side]:
    """(machine, NVIDIA's mock, our simulator): every command run once on each."""
    p: Pair = request.param
    env = mock_env(mock_bin, p.mock)
    # First ask the mock what it models (on an empty root), then lay out a host that matches it.
    bare = Side("real", tmp_path_factory.mktemp(f"{p.mock}-bare"), env).run_probe("nvml")
    mock = Side("real", tmp_path_factory.mktemp(f"{p.mock}-host"), env)
    mock_host(mock.root, bare)
    mock.collect()
    sim_root = tmp_path_factory.mktemp(f"{p.sim}-host")
    build_fake_host(sim_root, p.sim)
    sim = Side(f"simulated:{p.sim}", sim_root, _env())
    sim.collect()
    return p, mock, sim


# -- the comparisons ----------------------------------------------------------------------------------

def _expected(p: Pair, field: str, mock_value: Any, sim_value: Any) -> bool:
    """Both sides agree on ``field``, or differ exactly as EXPECTED documents."""
    return mock_value == sim_value or EXPECTED.get(p.mock, {}).get(field) == (mock_value, sim_value)


def test_library_exports_what_the_agent_calls(mock_bin: Path) -> None:
    """The library loads under dlopen(RTLD_NOW) and exports every NVML symbol the simulator offers
    nvidia-ml-py, except those deliberately left out (the mock models no such call)."""

    names = sorted(FakeNvmlLibrary(SimStore("dgx-h100"))._table)
    code = ("import ctypes, json, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "print(json.dumps([n for n in sys.argv[2:] if not hasattr(lib, n)]))")
    done = subprocess.run([sys.executable, "-c", code, str(mock_bin / LIBRARY), *names], capture_output=True,
                          text=True, check=True, timeout=60)
    # v1 profile calls only (the mock has no profile names), no v2 memory struct (the agent reads v1),
    # only the _v3 process listings (the agent falls back to _v2 and the unversioned ones on drivers older
    # than 510.39), no NVLink fabric (the mock models none: the agent then publishes no clique), no sensors
    # or counters (go-nvml's mock machines model none: the exporter leaves those series out, as it does on a
    # board or driver without them; test_the_exporter_serves_what_the_mock_models), no virtualization mode
    # (the agent then reads it as unknown and check compares no declared driver type with it), no board
    # identity or modes (serial, VBIOS, persistence and compute mode: `diagnose` keeps an error in their
    # place, and `mps-daemon` and `vfio bind` refuse with NVML's answer), and none of the recovery reads
    # beside row remapping (field values, pending retired pages: the device plugin then lets the quiet
    # period alone decide, as on a driver before 565).
    assert set(json.loads(done.stdout)) == {
        "nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
        "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetVirtualizationMode", "nvmlDeviceGetSerial", "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetPersistenceMode", "nvmlDeviceSetPersistenceMode", "nvmlDeviceGetComputeMode",
        "nvmlDeviceSetComputeMode", "nvmlDeviceGetFieldValues", "nvmlDeviceGetRetiredPagesPendingStatus",
        *TELEMETRY_CALLS}


def test_the_exporter_serves_what_the_mock_models(pair: tuple[Pair, Side, Side]) -> None:
    """On NVIDIA's mock the exporter serves the framebuffer of all 8 GPUs with dcgm-exporter's labels and
    leaves out, not zeroes, the sensors the mock does not model; on the simulator every default field."""
    _, mock, sim = pair
    dcgm = sorted(["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"])
    for side in (mock, sim):
        for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
            assert side.metrics[name] == [dcgm] * 8, (side.nvml, name)
    assert not {f for f in fields.FIELDS if f in mock.metrics} - {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}
    assert {f for f in counters.default().fields if f != fields.XID_FIELD} <= set(sim.metrics)


def test_nvml_inventory_agrees(pair: tuple[Pair, Side, Side]) -> None:
    """Same GPU count, names, memory, PCI device, compute capability, architecture, minors and MIG
    capability; UUIDs and bus IDs in NVML's formats on both sides; what only the simulator models
    (NUMA node, subsystem ID, real bus addresses) is absent on the mock, not made up."""
    p, mock, sim = pair
    mg, sg = mock.probe["gpus"], sim.probe["gpus"]
    assert len(mg) == len(sg) == 8 and mock.probe["lost"] == sim.probe["lost"] == 0
    for field in ("name", "memory_mib", "pci_device_id", "compute_capability", "architecture", "minor",
                  "index", "mig_mode", "mig_devices"):
        for m, s in zip(mg, sg, strict=True):
            assert _expected(p, field, m[field], s[field]), (field, m[field], s[field])
    for g in mg + sg:
        assert _UUID.match(g["uuid"]) and _NVML_BUS_ID.match(g["pci_bus_id"]), g
    assert len({g["uuid"] for g in mg}) == 8  # random, but distinct and stable within the process
    assert [g["pci_bus_id"] for g in mg] == [f"00000000:{i:02X}:00.0" for i in range(8)]
    assert {g["numa_node"] for g in mg} == {None} and {g["pci_subsystem_id"] for g in mg} == {0}
    assert {g["numa_node"] for g in sg} == {0, 1}
    # The mock has no nvmlDeviceGetVirtualizationMode: unknown there, bare metal on the simulated DGX.
    assert {g["virtualization"] for g in mg} == {None} and {g["virtualization"] for g in sg} == {"None"}
    # Driver versions are each machine's own install; both report NVML's CUDA encoding the same way.
    assert mock.probe["driver"] == ["550.54.15", "12.4"]
    assert re.match(r"^\d+\.\d+\.\d+$", sim.probe["driver"][0]) and re.match(r"^1[12]\.\d$", sim.probe["driver"][1])


def test_check_agrees(pair: tuple[Pair, Side, Side]) -> None:
    """``check``: the same GPUs and compute capabilities, and an ``ok`` verdict. Where the mock invents both
    the PCI device ID and the name (H200: 0x2333, "... 141GB HBM3e") the catalogue knows no model: a notice
    per GPU and the global driver minimum, not a failure. Its A100 ("Mock NVIDIA ...") is an A100 by its PCI
    device ID, 0x20B0, as a real board with a driver-specific name would be."""
    p, mock, sim = pair
    assert sim.check["verdict"] == "ok", sim.check
    assert [g["computeCapability"] for g in mock.check["gpus"]] == [g["computeCapability"] for g in sim.check["gpus"]]
    assert mock.check["driverVersion"] == mock.probe["driver"][0]
    if "pci_device_id" in EXPECTED.get(p.mock, {}):
        assert (mock.check["verdict"], mock.check["reasons"]) == ("ok", []), mock.check
        assert {g["model"] for g in mock.check["gpus"]} == {None}
        notices = mock.check["notices"]
        assert len(notices) == len(mock.check["gpus"]) and "not in the catalogue" in notices[0]
    else:
        assert mock.check["verdict"] == "ok", mock.check
        assert [g["model"] for g in mock.check["gpus"]] == [g["model"] for g in sim.check["gpus"]]
        assert mock.check["requiredDriver"] == sim.check["requiredDriver"]


def test_labels_agree(pair: tuple[Pair, Side, Side]) -> None:
    """``labels``: the same label keys, counts, family, compute capability and MIG capability; product
    and memory as the inventory says; the NFD feature file written under the host root on both."""
    p, mock, sim = pair
    ml, sl = mock.labels["labels"], sim.labels["labels"]
    assert set(ml) == set(sl)
    differ = {k for k in ml if ml[k] != sl[k]}
    allowed = {k for k in ml if k.startswith("nvidia.com/cuda.")} | {"nvidia.com/gpu.machine"}  # host/install
    if "name" in EXPECTED.get(p.mock, {}):
        allowed.add("nvidia.com/gpu.product")
    if "memory_mib" in EXPECTED.get(p.mock, {}):
        allowed.add("nvidia.com/gpu.memory")
    assert differ <= allowed, {k: (ml[k], sl[k]) for k in differ - allowed}
    assert (ml["nvidia.com/gpu.count"], ml["nvidia.com/mig.capable"], ml["nvidia.com/gpu.machine"]) == (
        "8", "true", "unknown")
    assert ml["nvidia.com/gpu.memory"] == str(mock.probe["gpus"][0]["memory_mib"])
    for side in (mock, sim):
        feature_file = side.root / "etc/kubernetes/node-feature-discovery/features.d/gfd"
        assert feature_file.read_text() == "".join(f"{k}={v}\n" for k, v in sorted(side.labels["labels"].items()))


def test_device_plugin_devices_agree(pair: tuple[Pair, Side, Side]) -> None:
    """The device plugin's ``nvidia.com/gpu`` list: one device per GPU, UUID IDs, NVML indices,
    ``/dev/nvidia<minor>``, memory. Its NodeDevices start on the mock too, although the mock models
    no topology (``nvmlDeviceGetTopologyCommonAncestor``) and no event sets: found here, the plugin
    used to refuse to start on such a driver; pairs now score as farthest apart and XID health
    checks are off, as in NVIDIA's plugin."""
    p, mock, sim = pair
    (mr,), (sr,) = mock.probe["resources"], sim.probe["resources"]
    assert mr["name"] == sr["name"] == "nvidia.com/gpu"
    for side, res in ((mock, mr), (sim, sr)):
        assert [d["id"] for d in res["devices"]] == [g["uuid"] for g in side.probe["gpus"]]
        assert [(d["index"], d["paths"]) for d in res["devices"]] == [(str(i), [f"/dev/nvidia{i}"]) for i in range(8)]
    for m, s in zip(mr["devices"], sr["devices"], strict=True):
        assert _expected(p, "memory_mib", m["memoryMib"], s["memoryMib"])
    assert {d["numa"] for d in mr["devices"]} == {None}  # no sysfs NUMA file, no NVML answer: no topology hint
    assert sim.probe["nodeDevices"] == {"ok": None}
    assert mock.probe["nodeDevices"] == {"ok": None}


def test_dra_devices_agree(pair: tuple[Pair, Side, Side]) -> None:
    """The DRA driver's GPU devices: names, attributes and memory capacity from the same NVML facts.
    Its snapshot() publishes every GPU on the mock too: found here, a driver without event sets used
    to be treated as NVML being unavailable (no GPUs published); now XID health is off instead."""
    p, mock, sim = pair
    md, sd = mock.probe["dra"], sim.probe["dra"]
    assert [d["name"] for d in md] == [d["name"] for d in sd] == [f"gpu-{i}" for i in range(8)]
    for m, s in zip(md, sd, strict=True):
        ma, sa = m["attributes"], s["attributes"]
        assert set(ma) == set(sa)
        for key in ("type", "brand", "architecture", "cudaComputeCapability"):
            assert ma[key] == sa[key], key
        for side, attrs in ((mock, ma), (sim, sa)):  # each machine's own install, in the same spelling
            assert (attrs["driverVersion"], attrs["cudaDriverVersion"]) == (
                {"version": semver(side.probe["driver"][0])}, {"version": semver(side.probe["driver"][1])})
        assert _expected(p, "name", ma["productName"]["string"], sa["productName"]["string"])
        assert _expected(p, "memory_mib", quantity_value(m["capacity"]["memory"]["value"]) >> 20,
                         quantity_value(s["capacity"]["memory"]["value"]) >> 20)
        assert re.match(r"^0000:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", ma["resource.kubernetes.io/pciBusID"]["string"])
    assert sim.probe["draSnapshotGpus"] == 8
    assert mock.probe["draSnapshotGpus"] == 8


def test_mig_profiles_agree(pair: tuple[Pair, Side, Side]) -> None:
    """GPU-instance profiles by NVML enum: slices, instance counts, memory, SMs and engine counts
    (after the simulator took NVIDIA's engine tables), and the placements of every profile."""
    p, mock, sim = pair
    mp = {x["profile"]: x for x in mock.probe["profiles"]}
    sp = {x["profile"]: x for x in sim.probe["profiles"]}
    assert set(mp) == set(sp)
    differ = PROFILE_DIFFS[p.mock]
    for enum, m in mp.items():
        s = sp[enum]
        for field in set(m) - differ:
            if p.mock != "dgxa100" and s["slice_count"] == 7 and field in HOPPER_FULL_GPU:
                assert (m[field], s[field]) == HOPPER_FULL_GPU[field]
                continue
            assert m[field] == s[field], (enum, field, m[field], s[field])
        assert m["id"] == enum  # the mock's simplification; NVML's ids are the catalogue's
    mpl, spl = mock.probe["placements"], sim.probe["placements"]
    assert set(mpl) == set(spl)
    wrong = HOPPER_PLACEMENTS_IN_COMPUTE_SLICES if p.mock != "dgxa100" else set()
    assert {k: v for k, v in mpl.items() if k not in wrong} == {k: v for k, v in spl.items() if k not in wrong}
    for k in wrong:
        assert {size for _, size in mpl[k]} == {mp[int(k)]["slice_count"]} != {size for _, size in spl[k]}


def test_mig_mode_and_instances(pair: tuple[Pair, Side, Side]) -> None:
    """MIG on an idle GPU: both switch at once (current = pending = on), create a 1g instance, then one at
    slice 2, list both, report the room left (5 of 7), make its compute instance and MIG device, and take
    stock of every GPU. Where they differ: the mock (through tools/mocknvml's capacity rules) gives a
    placement-less instance the first free placement in its own table, numbers instances from 0 and lets
    MIG mode go off with instances alive; the simulator fills from the end, numbers from 1 and refuses that
    (NVML_ERROR_IN_USE)."""
    _, mock, sim = pair
    for side in (mock, sim):
        assert side.mig["before"] == [False, False]
        assert side.mig["enable"] == [True, True]
        assert "ok" in side.mig["create"] and "ok" in side.mig["createAt2"]
        assert side.mig["createAt2"]["ok"]["placement"] == {"start": 2, "size": 1}
        assert side.mig["remaining"] == {"ok": 5}
        assert side.mig["migDevices"]["ok"][0] == 1
        assert side.mig["inventory"] == {"gpus": list(range(len(side.probe["gpus"]))), "lost": []}
    assert mock.mig["create"]["ok"]["placement"] == {"start": 0, "size": 1}
    assert sim.mig["create"]["ok"]["placement"] == {"start": 6, "size": 1}
    assert [g["id"] for g in mock.mig["instances"]["ok"]] == [0, 1]
    assert [g["id"] for g in sim.mig["instances"]["ok"]] == [1, 2]
    assert mock.mig["computeInstance"]["ok"]["gi_id"] == 0 and sim.mig["computeInstance"]["ok"]["gi_id"] == 1
    assert mock.mig["disableWithInstances"] == {"ok": [False, False]}
    assert sim.mig["disableWithInstances"] == {"error": "NvmlInUse", "code": 19}


def test_error_codes(pair: tuple[Pair, Side, Side]) -> None:
    """NVML's return codes for the cases nvml.h defines. Both: INVALID_ARGUMENT for an index past the
    count, INSUFFICIENT_SIZE for a short buffer, NOT_SUPPORTED for a profile the GPU lacks,
    INVALID_ARGUMENT past the profile enum (nvml.h: enumerate "until the API returns
    NVML_ERROR_INVALID_ARGUMENT"; the simulator said NOT_SUPPORTED and was fixed), UNINITIALIZED after
    shutdown. They differ where the mock departs from nvml.h: an unknown UUID is NOT_FOUND (the mock
    says INVALID_ARGUMENT), an invalid compute-instance engine profile INVALID_ARGUMENT (the mock says
    NOT_SUPPORTED); the mock has no NUMA node at all."""
    _, mock, sim = pair
    same = {"handleByIndex(count)": 2, "handleByUUID(own) is the same handle": 1, "name(4-byte buffer)": 7,
            "giProfile(8_SLICE)": 3, "giProfile(COUNT)": 2, "deviceCount after shutdown": 1}
    for side in (mock, sim):
        assert {k: side.errors[k] for k in same} == same
        assert side.mig["ciProfile(COUNT)"] == 2
    assert (mock.errors["handleByUUID(unknown)"], sim.errors["handleByUUID(unknown)"]) == (2, 6)
    assert (mock.mig["ciProfile(engine 1)"], sim.mig["ciProfile(engine 1)"]) == (3, 2)
    assert (mock.errors["numaNode"], sim.errors["numaNode"]) == (3, 0)


def test_diagnose_on_nvidias_mock_has_the_shape_it_has_on_the_simulator(tmp_path: Path) -> None:
    """``diagnose`` against NVIDIA's model of a DGX H100 (``--nvml real``, the mock library loaded as the
    driver's) and against our simulated one: the same sections and per-GPU fields, each a value or an error
    in its place; and the real path reads the loaded library's exported NVML symbols."""
    mock_bin = required_bin(LIBRARY)
    real_root, sim_root = tmp_path / "real", tmp_path / "sim"

    mock_host(real_root, probe_mock(mock_bin, "dgxh100", tmp_path / "probe"))
    build_fake_host(sim_root, "dgx-h100")

    def run(root: Path, nvml: str, env: dict[str, str]) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(root), "--nvml", nvml,
                               "diagnose"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    real = run(real_root, "real", mock_env(mock_bin, "dgxh100"))
    sim = run(sim_root, "simulated:dgx-h100", {**os.environ, "PYTHONPATH": str(REPO)})
    assert set(real) == set(sim)
    assert len(real["gpus"]) == len(sim["gpus"]) == 8
    assert [set(g) for g in real["gpus"]] == [set(g) for g in sim["gpus"]]
    assert set(real["driver"]) == set(sim["driver"])
    symbols = real["driver"]["exportedSymbols"]
    assert isinstance(symbols, list) and "nvmlInit_v2" in symbols and "nvmlDeviceGetCount_v2" in symbols
    assert real["driver"]["library"].endswith(LIBRARY)


#: What the MIG permission tests run in a subprocess first: NVML initialised, and ``code`` answering a call's
#: NVML return code (0 for success).
_NVML_CODES = """
import json
import pynvml
pynvml.nvmlInit()
def code(fn, *args):
    try:
        fn(*args)
        return 0
    except pynvml.NVMLError as e:
        return e.value
"""

_MIG_CHANGE = _NVML_CODES + """
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"set_mig_mode": code(pynvml.nvmlDeviceSetMigMode, h, 1),
       "create_gpu_instance": code(pynvml.nvmlDeviceCreateGpuInstance, h, 0)}
out["mig_mode"] = pynvml.nvmlDeviceGetMigMode(h)[0]
print(json.dumps(out))
"""


#: Who tries (``test_mig_changes_need_the_config_capability``): CAP_SYS_ADMIN or not, the mig-config capability's
#: device node in its device directory or not, and what NVML answers (0, or 4: NVML_ERROR_NO_PERMISSION) to a
#: MIG mode change and a GPU instance, and the MIG mode after.
MIG_CALLERS = {
    # the MIG manager: privileged, every node of the node's /dev
    "sys-admin-with-the-node": (True, True, {"set_mig_mode": 0, "create_gpu_instance": 0, "mig_mode": 1}),
    # our labeller, exporter and device plugin: CAP_SYS_ADMIN for the monitor capability, no config node
    "sys-admin-without-the-node": (True, False, {"set_mig_mode": 4, "create_gpu_instance": 4, "mig_mode": 0}),
    # a workload
    "neither": (False, False, {"set_mig_mode": 4, "create_gpu_instance": 4, "mig_mode": 0}),
    # a process given the capability's node but not CAP_SYS_ADMIN: instances, never the mode
    "the-node-without-sys-admin": (False, True, {"set_mig_mode": 4, "create_gpu_instance": 0, "mig_mode": 1}),
}


@pytest.mark.parametrize("caller", list(MIG_CALLERS))
def test_mig_changes_need_the_config_capability(mock_bin: Path, tmp_path: Path, caller: str) -> None:
    """As on a real node (the MIG user guide's "Device Nodes and Capabilities", ``tools/mocknvml/permission.go``):
    instances are made only by a process that can open the mig-config capability's device node, and MIG mode is
    changed only by one that also has CAP_SYS_ADMIN; CAP_SYS_ADMIN without the node (what the agents that read
    MIG devices hold) changes nothing. Nothing is half-changed: after a refusal the state file keeps MIG off."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("needs root and setpriv (util-linux): make test runs as root")
    sys_admin, config_node, want = MIG_CALLERS[caller]
    state = tmp_path / "mig-state.json"
    enabled = not sys_admin and config_node  # the mode is not this caller's to change: start with MIG on
    state.write_text(json.dumps({"version": 1, "machine": "dgxh100", "gpus": [
        {"index": 0, "migMode": int(enabled), "nextGpuInstanceId": 0, "gpuInstances": []}]}))
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    os.mknod(dev / "nvidia0", 0o666 | 0o020000, os.makedev(1, 7))  # any character device counts as the GPU's
    if config_node:
        os.mknod(dev / "nvidia-caps" / "nvidia-cap1", 0o444 | 0o020000, os.makedev(1, 7))
    env = mock_env(mock_bin, "dgxh100", MOCK_NVML_STATE=str(state), MOCK_NVML_DEV_ROOT=str(dev))
    argv = [sys.executable, "-c", _MIG_CHANGE]
    if not sys_admin:  # root without CAP_SYS_ADMIN: dropped from the bounding set, so from what exec gives
        argv = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", *argv]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == want, done.stdout
    if want["mig_mode"] == 0:
        assert json.loads(state.read_text())["gpus"][0]["migMode"] == 0


_MIG_READ = _NVML_CODES + """
mig, whole = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
print(json.dumps({"mig_memory": code(pynvml.nvmlDeviceGetMemoryInfo, mig),
                  "mig_gpu_instance": code(pynvml.nvmlDeviceGetGpuInstanceById, mig, 0),
                  "whole_memory": code(pynvml.nvmlDeviceGetMemoryInfo, whole)}))
"""


@pytest.mark.parametrize("monitor", [False, True])
def test_mig_reads_need_the_monitor_capability(mock_bin: Path, tmp_path: Path, monitor: bool) -> None:
    """On a GPU in MIG mode the parent's memory information and its GPU instances are the monitor capability's
    (``/dev/nvidia-caps/nvidia-cap2``): without it NVML answers NO_PERMISSION, as NVIDIA's device plugin and GFD
    report on nodes that do not give it to them (``tools/mocknvml/permission.go``); a GPU outside MIG mode
    answers anyone. CAP_SYS_ADMIN alone does not stand in for the node where the library has a device
    directory (a container's view)."""
    state = tmp_path / "mig-state.json"
    state.write_text(json.dumps({"version": 1, "machine": "dgxh100", "gpus": [
        {"index": 0, "migMode": 1, "nextGpuInstanceId": 1, "gpuInstances": [
            {"id": 0, "profileId": 0, "placementStart": 0, "placementSize": 1, "nextComputeInstanceId": 0,
             "computeInstances": []}]}]}))
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for minor in (0, 1):
        os.mknod(dev / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(1, 7))
    if monitor:
        os.mknod(dev / "nvidia-caps" / "nvidia-cap2", 0o444 | 0o020000, os.makedev(1, 7))
    env = mock_env(mock_bin, "dgxh100", MOCK_NVML_STATE=str(state), MOCK_NVML_DEV_ROOT=str(dev))
    done = subprocess.run([sys.executable, "-c", _MIG_READ], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    refused = 0 if monitor else 4  # NVML_ERROR_NO_PERMISSION
    assert json.loads(done.stdout) == {"mig_memory": refused, "mig_gpu_instance": refused, "whole_memory": 0}
