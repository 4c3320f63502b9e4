"""DRA kubelet plugin: prepare latency over the socket, start-to-published slices, peak RSS.

In one run, with a local API stand-in (``bench/local_api.py``) serving the claim reads on loopback:

* the real plugin process (``python -m node_agent dra-driver`` on the simulated ``dgx-h100``) is
  registered by the kubelet stand-in; NodePrepareResources for a one-GPU claim is timed over the unix
  socket (each followed by an untimed NodeUnprepareResources, so every call does the full work:
  claim read, node lock, two journal writes, a CDI spec). Also timed: an empty NodePrepareResources
  (the gRPC round-trip floor) for the ratio. Target: p99 < 20 ms.
* start to published slices on ``dgx-h100``: in-process (NVML open, inventory, checkpoint recovery,
  ResourceSlice publication) and for the whole process (interpreter start and imports included).
  Target: < 1 s.
* the plugin process's peak RSS (VmHWM) after the prepare load. Target: < 80 MiB.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from bench.local_api import LocalApi  # noqa: E402
from node_agent.dra.api import KubeDraApi  # noqa: E402
from node_agent.dra.driver import DraDriver, DriverSettings  # noqa: E402
from node_agent.dra.nvml_source import NvmlInventorySource  # noqa: E402
from node_agent.host.root import HostRoot  # noqa: E402
from node_agent.kube.transport import Kube  # noqa: E402
from nvml_sim import provider  # noqa: E402
from tests.kit.dra_builders import DRIVER, NODE, RecordingSharing, claim, machine, populate_dev  # noqa: E402
from tests.kit.kubelet.dra import DraKubelet  # noqa: E402

provider.register()  # in-process simulated:<machine> sessions, as node_agent.cli registers it

ITERATIONS = int(os.environ.get("BENCH_ITERATIONS", "300"))


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def new_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    boot = root / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("bench-boot\n")
    populate_dev(root, machine(gpus=8))  # /dev/nvidia0..7 and the control nodes of a DGX H100
    return root


def api_client(server: LocalApi) -> Kube:
    return Kube.for_url(server.url.rstrip("/"))


def in_process_start(server: LocalApi) -> float:
    root = new_root()
    try:
        started = time.perf_counter()
        host = HostRoot(root)
        source = NvmlInventorySource("simulated:dgx-h100", host)
        driver = DraDriver(DriverSettings(driver=DRIVER, node=NODE), api=KubeDraApi(api_client(server)),
                           source=source, host=host, backend=RecordingSharing())
        pub = driver.start()
        elapsed = time.perf_counter() - started
        assert pub is not None and pub.devices == 8, pub
        driver.publisher.withdraw()
        driver.close()
        source.close()
        return elapsed
    finally:
        shutil.rmtree(root, ignore_errors=True)


def kubeconfig(server: LocalApi, directory: Path) -> Path:
    path = directory / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: b\n"
        f"clusters: [{{name: b, cluster: {{server: '{server.url.rstrip('/')}'}}}}]\n"
        "users: [{name: b, user: {}}]\ncontexts: [{name: b, context: {cluster: b, user: b}}]\n")
    return path


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    with LocalApi() as server:
        server.nodes[NODE] = {"metadata": {"name": NODE, "uid": "node-uid"}}
        starts = [in_process_start(server) for _ in range(5)]
        root = new_root()
        # The DaemonSet's environment (nvidia_gpu/components/manifests/dra.py) sets MALLOC_ARENA_MAX=2 too.
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2"}
        cmd = [sys.executable, "-m", "node_agent", "--host-root", str(root), "--nvml", "simulated:dgx-h100",
               "--node-name", NODE, "--kubeconfig", str(kubeconfig(server, root)), "--log-level",
               os.environ.get("BENCH_LOG", "warning"), "dra-driver"]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        try:
            while not server.slices and time.perf_counter() - started < 30:
                time.sleep(0.002)
            process_start = time.perf_counter() - started
            kubelet = DraKubelet(root)
            kubelet.register(timeout=30)
            refs = []
            for i in range(ITERATIONS):
                server.claims[("team-a", f"c{i}")] = claim(f"c{i}", f"uid-{i}", [("gpu", "gpu-0")])
                refs.append(("team-a", f"c{i}", f"uid-{i}"))
            floor: list[float] = []
            prepare: list[float] = []
            for ref in refs:
                t = time.perf_counter()
                kubelet.prepare(DRIVER, [])
                floor.append(time.perf_counter() - t)
                t = time.perf_counter()
                resp = kubelet.prepare(DRIVER, [ref])
                prepare.append(time.perf_counter() - t)
                assert resp.claims[ref[2]].error == "", resp.claims[ref[2]].error
                assert kubelet.unprepare(DRIVER, [ref]).claims[ref[2]].error == ""
            hwm = vm_hwm_kib(proc.pid)
            kubelet.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            shutil.rmtree(root, ignore_errors=True)

    p50, p99 = pct(prepare, 50) * 1e3, pct(prepare, 99) * 1e3
    f50, f99 = pct(floor, 50) * 1e3, pct(floor, 99) * 1e3
    start_ms = statistics.median(starts) * 1e3
    print(f"NodePrepareResources, one-GPU claim over the socket ({ITERATIONS} calls, claim read from a local API):")
    print(f"  p50 {p50:.2f} ms   p99 {p99:.2f} ms   (target p99 < 20 ms: {'ok' if p99 < 20 else 'MISSED'})")
    print(f"  empty-call floor p50 {f50:.2f} ms  p99 {f99:.2f} ms  ->  prepare/floor p50 {p50 / f50:.1f}x, "
          f"p99 {p99 / f99:.1f}x")
    print("start to published slices on dgx-h100 (8 GPUs):")
    print(f"  in-process median {start_ms:.0f} ms (target < 1000 ms: {'ok' if start_ms < 1000 else 'MISSED'})")
    print(f"  whole process from exec (interpreter + imports) {process_start * 1e3:.0f} ms")
    print(f"peak RSS of the plugin process: {hwm / 1024:.1f} MiB "
          f"(target < 80 MiB: {'ok' if hwm / 1024 < 80 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
