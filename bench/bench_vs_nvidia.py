"""Our device plugin and DRA plugin against NVIDIA's, side by side in one run, and the per-node footprint.

Both run on NVIDIA's go-nvml mock machine (``dgxh100``; ``--machine dgxa100`` adds or picks another) laid out as
one host tree (``tests/compare/peers.py``): NVIDIA's plugin in a private mount namespace that shows it the mock's
PCI tree and ``/dev``, ours through ``--host-root``; both load the same mock ``libnvidia-ml.so.1``, take the same
flags (``--device-list-strategy envvar --device-id-strategy uuid``) and register with a kubelet stand-in of their
own that speaks the real device-plugin gRPC protocol (``tests/kit/kubelet/deviceplugin.py``). Printed
side by side, ratios ours/NVIDIA's:

* start to kubelet registration (process start to the Register call), median of a few starts, alternating;
* Allocate p50/p99 for a 1-GPU and a 2-GPU request over each plugin's unix socket, from the same gRPC client,
  the two plugins interleaved in blocks (ABAB) so machine noise hits both alike;
* GetPreferredAllocation p50/p99 and the answer for sizes 1..8 of the 8 GPUs, scored with go-gpuallocator's
  pair score over the links our NVML view of the machine reports, against the exhaustive best; whatever a side
  answers is reported, errors included (the mock models no NVLink or PCIe topology);
* each plugin process's peak RSS (VmHWM) and CPU time after that load (NVIDIA's is found behind
  ``unshare``/``sh -c exec`` through ``/proc/<pid>/exe``).

Then the DRA kubelet plugins: NVIDIA's ``gpu-kubelet-plugin`` (v0.4.1) and our ``dra-driver`` on the same mock
machine (a copy under a short root in /tmp: unix socket paths), each for a kwok Node of one local API server
(etcd, kube-apiserver, kwok) and registered with a DRA kubelet stand-in that calls NodePrepareResources and
NodeUnprepareResources over the plugin's real gRPC socket (``tests/compare/dra.py``), both up at once:

* start to published ResourceSlices (process start to the plugin's slices listed), median of a few starts;
* NodePrepareResources p50/p99 and NodeUnprepareResources p50 over prepare+unprepare cycles of one-GPU claims
  (each cycle on a fresh ResourceClaim allocated as the scheduler would, created up front and not timed), the
  plugins interleaved: paced under NVIDIA's client-go rate limit (so its own work is timed), then back-to-back
  (where that limit queues its prepares, as it would on a node starting many claimed pods at once);
* each plugin process's VmHWM/VmRSS and CPU time after that load, and its idle VmRSS before it.

Then the per-node footprint: what a GPU node runs, started idle on the same mock machine, per mode; VmRSS after
settling and VmHWM, per process and summed. NVIDIA's stack: device plugin + GPU feature discovery in its sleep
loop (+ the MIG manager, counted as one ``nvidia-mig-parted export`` run's peak RSS: NVIDIA's long-running
manager binary is not built here). Ours: the containers our DaemonSets run on a device-plugin node, rendered
from ``components/`` for an H100 group on the daemonset node-setup backend (setup pod, labeller, device plugin,
MIG manager), with their container paths pointed into the host tree and a Kubernetes API stand-in (kmock)
holding the Node. In DRA mode NVIDIA's node runs gpu-kubelet-plugin + GFD and ours the containers a DRA group
renders (setup hold, labeller, DRA plugin: no device plugin), the DRA plugins counted with their idle sample
from the DRA run. What could not be run, and why, is printed with the table.

Targets (issue): Allocate and prepare no slower than NVIDIA's at p99, preferred allocation never worse in score,
per-node memory footprint no larger than NVIDIA's stack. Printed as MET/MISSED: benchmarks report, tests assert.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import pytest  # noqa: E402  (tests.kit.tools.required_bin skips through pytest when the tools are not built)
from kubernetes import client  # noqa: E402

from localcluster import ControlPlane  # noqa: E402
from node_agent import nvml  # noqa: E402
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices  # noqa: E402
from node_agent.kubelet.deviceplugin.api import pb  # noqa: E402
from nvgpu import labels  # noqa: E402
from nvgpu.stackconfig import GroupPlan, NodeGroup, StackConfig, load_stack_config  # noqa: E402
from nvidia_gpu.components.manifests import dra as dra_manifests  # noqa: E402
from nvidia_gpu.components.manifests import mig as mig_manifests  # noqa: E402
from nvidia_gpu.components.manifests import workloads  # noqa: E402
from nvidia_gpu.components.manifests.sharing import render_named_configs  # noqa: E402
from tests.compare import dra as dra_cmp  # noqa: E402
from tests.compare.deviceplugin import PLUGIN_DIR, RESOURCE  # noqa: E402
from tests.compare.peers import DMI_PRODUCT, Machine, machine, namespaced  # noqa: E402
from tests.kit.kmock import api, kmock_server, kubeconfig  # noqa: E402
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet  # noqa: E402
from tests.kit.tools import required_bin  # noqa: E402
from tests.node_agent.deviceplugin.reference import exhaustive, set_score  # noqa: E402

FLAGS = ("--device-list-strategy", "envvar", "--device-id-strategy", "uuid")
#: BENCH_CALLS, BENCH_STARTS, BENCH_DRA_CYCLES: sizes of the run; BENCH_KEEP=1 keeps the work directories and the
#: processes' logs.
CALLS = int(os.environ.get("BENCH_CALLS", "1000"))  #: Allocate calls per plugin and request size
WARMUP = 100
BLOCK = 25  #: calls to one plugin before switching to the other
STARTS = int(os.environ.get("BENCH_STARTS", "3"))
PREFERRED_CALLS = 20  #: GetPreferredAllocation calls per plugin and size
SETTLE_S = 3.0  #: idle time after the last process settled, before sampling RSS
WAIT_S = 60.0  #: the longest any wait in this script lasts
NODE = "gpu-node"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GNU_TIME = Path("/usr/bin/time")
NVIDIA, OURS = "NVIDIA", "ours"
DEVICE_PLUGIN_MODE, DRA_MODE = "device-plugin", "dra"  #: a footprint row only on the nodes of that allocation mode
#: The catalogue model of each mock machine's GPUs (the node group the footprint renders our DaemonSets for).
MODELS = {"dgxa100": "A100-40GB", "dgxh100": "H100-80GB"}


# --- processes -----------------------------------------------------------------------------------


class Processes:
    """Every process and kubelet stand-in this run starts, stopped in :meth:`stop_all` whatever happens."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kubelets: list[DevicePluginKubelet] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def kubelet(self, directory: Path) -> DevicePluginKubelet:
        directory.mkdir(parents=True, exist_ok=True)
        k = DevicePluginKubelet(directory)
        k.start()
        self.kubelets.append(k)
        return k

    def log_tail(self, name: str, chars: int = 1500) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):  # and whatever it left in its session
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    @classmethod
    def stop_many(cls, procs: Sequence[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
        """SIGTERM to all first, so slow exits overlap."""
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            cls.stop(proc, timeout)

    def stop_kubelet(self, k: DevicePluginKubelet) -> None:
        k.stop()
        if k in self.kubelets:
            self.kubelets.remove(k)

    def stop_all(self) -> None:
        self.stop_many(self.procs[::-1])
        self.procs.clear()
        for k in list(self.kubelets):
            self.stop_kubelet(k)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], _children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def real_pid(pid: int, exe_prefix: str, timeout: float = 10.0) -> int:
    """The process that runs ``exe_prefix``: ``pid`` itself once ``unshare`` and ``sh -c exec`` have exec'd into
    it, else one of its descendants."""
    deadline = time.monotonic() + timeout
    while True:
        for cand in (pid, *descendants(pid)):
            if exe_name(cand).startswith(exe_prefix):
                return cand
        if time.monotonic() >= deadline:
            raise RuntimeError(f"pid {pid}: no {exe_prefix} process after {timeout}s (exe {exe_name(pid)!r})")
        time.sleep(0.01)


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (KiB) of ``pid``; empty when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()
            if line.startswith(("VmRSS:", "VmHWM:"))}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Memory:
    rss_kib: int
    hwm_kib: int
    cpu_s: float
    processes: int


def tree_memory(pid: int) -> Memory:
    """Summed over ``pid`` and its descendants (NVIDIA's processes and ours start none at idle; counted anyway)."""
    pids = [pid, *descendants(pid)]
    st = [status_kib(p) for p in pids]
    return Memory(sum(s.get("VmRSS", 0) for s in st), sum(s.get("VmHWM", 0) for s in st),
                  sum(cpu_s(p) for p in pids), len([s for s in st if s]))


@dataclass
class Transient:
    """A short-lived run: its peak RSS and CPU time, or why it could not be measured."""

    peak_kib: int
    cpu_s: float
    rc: int
    note: str = ""


def transient(argv: Sequence[str], env: dict[str, str], timeout: float = WAIT_S) -> Transient:
    """Peak RSS of a short-lived program: ``/usr/bin/time``'s ``ru_maxrss`` (a child of a small process; a child
    of this Python process would inherit its RSS high-water mark), else VmHWM sampled until it exits."""
    if GNU_TIME.exists():
        with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
            done = subprocess.run([str(GNU_TIME), "-o", out.name, "-f", "%M %U %S", *argv], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=timeout, check=False)
            fields = Path(out.name).read_text().split()[-3:]
        tail = (done.stdout + done.stderr).strip().splitlines()
        note = "" if done.returncode == 0 else (tail[-1].strip()[:160] if tail else "")
        try:
            return Transient(int(fields[0]), float(fields[1]) + float(fields[2]), done.returncode, note)
        except (IndexError, ValueError):
            return Transient(0, float("nan"), done.returncode, note or "no /usr/bin/time output")
    proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak, cpu, deadline = 0, 0.0, time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for p in (proc.pid, *descendants(proc.pid)):
                peak = max(peak, status_kib(p).get("VmHWM", 0))
                cpu = max(cpu, cpu_s(p))
            time.sleep(0.001)
    finally:
        Processes.stop(proc)
    return Transient(peak, cpu, proc.returncode or 0, "sampled VmHWM (no /usr/bin/time)")


# --- figures -------------------------------------------------------------------------------------


def pct(samples: Sequence[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] if s else float("nan")


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs and math.isfinite(theirs) and math.isfinite(ours) else "n/a"


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout: float = WAIT_S, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
    return True


# --- the two device plugins ------------------------------------------------------------------------


@dataclass
class Plugin:
    side: str
    name: str
    proc: subprocess.Popen[bytes]
    kubelet: DevicePluginKubelet
    pid: int
    registered_s: float  #: process start to the Register call
    exec_registered_s: float  #: the plugin's own exec to the Register call (NVIDIA's: after the namespace prelude)
    ids: list[str]
    stub: Any
    options: Any


def plugin_argv(m: Machine, side: str, kubelet_dir: Path, flags: Sequence[str]) -> list[str]:
    if side == NVIDIA:
        argv = [str(m.tools / "nvidia-device-plugin"), "--fail-on-init-error=true", *flags]
        return namespaced(m, argv, {PLUGIN_DIR: kubelet_dir})
    return [sys.executable, "-m", "node_agent", "--host-root", str(m.root), "--nvml", "real", "device-plugin",
            "--socket-dir", str(kubelet_dir), "--metrics-port", "0", "--fail-on-init-error", "true", *flags]


def start_plugin(procs: Processes, side: str, name: str, argv: Sequence[str], *, env: dict[str, str],
                 kubelet_dir: Path) -> Plugin:
    kubelet = procs.kubelet(kubelet_dir)
    started = time.monotonic()
    proc = procs.start(name, argv, env)
    exec_at = started
    if side == NVIDIA:  # unshare and sh set the namespace up, then exec the plugin in the same process
        wait_for(lambda: exe_name(proc.pid) == "nvidia-device-plugin" or proc.poll() is not None, step=0.001)
        exec_at = time.monotonic()
    try:
        kubelet.wait_registered({RESOURCE}, timeout=WAIT_S)
    except AssertionError as e:
        raise RuntimeError(f"{name} did not register: {e}\n{procs.log_tail(name)}") from None
    at = min(t for _, _, r, t in kubelet.registrations if r == RESOURCE)
    ep = kubelet.wait_devices(RESOURCE, bool, timeout=WAIT_S)
    pid = real_pid(proc.pid, "nvidia-device-plugin" if side == NVIDIA else "python")
    return Plugin(side, name, proc, kubelet, pid, at - started, at - exec_at, sorted(ep.devices), ep.stub,
                  ep.options)


def stop_plugin(procs: Processes, p: Plugin) -> None:
    procs.stop(p.proc)
    procs.stop_kubelet(p.kubelet)


@dataclass
class Topology:
    """Our NVML view of the mock's links: GPU UUIDs in index order and go-gpuallocator pair scores."""

    uuids: list[str]
    scores: list[list[int]]
    described: str

    def score(self, a: int, b: int) -> int:
        return self.scores[a][b]

    def indices(self, ids: Iterable[str]) -> list[int]:
        return [self.uuids.index(i) for i in ids]


def links_main() -> int:
    """``--links``: run with the mock's environment; prints our view of the machine's GPU links as JSON."""
    with nvml.open_nvml("real") as session:
        node = NvmlNodeDevices(session)
        gpus = node.gpus()
        links = {(a.index, b.index): node.link(a, b) for a in gpus for b in gpus if a.index < b.index}
        node.close()
    kinds: dict[str, int] = {}
    for link in links.values():
        key = f"{link.nvlinks} NVLink(s), PCIe {link.pcie.name} (score {link.score})"
        kinds[key] = kinds.get(key, 0) + 1
    n = len(gpus)
    scores = [[0 if a == b else links[(min(a, b), max(a, b))].score for b in range(n)] for a in range(n)]
    print(json.dumps({"uuids": [g.uuid for g in gpus], "scores": scores,
                      "described": "; ".join(f"{c} pair(s): {k}" for k, c in sorted(kinds.items()))}))
    return 0


def topology(m: Machine) -> Topology:
    done = subprocess.run([sys.executable, __file__, "--links"], cwd=ROOT, env=m.env(), capture_output=True,
                          text=True, timeout=WAIT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"links probe failed: {done.stderr[-2000:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    return Topology(doc["uuids"], doc["scores"], doc["described"])


def nvml_cost_kib(m: Machine) -> int:
    """RSS a process gains by loading the mock NVML and initialising it (its own Go runtime and machine model)."""
    code = ("import ctypes\n"
            "def rss():\n"
            "    return int([x for x in open('/proc/self/status') if x.startswith('VmRSS')][0].split()[1])\n"
            "a = rss(); lib = ctypes.CDLL('libnvidia-ml.so.1'); assert lib.nvmlInit_v2() == 0\n"
            "n = ctypes.c_uint(); lib.nvmlDeviceGetCount_v2(ctypes.byref(n)); print(rss() - a)\n")
    done = subprocess.run([sys.executable, "-c", code], env=m.env(), capture_output=True, text=True,
                          timeout=WAIT_S, check=False)
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def allocate_requests(ids: Sequence[str], size: int) -> list[Any]:
    """One request per starting GPU, ``size`` consecutive GPUs each (so no call repeats the previous one)."""
    return [pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
        devices_ids=[ids[(i + k) % len(ids)] for k in range(size)])]) for i in range(len(ids))]


def time_allocate(plugins: Sequence[Plugin], size: int) -> dict[str, list[float]]:
    reqs = {p.side: allocate_requests(p.ids, size) for p in plugins}
    for p in plugins:
        for i in range(WARMUP):
            p.stub.Allocate(reqs[p.side][i % len(p.ids)], timeout=5)
    out: dict[str, list[float]] = {p.side: [] for p in plugins}
    for block in range(max(1, CALLS // BLOCK)):
        for p in plugins if block % 2 == 0 else reversed(plugins):
            for i in range(BLOCK):
                req = reqs[p.side][(block * BLOCK + i) % len(p.ids)]
                t = time.perf_counter()
                p.stub.Allocate(req, timeout=5)
                out[p.side].append(time.perf_counter() - t)
    return out


@dataclass
class Preferred:
    answers: dict[int, list[str] | str] = field(default_factory=dict)  #: size -> device IDs, or the error
    ok: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)


def _preferred_request(ids: Sequence[str], size: int) -> Any:
    return pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=list(ids), must_include_deviceIDs=[], allocation_size=size)])


def time_preferred(plugins: Sequence[Plugin]) -> dict[str, Preferred]:
    out = {p.side: Preferred() for p in plugins}
    for size in range(1, len(plugins[0].ids) + 1):
        for r in range(PREFERRED_CALLS):
            for p in plugins if r % 2 == 0 else reversed(plugins):
                res = out[p.side]
                if not p.options.get_preferred_allocation_available:
                    res.answers[size] = "not advertised (GetPreferredAllocationAvailable false)"
                    continue
                t = time.perf_counter()
                try:
                    resp = p.stub.GetPreferredAllocation(_preferred_request(p.ids, size), timeout=5)
                except grpc.RpcError as e:
                    res.errors.append(time.perf_counter() - t)
                    res.answers.setdefault(size, f"error {e.code().name}: {e.details()}")
                    continue
                res.ok.append(time.perf_counter() - t)
                res.answers.setdefault(size, list(resp.container_responses[0].deviceIDs))
    return out


@dataclass
class PluginFigures:
    starts: dict[str, list[float]]
    exec_starts: dict[str, list[float]]
    allocate: dict[int, dict[str, list[float]]]
    preferred: dict[str, Preferred]
    topology: Topology
    after_load: dict[str, Memory]
    load_cpu_s: dict[str, float]


def compare_plugins(procs: Processes, m: Machine, work: Path) -> PluginFigures:
    env = m.env()
    starts: dict[str, list[float]] = {NVIDIA: [], OURS: []}
    exec_starts: dict[str, list[float]] = {NVIDIA: [], OURS: []}
    running: list[Plugin] = []
    for rep in range(STARTS):
        sides = (NVIDIA, OURS) if rep % 2 == 0 else (OURS, NVIDIA)
        for side in sides:
            kdir = work / f"kubelet-{side.lower()}-{rep}"
            p = start_plugin(procs, side, f"{m.name}-{side.lower()}-plugin-{rep}",
                             plugin_argv(m, side, kdir, FLAGS), env=env, kubelet_dir=kdir)
            starts[side].append(p.registered_s)
            exec_starts[side].append(p.exec_registered_s)
            if rep == STARTS - 1:
                running.append(p)  # the last start of each serves the load
            else:
                stop_plugin(procs, p)
    plugins = sorted(running, key=lambda p: p.side != NVIDIA)  # NVIDIA's first
    ids = {tuple(p.ids) for p in plugins}
    if len(ids) != 1:
        raise RuntimeError(f"the plugins advertise different device IDs: {sorted(ids)}")
    before = {p.side: cpu_s(p.pid) for p in plugins}
    allocate = {size: time_allocate(plugins, size) for size in (1, 2)}
    preferred = time_preferred(plugins)
    after = {p.side: tree_memory(p.pid) for p in plugins}
    load_cpu = {p.side: cpu_s(p.pid) - before[p.side] for p in plugins}
    for p in plugins:
        stop_plugin(procs, p)
    return PluginFigures(starts, exec_starts, allocate, preferred, topology(m), after, load_cpu)


# --- the two DRA kubelet plugins -------------------------------------------------------------------

#: BENCH_DRA_CYCLES: prepare+unprepare cycles per DRA plugin (each on a claim of its own, created up front).
DRA_CYCLES = int(os.environ.get("BENCH_DRA_CYCLES", "100"))
DRA_WARMUP = 5
DRA_BLOCK = 10  #: back-to-back cycles on one plugin before switching to the other
#: Paced: one cycle per plugin every DRA_PACE_S, under NVIDIA's plugin's client-go rate limit (its default
#: --kube-api-qps 5, --kube-api-burst 10; each of its prepares GETs the claim), so its own work is what is timed.
DRA_PACE_S = 0.25
PACED, BURST = "paced", "back-to-back"
DRA_SIDE = {NVIDIA: "nvidia", OURS: "ours"}  #: tests.compare.dra's names of the sides
DRA_EXE = {NVIDIA: "gpu-kubelet-plugin", OURS: "python"}
#: The control plane the DRA plugins publish to: no controller-manager (its claim controller would clear the
#: bench's claims' reservations for pods that do not exist) and no scheduler; kwok plays the Nodes' kubelet.
DRA_COMPONENTS = ("etcd", "kube-apiserver", "kwok")
NVIDIA_DRA_VERSION = "v0.4.1"


@dataclass(frozen=True)
class EnvMachine(Machine):
    """The machine, with environment variables our DRA plugin's DaemonSet sets on its container."""

    extra_env: tuple[tuple[str, str], ...] = ()

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(**(dict(self.extra_env) | extra))


def dra_stack(model: str) -> tuple[StackConfig, NodeGroup]:
    """One DRA group of ``model`` GPUs, whole, on the daemonset node-setup backend."""
    cfg = load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "nodeSetup": "daemonset",
                    "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "bench"}},
        "nodeGroups": [{"name": "gpu", "nodeSelector": {"matchLabels": {"gpu": "bench"}}, "allocationMode": "dra",
                        "gpu": {"model": model, "sharing": "Exclusive"}}],
    })
    return cfg, cfg.node_groups[0]


def dra_node_containers(model: str) -> tuple[list[str], dict[str, str]]:
    """The containers a DRA group's GPU node runs, as ``components/`` renders them (init containers marked), and
    the plain environment values of our DRA plugin's container."""
    cfg, group = dra_stack(model)
    plan = GroupPlan.of(cfg.cluster, group)
    ctx = workloads.GroupContext(namespace=cfg.cluster.namespace, cluster=cfg.cluster, group=group, plan=plan)
    names: list[str] = []
    plugin_env: dict[str, str] = {}
    for ds in (workloads.setup_daemonset(ctx), workloads.labeller_daemonset(ctx),
               dra_manifests.plugin_daemonset(cfg.cluster.namespace, cfg.cluster, group, plan)):
        spec = ds["spec"]["template"]["spec"]
        names += [f"{c['name']} (init)" for c in spec.get("initContainers", [])]
        names += [c["name"] for c in spec["containers"]]
        for c in spec["containers"]:
            if c["name"] == dra_manifests.COMPONENT:
                plugin_env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    return names, plugin_env


@dataclass
class DraFigures:
    starts: dict[str, list[float]]  #: process start to the plugin's ResourceSlices listed
    prepare: dict[str, dict[str, list[float]]]  #: PACED or BURST -> side -> seconds
    unprepare: dict[str, dict[str, list[float]]]
    idle: dict[str, Memory]  #: both up, slices published, settled, before the load
    idle_cpu: dict[str, float]
    after_load: dict[str, Memory]
    load_cpu_s: dict[str, float]
    devices: dict[str, int]  #: GPUs each publishes
    node_containers: list[str]  #: what a DRA group's node runs (ours, rendered)
    plugin_env: dict[str, str]  #: what our plugin ran with from its DaemonSet


def _claim_error(response: Any, uid: str) -> str:
    claims = response.claims
    if uid not in claims:
        return f"no answer for claim {uid}"
    return str(claims[uid].error)


def _dra_cycle(plugin: Any, claim: tuple[str, str, str], side: str) -> tuple[float, float]:
    """One NodePrepareResources and NodeUnprepareResources of ``claim``: their seconds, each timed alone."""
    t = time.perf_counter()
    response = plugin.kubelet.prepare(dra_cmp.DRIVER, [claim], timeout=WAIT_S)
    prepared = time.perf_counter() - t
    if err := _claim_error(response, claim[2]):
        raise RuntimeError(f"{side}'s NodePrepareResources of {claim[1]}: {err}\n{plugin.log()}")
    t = time.perf_counter()
    response = plugin.kubelet.unprepare(dra_cmp.DRIVER, [claim], timeout=WAIT_S)
    unprepared = time.perf_counter() - t
    if err := _claim_error(response, claim[2]):
        raise RuntimeError(f"{side}'s NodeUnprepareResources of {claim[1]}: {err}\n{plugin.log()}")
    return prepared, unprepared


def compare_dra(m: Machine, work: Path, idle_s: float = SETTLE_S) -> DraFigures:
    """NVIDIA's gpu-kubelet-plugin and our dra-driver on ``m`` (a short root: unix socket paths), each for a kwok
    Node of one local API server, registered with a kubelet stand-in of its own (``tests.compare.dra``)."""
    bin_dir = required_bin("gpu-kubelet-plugin", "nvidia-cdi-hook", *DRA_COMPONENTS)
    containers, plugin_env = dra_node_containers(MODELS[m.name])
    # Ours with what its DaemonSet sets beyond the pod's identity (MALLOC_ARENA_MAX); NVIDIA's as its chart runs it.
    ours_env = {k: v for k, v in plugin_env.items() if k == "MALLOC_ARENA_MAX"}
    machines: dict[str, Machine] = {
        NVIDIA: m, OURS: EnvMachine(**{f.name: getattr(m, f.name) for f in fields(m)},
                                    extra_env=tuple(sorted(ours_env.items())))}
    cp = ControlPlane(directory=work / "cluster", components=DRA_COMPONENTS, bin_dir=bin_dir)
    cp.start(timeout=WAIT_S * 2)
    kube = cp.admin()
    claims: dict[str, list[tuple[str, str, str]]] = {NVIDIA: [], OURS: []}
    n = 0

    def running(side: str) -> Any:
        nonlocal n
        n += 1
        return dra_cmp.running(machines[side], DRA_SIDE[side], kube, cp.kubeconfig, work / f"p{n}")

    try:
        starts: dict[str, list[float]] = {NVIDIA: [], OURS: []}
        for rep in range(STARTS - 1):  # alternating; the last start of each serves the load
            for side in (NVIDIA, OURS) if rep % 2 == 0 else (OURS, NVIDIA):
                with running(side) as plugin:
                    starts[side].append(plugin.seconds_to_slices)
        with contextlib.ExitStack() as up:
            plugins: dict[str, Any] = {}
            for side in (NVIDIA, OURS) if (STARTS - 1) % 2 == 0 else (OURS, NVIDIA):
                plugin = up.enter_context(running(side))
                starts[side].append(plugin.seconds_to_slices)
                plugins[side] = plugin
            pids = {side: real_pid(p.proc.pid, DRA_EXE[side]) for side, p in plugins.items()}
            published = {side: dra_cmp.slices(kube, p.node) for side, p in plugins.items()}
            gpus = sorted(d["attributes"]["uuid"]["string"] for s in published[OURS]
                          for d in s["spec"].get("devices") or []
                          if d.get("attributes", {}).get("type", {}).get("string") == "gpu")
            devices = {side: sum(1 for s in pub for d in s["spec"].get("devices") or []
                                 if d.get("attributes", {}).get("type", {}).get("string") == "gpu")
                       for side, pub in published.items()}
            if not gpus:
                raise RuntimeError("our DRA plugin published no GPU")
            cpu_before = {side: tree_memory(pid).cpu_s for side, pid in pids.items()}
            time.sleep(idle_s)
            idle = {side: tree_memory(pid) for side, pid in pids.items()}
            idle_cpu = {side: (idle[side].cpu_s - cpu_before[side]) / idle_s for side in pids}
            # Claim i allocates the same physical GPU (by UUID) on both sides, the GPUs in turn; created up front.
            names = {side: [dra_cmp.device_by_uuid(published[side], u) for u in gpus] for side in plugins}
            for i in range(DRA_WARMUP + 2 * DRA_CYCLES):
                for side, p in plugins.items():
                    claims[side].append(dra_cmp.allocated_claim(kube, p, names[side][i % len(gpus)]))
            for i in range(DRA_WARMUP):
                for side, p in plugins.items():
                    _dra_cycle(p, claims[side][i], side)
            prepare: dict[str, dict[str, list[float]]] = {r: {NVIDIA: [], OURS: []} for r in (PACED, BURST)}
            unprepare: dict[str, dict[str, list[float]]] = {r: {NVIDIA: [], OURS: []} for r in (PACED, BURST)}
            fresh = {side: iter(claims[side][DRA_WARMUP:]) for side in plugins}

            def cycle(regime: str, side: str) -> None:
                took = _dra_cycle(plugins[side], next(fresh[side]), side)
                prepare[regime][side].append(took[0])
                unprepare[regime][side].append(took[1])

            load_before = {side: tree_memory(pid).cpu_s for side, pid in pids.items()}
            order = [NVIDIA, OURS]
            for r in range(DRA_CYCLES):  # paced, ABBA: one cycle each per round
                at = time.monotonic()
                for side in order if r % 2 == 0 else order[::-1]:
                    cycle(PACED, side)
                time.sleep(max(0.0, at + DRA_PACE_S - time.monotonic()))
            for block in range(math.ceil(DRA_CYCLES / DRA_BLOCK)):  # back-to-back, in blocks, alternating
                for side in order if block % 2 == 0 else order[::-1]:
                    for _ in range(min(DRA_BLOCK, DRA_CYCLES - block * DRA_BLOCK)):
                        cycle(BURST, side)
            after = {side: tree_memory(pid) for side, pid in pids.items()}
            load_cpu = {side: after[side].cpu_s - load_before[side] for side in pids}
            for side, p in plugins.items():
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{side}'s DRA plugin exited {p.proc.returncode}:\n{p.log()}")
    except (AssertionError, TimeoutError) as e:  # tests.compare.dra's waits answer these
        raise RuntimeError(f"DRA: {e}") from None
    finally:
        for claim in claims[NVIDIA] + claims[OURS]:
            with contextlib.suppress(Exception):
                kube.delete(dra_cmp.RESOURCE, "ResourceClaim", claim[1], claim[0])
        cp.stop()
    return DraFigures(starts, prepare, unprepare, idle, idle_cpu, after, load_cpu, devices, containers, ours_env)


# --- the per-node footprint ------------------------------------------------------------------------


def stack(model: str, node_setup: str = "daemonset") -> tuple[StackConfig, NodeGroup]:
    """One group of ``model`` GPUs, whole, on the given node-setup backend, as a stack file would declare it."""
    cfg = load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "nodeSetup": node_setup,
                    "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "bench"}},
        "nodeGroups": [{"name": "gpu", "nodeSelector": {"matchLabels": {"gpu": "bench"}},
                        "gpu": {"model": model, "sharing": "Exclusive"}}],
    })
    return cfg, cfg.node_groups[0]


@dataclass(frozen=True)
class Container:
    """One container of our DaemonSets as this run starts it."""

    name: str
    argv: tuple[str, ...]
    init: bool = False
    kubelet_dir: Path | None = None  #: the device plugin's socket directory (a kubelet stand-in serves it)
    mig: bool = False  #: runs only on nodes carrying nvidia.com/mig.config
    mode: str = ""  #: runs only on nodes of this allocation mode ("" every mode)


def _replace_value(argv: list[str], flag: str, value: str) -> list[str]:
    return [value if i and argv[i - 1] == flag else a for i, a in enumerate(argv)]


def our_containers(m: Machine, work: Path, kubecfg: Path, *, dra: bool = False) -> list[Container]:
    """The GPU-node containers of our DaemonSets (rendered by ``components/``), container paths mapped into the
    host tree: ``/host`` is the tree, ``/driver-root`` is ``/`` (the mock NVML is on the library path), the
    ConfigMaps are files under ``work``; ``--kubeconfig`` replaces the pod's ServiceAccount. ``dra``: a DRA
    group's node (setup, labeller, DRA plugin; the plugin's sockets are under the host tree, whose path must
    then be short: a unix socket path has 107 bytes)."""
    cfg, group = dra_stack(MODELS[m.name]) if dra else stack(MODELS[m.name])
    plan = GroupPlan.of(cfg.cluster, group)
    ctx = workloads.GroupContext(namespace=cfg.cluster.namespace, cluster=cfg.cluster, group=group, plan=plan)
    dp_config = work / "device-plugin-config"
    dp_config.mkdir()
    for name, text in render_named_configs(group).items():
        (dp_config / name).write_text(text)
    mig_config = work / "mig-config.yaml"
    mig_config.write_text(mig_manifests.mig_config([group]).to_yaml())
    (work / "cdi-hook").mkdir()
    paths = {workloads.HOST_ROOT: str(m.root), workloads.CONTAINER_DRIVER_ROOT: "/",
             workloads.DEVICE_PLUGIN_CONFIG_DIR: str(dp_config), workloads.CDI_HOOK_DIR: str(work / "cdi-hook"),
             f"{mig_manifests.CONFIG_DIR}/{mig_manifests.CONFIG_KEY}": str(mig_config)}
    daemonsets = [(workloads.setup_daemonset(ctx), False, ""), (workloads.labeller_daemonset(ctx), False, ""),
                  (workloads.device_plugin_daemonset(ctx), False, DEVICE_PLUGIN_MODE),
                  (mig_manifests.daemonset(cfg.cluster.namespace, cfg.cluster, [group]), True, "")]
    if dra:
        daemonsets = [*daemonsets[:2], (dra_manifests.plugin_daemonset(cfg.cluster.namespace, cfg.cluster, group, plan),
                                        False, DRA_MODE)]
    out = []
    for ds, mig, mode in daemonsets:
        spec = ds["spec"]["template"]["spec"]
        for init, c in [(True, c) for c in spec.get("initContainers", [])] + [(False, c) for c in spec["containers"]]:
            cmd = [paths.get(a, a) for a in [*c["command"], *c.get("args", [])]]
            cmd[0] = sys.executable if cmd[0] == "python" else cmd[0]
            kubelet_dir = None
            if cmd[1:3] == ["-m", "node_agent"]:
                agent = cmd[3:]
                if "--host-root" not in agent:
                    agent = ["--host-root", str(m.root), *agent]
                agent = ["--kubeconfig", str(kubecfg), *_replace_value(agent, "--metrics-port", str(free_port()))]
                if "device-plugin" in agent:
                    kubelet_dir = work / f"kubelet-{c['name']}"
                    agent += ["--socket-dir", str(kubelet_dir)]
                if init and "setup" in agent:
                    agent.append("--no-restart")  # no containerd to restart in a host tree
                if "dra-driver" in agent:  # kubelet's directories under the host tree, as on a node
                    for d in ("var/lib/kubelet/plugins", "var/lib/kubelet/plugins_registry"):
                        (m.root / d).mkdir(parents=True, exist_ok=True)
                cmd = [*cmd[:3], *agent]
            out.append(Container(c["name"], tuple(cmd), init, kubelet_dir, mig, mode))
    return out


@dataclass
class Row:
    side: str
    name: str
    memory: Memory | None = None  #: a long-running process, sampled idle
    idle_cpu: float = float("nan")  #: CPU seconds per second while idle (a spinning loop shows here)
    once: Transient | None = None  #: a short-lived run
    mig: bool = False
    in_totals: bool = True
    note: str = ""
    mode: str = ""  #: only on nodes of this allocation mode ("" every mode)


@dataclass
class Footprint:
    rows: list[Row]
    left_out: list[str]
    nvml_kib: int
    idle_s: float = SETTLE_S  #: the window the idle CPU was measured over


def _node_labels(core: Any) -> dict[str, str]:
    try:
        return dict(core.read_node(NODE).metadata.labels or {})
    except Exception:  # kmock not answering yet counts as "not there yet"
        return {}


def _mig_settled(node_labels: dict[str, str]) -> bool:
    return labels.MIG_CONFIG not in node_labels or node_labels.get(labels.MIG_CONFIG_STATE) == "success"


def footprint(procs: Processes, m: Machine, work: Path, idle_s: float = SETTLE_S) -> Footprint:
    env = m.env(NODE_NAME=NODE)
    left_out = [
        "NVIDIA: config-manager sidecars of the device plugin and GFD (they switch the sharing config by node "
        "label, which ours does in-process): not built here",
        "NVIDIA: the NFD worker that turns GFD's feature file into Node labels (ours patches the Node itself): "
        "not built here",
        "NVIDIA: the long-running nvidia-mig-manager (watches the Node, runs reconfigure scripts): not built here; "
        "its cost is counted as one nvidia-mig-parted export run's peak",
        "ours: preStop hooks (teardown, mig-manager --pre-stop) run only when a pod is deleted; setup runs with "
        "--no-restart (no containerd in a host tree)",
    ]
    nvidia_rows: list[Row] = []
    our_rows: list[Row] = []
    running: list[tuple[Row, subprocess.Popen[bytes], str, str]] = []  # row, process, exe, log
    kubelets: list[DevicePluginKubelet] = []
    with kmock_server() as url:
        core: Any = client.CoreV1Api(api(url))  # plain dicts as bodies
        # A node that carries nvidia.com/mig.config (the MIG manager's nodes); all-disabled is what the mock's GPUs
        # are, so the manager converges at once and idles, as NVIDIA's does between reconfigurations.
        # A resourceVersion as a real API server gives every object (kmock sets none): without one, a watch from
        # "now" is impossible and our MIG manager's idle watch returns at once, over and over.
        core.create_node({"metadata": {"name": NODE, "resourceVersion": "1",
                                       "labels": {"gpu": "bench", labels.MIG_CONFIG: "all-disabled"}}})
        # kmock answers 404 listing a kind it never stored: one pod elsewhere for the managers' pod lists.
        core.create_namespaced_pod("web", {"metadata": {"name": "web", "namespace": "web"}, "spec": {
            "nodeName": "cpu-node", "containers": [{"name": "c", "image": "i"}]}})
        containers = our_containers(m, work, kubeconfig(url, work / "kubeconfig"))
        try:
            for c in (c for c in containers if c.init):  # init containers first, as kubelet runs them
                run = transient(c.argv, env)
                our_rows.append(Row(OURS, f"{c.name} (init container, once)", once=run,
                                    in_totals=False, note="" if run.rc == 0 else f"exit {run.rc}: {run.note}"))
                if run.rc != 0 and labels.GPU_SETUP_COMPLETE not in _node_labels(core):
                    # The gated pods (labeller, device plugin, MIG manager) would not run: open the gate here.
                    core.patch_node(NODE, {"metadata": {"labels": {labels.GPU_SETUP_COMPLETE: ""}}})
                    left_out.append(f"ours: {c.name} failed on this mock (above), so the bench set "
                                    f"{labels.GPU_SETUP_COMPLETE} itself for the gated pods")
            for c in (c for c in containers if not c.init):
                if c.kubelet_dir is not None:
                    kubelets.append(procs.kubelet(c.kubelet_dir))
                row = Row(OURS, c.name, mig=c.mig, mode=c.mode)
                our_rows.append(row)
                log = f"{m.name}-node-{c.name}"
                running.append((row, procs.start(log, c.argv, env), "python", log))
            kdir = work / "kubelet-nvidia-node"
            kubelets.append(procs.kubelet(kdir))
            dp = [str(m.tools / "nvidia-device-plugin"), "--fail-on-init-error=true", "--pass-device-specs=true",
                  *FLAGS]
            row = Row(NVIDIA, "nvidia-device-plugin", mode=DEVICE_PLUGIN_MODE)
            nvidia_rows.append(row)
            log = f"{m.name}-node-nvidia-device-plugin"
            running.append((row, procs.start(log, namespaced(m, dp, {PLUGIN_DIR: kdir}), env), "nvidia-device-plugin",
                            log))
            gfd_out = work / "gfd-features"
            gfd = [str(m.tools / "gpu-feature-discovery"), "--use-node-feature-api=false", "--output-file",
                   str(gfd_out), "--machine-type-file", str(m.root / DMI_PRODUCT.lstrip("/")), "--sleep-interval",
                   "60s"]
            row = Row(NVIDIA, "gpu-feature-discovery (--sleep-interval 60s)")
            nvidia_rows.append(row)
            log = f"{m.name}-node-gfd"
            running.append((row, procs.start(log, namespaced(m, gfd), env), "gpu-feature-discovery", log))
            export = transient(namespaced(m, [str(m.tools / "nvidia-mig-parted"), "export"]), env)
            nvidia_rows.append(Row(NVIDIA, "mig-manager: one nvidia-mig-parted export run", once=export, mig=True,
                                   in_totals=export.rc == 0,
                                   note="" if export.rc == 0 else f"exit {export.rc}: {export.note}"))
            # Settled: both plugins registered, our labeller and GFD labelled once, our MIG manager converged.
            settled = {
                "device plugins registered": wait_for(lambda: all(RESOURCE in k.endpoints for k in kubelets)),
                "GFD feature file written": wait_for(gfd_out.exists),
                "labeller patched the Node": wait_for(lambda: GPU_COUNT_LABEL in _node_labels(core)),
                    # all-disabled is a group leaving MIG: the manager rolls back (nothing to do here), clears the
                # label and watches the Node.
                "MIG manager converged": wait_for(lambda: _mig_settled(_node_labels(core))),
            }
            pids: dict[int, int] = {}
            for row, proc, exe, _ in running:
                if proc.poll() is None:
                    try:
                        pids[id(row)] = real_pid(proc.pid, exe)
                    except RuntimeError as e:
                        row.note = str(e)
            cpu_before = {key: tree_memory(pid).cpu_s for key, pid in pids.items()}
            time.sleep(idle_s)
            for row, proc, _, log in running:
                if proc.poll() is not None:
                    row.note = f"exited {proc.returncode} before sampling:\n{procs.log_tail(log)}"
                elif id(row) in pids:
                    row.memory = tree_memory(pids[id(row)])
                    row.idle_cpu = (row.memory.cpu_s - cpu_before[id(row)]) / idle_s
            left_out += [f"not settled within {WAIT_S:.0f}s: {what} (sampled anyway)"
                         for what, ok in settled.items() if not ok]
        finally:  # before kmock goes: the agents' shutdown paths talk to it
            procs.stop_many([proc for _, proc, _, _ in running])
            for k in kubelets:
                procs.stop_kubelet(k)
    return Footprint(nvidia_rows + our_rows, left_out, nvml_cost_kib(m), idle_s)


# --- report --------------------------------------------------------------------------------------


def _us(s: float) -> str:
    return f"{s * 1e6:.0f}"


def _answer(topo: Topology, answer: list[str] | str | None) -> tuple[str, int | None]:
    if answer is None:
        return "-", None
    if isinstance(answer, str):
        return answer if len(answer) < 90 else answer[:87] + "...", None
    idx = topo.indices(answer)
    return f"GPUs {','.join(map(str, idx))}", set_score(idx, topo.score)


def report_plugins(m: Machine, f: PluginFigures) -> tuple[bool, bool]:
    """Prints the plugin comparison; returns (Allocate p99 target met, preferred-score target met)."""
    print(f"\n=== {m.name}: nvidia-device-plugin vs ours, flags {' '.join(FLAGS)} ===")
    print(f"{'':44}{'NVIDIA':>12}{'ours':>12}{'ours/NVIDIA':>13}")
    ns, ours_ = statistics.median(f.starts[NVIDIA]), statistics.median(f.starts[OURS])
    print(f"{'start to registration, median of ' + str(STARTS) + ' (s)':44}{ns:>12.3f}{ours_:>12.3f}"
          f"{ratio(ours_, ns):>13}")
    ne, oe = statistics.median(f.exec_starts[NVIDIA]), statistics.median(f.exec_starts[OURS])
    print(f"{'  from the plugin exec, median (s)':44}{ne:>12.3f}{oe:>12.3f}{ratio(oe, ne):>13}")
    print("  (NVIDIA's start includes this harness's mount-namespace prelude before its exec; ours has none)")
    allocate_ok = True
    for size, samples in f.allocate.items():
        for name, p in (("p50", 50.0), ("p99", 99.0)):
            a, b = pct(samples[NVIDIA], p), pct(samples[OURS], p)
            if name == "p99" and b > a:
                allocate_ok = False
            print(f"{f'Allocate {size}-GPU {name} (us, {len(samples[OURS])} calls)':44}{_us(a):>12}{_us(b):>12}"
                  f"{ratio(b, a):>13}")
    pn, po = f.preferred[NVIDIA], f.preferred[OURS]
    for name, p in (("p50", 50.0), ("p99", 99.0)):
        a, b = pct(pn.ok, p), pct(po.ok, p)
        a_txt = _us(a) if pn.ok else (f"({_us(pct(pn.errors, p))} err)" if pn.errors else "n/a")
        print(f"{f'GetPreferredAllocation {name} (us, sizes 1-8)':44}{a_txt:>12}{_us(b) if po.ok else 'n/a':>12}"
              f"{ratio(b, a) if pn.ok else 'n/a':>13}")
    for side in (NVIDIA, OURS):
        mem = f.after_load[side]
        print(f"{side + ' process after the load':44}peak RSS {mib(mem.hwm_kib)} MiB, RSS {mib(mem.rss_kib)} MiB, "
              f"CPU {mem.cpu_s:.2f} s ({f.load_cpu_s[side]:.2f} s during the load)")
    print(f"{'peak RSS ratio ours/NVIDIA':44}{ratio(f.after_load[OURS].hwm_kib, f.after_load[NVIDIA].hwm_kib)}")
    print(f"\nGetPreferredAllocation answers, all 8 GPUs available, none required; links (our NVML view of the "
          f"mock): {f.topology.described}")
    print(f"{'size':>4}  {'best':>5}  {'ours (score)':28}  NVIDIA's (score)")
    preferred_ok = True  # ours answers every size, never below NVIDIA's score where NVIDIA's answers
    n = len(f.topology.uuids)
    nvidia_answered = 0
    for size in range(1, n + 1):
        best = exhaustive(n, f.topology.score, [], size)
        o_txt, o_score = _answer(f.topology, po.answers.get(size))
        n_txt, n_score = _answer(f.topology, pn.answers.get(size))
        nvidia_answered += n_score is not None
        if o_score is None or (n_score is not None and o_score < n_score):
            preferred_ok = False
        theirs = n_txt if n_score is None else f"{n_txt} ({n_score})"
        print(f"{size:>4}  {best:>5}  {o_txt + f' ({o_score})':28}  {theirs}")
    if nvidia_answered == 0 and pn.errors:
        print("  NVIDIA's plugin advertises GetPreferredAllocation but answered no size on this mock (above): its "
              "allocator reads the NVLink and PCIe topology from NVML, which the mock does not model.")
    return allocate_ok, preferred_ok


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def report_dra(m: Machine, f: DraFigures) -> tuple[bool, str]:
    """Prints the DRA comparison; returns (prepare p99 target met, the figures it was judged on)."""
    print(f"\n=== {m.name}: NVIDIA's gpu-kubelet-plugin {NVIDIA_DRA_VERSION} vs our dra-driver, one local API server "
          f"({', '.join(DRA_COMPONENTS)}) ===")
    print(f"{'':44}{'NVIDIA':>12}{'ours':>12}{'ours/NVIDIA':>13}")
    ns, os_ = statistics.median(f.starts[NVIDIA]), statistics.median(f.starts[OURS])
    print(f"{'start to published slices, median of ' + str(STARTS) + ' (s)':44}{ns:>12.3f}{os_:>12.3f}"
          f"{ratio(os_, ns):>13}")
    print("  (process start to its ResourceSlices listed, 0.1 s polls; NVIDIA's includes the mount-namespace prelude)")
    print(f"{'GPUs published':44}{f.devices[NVIDIA]:>12}{f.devices[OURS]:>12}")
    ok, judged = True, []
    for regime in (PACED, BURST):
        for name, p in (("p50", 50.0), ("p99", 99.0)):
            a, b = pct(f.prepare[regime][NVIDIA], p), pct(f.prepare[regime][OURS], p)
            if name == "p99":
                ok = ok and b <= a
                judged.append(f"{regime} p99 {_ms(b)} vs {_ms(a)} ms")
            print(f"{f'NodePrepare 1-GPU {name}, {regime} (ms)':44}{_ms(a):>12}{_ms(b):>12}{ratio(b, a):>13}")
        a, b = pct(f.unprepare[regime][NVIDIA], 50), pct(f.unprepare[regime][OURS], 50)
        print(f"{f'NodeUnprepare p50, {regime} (ms)':44}{_ms(a):>12}{_ms(b):>12}{ratio(b, a):>13}")
    cycles = len(f.prepare[PACED][OURS])
    print(f"  ({cycles} prepare+unprepare cycles per plugin and regime, each on a fresh one-GPU claim created up "
          f"front, the {f.devices[OURS]} GPUs in turn, after {DRA_WARMUP} warm-up cycles; both plugins up at once, "
          f"interleaved: paced = one cycle each per {DRA_PACE_S:.2f} s round, alternating first; back-to-back = "
          f"blocks of {DRA_BLOCK}, alternating. Prepare and unprepare are timed each alone, from the stand-in.)")
    print("  (NVIDIA's plugin talks to the API server through client-go's default limiter, --kube-api-qps 5 "
          "--kube-api-burst 10, and GETs the claim on every prepare: back-to-back, its prepares queue there.)")
    for side in (NVIDIA, OURS):
        mem, idle = f.after_load[side], f.idle[side]
        print(f"{side + ' process after the load':44}peak RSS {mib(mem.hwm_kib)} MiB, RSS {mib(mem.rss_kib)} MiB, "
              f"CPU {mem.cpu_s:.2f} s ({f.load_cpu_s[side]:.2f} s during the load); idle before it: RSS "
              f"{mib(idle.rss_kib)} MiB, CPU {f.idle_cpu[side] * 100:.2f}%")
    print(f"{'peak RSS ratio ours/NVIDIA':44}{ratio(f.after_load[OURS].hwm_kib, f.after_load[NVIDIA].hwm_kib)}")
    env = " ".join(f"{k}={v}" for k, v in f.plugin_env.items()) or "nothing"
    print(f"  (ours ran with what its DaemonSet sets: {env}; NVIDIA's with its chart's flags, tests/compare/dra.py)")
    return ok, f"{m.name}: " + "; ".join(judged)


def dra_rows(f: DraFigures) -> tuple[list[Row], list[str]]:
    """The two DRA plugins as footprint rows (their idle sample), and what the footprint leaves out of DRA mode."""
    rows = [Row(NVIDIA, f"gpu-kubelet-plugin {NVIDIA_DRA_VERSION}", memory=f.idle[NVIDIA],
                idle_cpu=f.idle_cpu[NVIDIA], mode=DRA_MODE),
            Row(OURS, f"{dra_manifests.COMPONENT} (dra-driver)", memory=f.idle[OURS], idle_cpu=f.idle_cpu[OURS],
                mode=DRA_MODE)]
    left_out = [f"ours, DRA group: its node runs {', '.join(f.node_containers)} (rendered); the gpu-labeller "
                "row is the device-plugin group's (a DRA group's takes its sharing as flags instead of the plugin's "
                "ConfigMap)"]
    return rows, left_out


def report_footprint(m: Machine, fp: Footprint) -> tuple[bool, list[str]]:
    print(f"\n=== {m.name}: per-node footprint, idle (daemonset node-setup backend, {MODELS[m.name]} group, "
          "whole GPUs) ===")
    print(f"{'side':7}{'process':58}{'VmRSS MiB':>10}{'VmHWM MiB':>10}{'CPU s':>7}{'idle CPU':>10}")
    for r in fp.rows:
        idle = "-"
        if r.memory is not None:
            rss, hwm, cpu = mib(r.memory.rss_kib), mib(r.memory.hwm_kib), f"{r.memory.cpu_s:.2f}"
            idle = f"{r.idle_cpu * 100:.2f}%" if math.isfinite(r.idle_cpu) else "-"
        elif r.once is not None:
            rss, hwm, cpu = "-", mib(r.once.peak_kib), f"{r.once.cpu_s:.2f}"
        else:
            rss = hwm = cpu = "-"
        name = (r.name + (" [MIG]" if r.mig else "") + {"": "", DEVICE_PLUGIN_MODE: " [DP]", DRA_MODE: " [DRA]"}[r.mode]
                + ("" if r.in_totals else " [not in totals]"))
        print(f"{r.side:7}{name:58}{rss:>10}{hwm:>10}{cpu:>7}{idle:>10}" + (f"  {r.note}" if r.note else ""))
    print(f"(CPU s: since start; idle CPU: over the {fp.idle_s:.0f} s before sampling; [MIG]: only on nodes carrying "
          "nvidia.com/mig.config; [DP] / [DRA]: only on device-plugin / DRA nodes, the [DRA] rows sampled in the DRA "
          "run above, on its API server, idle before the prepare load)")
    dra_ran = any(r.mode == DRA_MODE for r in fp.rows)

    def total(side: str, mig: bool, skip: str = "", mode: str = DEVICE_PLUGIN_MODE) -> tuple[int, int]:
        rss = hwm = 0
        for r in fp.rows:
            if (r.side != side or not r.in_totals or (r.mig and not mig) or (skip and r.name.startswith(skip))
                    or r.mode not in ("", mode)):
                continue
            if r.memory is not None:
                rss, hwm = rss + r.memory.rss_kib, hwm + r.memory.hwm_kib
            elif r.once is not None:  # a short-lived run counts with its peak in both columns
                rss, hwm = rss + r.once.peak_kib, hwm + r.once.peak_kib
        return rss, hwm

    print(f"\n{'mode (totals)':58}{'NVIDIA RSS':>11}{'ours RSS':>10}{'ratio':>8}{'NVIDIA HWM':>11}{'ours HWM':>10}"
          f"{'ratio':>8}")
    ok = True
    verdicts = []
    modes = [("whole GPUs", False, "", DEVICE_PLUGIN_MODE),
             ("whole GPUs, Deckhouse backend (no setup pod)", False, "gpu-setup-hold", DEVICE_PLUGIN_MODE),
             ("+ MIG manager (node carries nvidia.com/mig.config)", True, "", DEVICE_PLUGIN_MODE),
             ("+ MIG manager, Deckhouse backend", True, "gpu-setup-hold", DEVICE_PLUGIN_MODE)]
    if dra_ran:
        modes += [("DRA: kubelet plugin (NVIDIA's + GFD), whole GPUs", False, "", DRA_MODE),
                  ("DRA, Deckhouse backend (no setup pod)", False, "gpu-setup-hold", DRA_MODE)]
    for label, mig, skip, mode in modes:
        (nr, nh), (orss, oh) = total(NVIDIA, mig, mode=mode), total(OURS, mig, skip, mode)
        if orss > nr:
            ok = False
        verdicts.append(f"{label}: {mib(orss)} vs {mib(nr)} MiB")
        print(f"{label:58}{mib(nr):>11}{mib(orss):>10}{ratio(orss, nr):>8}{mib(nh):>11}{mib(oh):>10}"
              f"{ratio(oh, nh):>8}")
    print("Totals: VmRSS of the long-running processes after settling, plus NVIDIA's MIG manager as one mig-parted "
          "run's peak; our setup init runs once before the rest and is not counted.")
    if dra_ran:
        print("DRA: NVIDIA's node runs gpu-kubelet-plugin + GFD (the GPU operator runs GFD beside NVIDIA's DRA driver; "
              f"without it NVIDIA's total is {mib(total(NVIDIA, False, 'gpu-feature-discovery', DRA_MODE)[0])} MiB); "
              "ours runs the DRA plugin, labeller and setup hold (and no device plugin).")
    else:
        print("DRA: not measured (the DRA section did not run)")
    print(f"Each process that loads the mock NVML carries about {mib(fp.nvml_kib)} MiB of the mock library itself "
          "(a Go runtime and its machine model): real NVML costs differ.")
    print("Left out:")
    for item in fp.left_out:
        print(f"  - {item}")
    return ok, verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--machine", action="append", choices=sorted(MODELS),
                        help="mock machine (repeatable; default dgxh100)")
    parser.add_argument("--idle-s", type=float, default=SETTLE_S, metavar="SECONDS",
                        help="seconds at rest over which each process's idle CPU is measured (default: %(default)s; "
                             "a CPU tick is 10 ms, so a minute resolves 0.02%% of a core)")
    args = parser.parse_args()
    names: list[str] = args.machine or ["dgxh100"]
    work = Path(tempfile.mkdtemp(prefix="bench-vs-nvidia-"))
    logs = work / "logs"
    logs.mkdir()
    procs = Processes(logs)
    started = time.monotonic()
    verdicts: dict[str, list[tuple[bool, str]]] = {"allocate": [], "preferred": [], "prepare": [], "footprint": []}
    dra_skipped: list[str] = []
    try:
        for name in names:
            try:
                m = machine(name, work / name)
            except pytest.skip.Exception as e:
                print(f"skipped: {e}")
                return 0
            figures = compare_plugins(procs, m, work / name)
            allocate_ok, preferred_ok = report_plugins(m, figures)
            p99 = ", ".join(f"{s}-GPU {_us(pct(figures.allocate[s][OURS], 99))} vs "
                            f"{_us(pct(figures.allocate[s][NVIDIA], 99))} us" for s in figures.allocate)
            verdicts["allocate"].append((allocate_ok, f"{name}: {p99}"))
            answered = sum(isinstance(a, list) for a in figures.preferred[NVIDIA].answers.values())
            verdicts["preferred"].append((preferred_ok, f"{name}: ours answered every size with the best score on "
                                                        f"the mock's links; NVIDIA's answered {answered} of 8"))
            extra_rows: list[Row] = []
            extra_left_out: list[str] = []
            # A machine of its own under a short root: unix socket paths (107 bytes) under the plugins' roots.
            dra_root = Path(tempfile.mkdtemp(prefix="nvb-", dir="/tmp"))
            try:
                dm = machine(name, dra_root)
                dra_figures = compare_dra(dm, dra_root, args.idle_s)
            except pytest.skip.Exception as e:
                print(f"\n=== {name}: DRA kubelet plugins ===\nskipped: {e}")
                dra_skipped.append(f"{name}: skipped ({e})")
                extra_left_out.append(f"DRA mode: not measured ({e})")
            else:
                prepare_ok, prepare_text = report_dra(dm, dra_figures)
                verdicts["prepare"].append((prepare_ok, prepare_text))
                extra_rows, extra_left_out = dra_rows(dra_figures)
            finally:
                if os.environ.get("BENCH_KEEP"):
                    print(f"(DRA machine and logs kept: {dra_root})")
                else:
                    shutil.rmtree(dra_root, ignore_errors=True)
            fp = footprint(procs, m, work / name, args.idle_s)
            fp.rows = sorted(fp.rows + extra_rows, key=lambda r: r.side != NVIDIA)  # each side's DRA row last
            fp.left_out += extra_left_out
            fp_ok, fp_text = report_footprint(m, fp)
            verdicts["footprint"].append((fp_ok, f"{name}: " + "; ".join(fp_text)))
    except (RuntimeError, OSError, grpc.RpcError, subprocess.SubprocessError) as e:
        print(f"\nbench failed: {e}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        if os.environ.get("BENCH_KEEP"):
            print(f"(work directory and logs kept: {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)

    def verdict(key: str) -> str:
        if not verdicts[key]:
            return "n/a"
        return "MET" if all(ok for ok, _ in verdicts[key]) else "MISSED"

    print("\n=== targets (issue) ===")
    for key, target in (("allocate", "Allocate no slower than NVIDIA's at p99"),
                        ("preferred", "preferred allocation never worse in score"),
                        ("prepare", "prepare no slower than NVIDIA's at p99 (DRA NodePrepareResources, paced and "
                                    "back-to-back)"),
                        ("footprint", "per-node memory footprint no larger than NVIDIA's stack")):
        print(f"{verdict(key):7}{target}")
        for text in [t for _, t in verdicts[key]] + (dra_skipped if key == "prepare" else []):
            print(f"       {text}")
    print(f"\n(run took {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--links"]:
        raise SystemExit(links_main())
    raise SystemExit(main())
