"""What a scrape of the agent exporter costs on an 8-GPU DGX H100 with 56 MIG devices, and its footprint.

Measured in one run, so the ratios hold on a noisy machine (the simulated NVML stands in for the driver:
absolute times are the exporter's own work plus the simulator's, not a real GPU's):

* one scrape (every default field of 8 GPUs, the framebuffer of 56 MIG devices, pod labels from a
  PodResources stand-in with a pod on each MIG device), against the floor: the same NVML readings with
  nothing made of them (inventory, telemetry and MIG memory per GPU), as a ratio;
* the size of one ``/metrics`` answer and its series count;
* the exporter process's resident memory and CPU time after 100 scrapes over HTTP.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import median_ms  # noqa: E402
from node_agent.exporter import counters  # noqa: E402
from node_agent.exporter.service import MetricsService  # noqa: E402
from node_agent.kubelet.podresources.client import PodResourcesClient  # noqa: E402
from node_agent.nvml import NvmlBackend, open_nvml  # noqa: E402
from nvgpu.migparted import build_config  # noqa: E402
from nvml_sim import provider  # noqa: E402
from tests.kit.fakehost import build_fake_host, sim_state_file  # noqa: E402
from tests.kit.kubelet.podresources import Container, Pod, pod_resources  # noqa: E402

provider.register()  # in-process simulated:<machine> sessions, as node_agent.cli registers it

MACHINE = "dgx-h100"
RUNS = 30



def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-exp-", dir="/tmp") as tmp:
        work = Path(tmp)
        root = build_fake_host(work / "host", MACHINE).root
        config = work / "mig.yaml"
        config.write_text(build_config().to_yaml())
        subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(root), "--nvml", f"simulated:{MACHINE}",
                        "mig", "apply", "--config", str(config), "--name", "all-1g.10gb"], check=True, cwd=REPO,
                       capture_output=True, timeout=300)
        backend = NvmlBackend("simulated", MACHINE, sim_state_file(root, MACHINE))
        with open_nvml(backend) as nvml:
            gpus = nvml.inventory().gpus
        pods = [Pod(f"job-{m.uuid}"[:40], "ml", [Container("c", devices={"nvidia.com/mig-1g.10gb": [str(m.uuid)]})])
                for g in gpus for m in g.mig_devices]
        sock = work / "kubelet.sock"
        with pod_resources(sock, pods), open_nvml(backend) as floor_nvml:
            client = PodResourcesClient(str(sock))
            service = MetricsService(lambda: open_nvml(backend), counters.default(), "bench",
                                     pod_resources=client.list)
            try:
                body = service.render()

                def floor() -> None:
                    for g in floor_nvml.inventory().gpus:
                        floor_nvml.telemetry(g.index)
                        floor_nvml.mig_memory(g.index)

                scrape_ms = median_ms(service.render)
                floor_ms = median_ms(floor)
            finally:
                service.close()
                client.close()
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        print(f"agent exporter on a simulated {MACHINE}, 8 GPUs, 56 MIG devices each held by a pod ({RUNS} runs, "
              "medians):")
        print(f"  one scrape:                       {scrape_ms:8.1f} ms  ({series} series, {len(body) / 1024:.0f} KiB)")
        print(f"  the NVML readings alone (floor):  {floor_ms:8.1f} ms  -> scrape = {scrape_ms / floor_ms:.2f}x floor")
        _footprint(root)


def _footprint(root: Path) -> None:
    port = 19411
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "node_agent", "--host-root", str(root), "--nvml",
                             f"simulated:{MACHINE}", "--node-name", "bench", "exporter", "--listen",
                             f"127.0.0.1:{port}", "--no-pod-labels"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for _ in range(100):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        print(f"  exporter process after 101 scrapes: {rss / 1024:.1f} MiB resident, {cpu_s:.2f} s CPU "
              f"(start-up included; {resource.getpagesize()} B pages)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
