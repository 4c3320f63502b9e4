"""A real GPU node (issue 35): what a fresh node costs, measured on the real kubelet, containerd and runc.

One run on one machine (root): a control plane, one node with ``--machine dgx-h100`` (``localcluster.node``),
the agent and probe images imported, then the daemonset stack of ``tests/cluster/test_real_node_stack.py``
(device plugin group) by the real CLI, and:

* **to the first GPU pod**: from the start of ``pulumi up`` to a pod asking for one GPU Running (setup's
  containerd restart, the gate, the device plugin's registration, the NVIDIA runtime's jit-CDI);
* **allocation latency**: pods created one at a time, each until Running, without a GPU and with one (the
  same image, the same command), as the median of the rounds; the ratio is what a GPU costs a pod's start
  on this node (the NVIDIA runtime's CDI spec from NVML, the device plugin's Allocate, the CDI hook);
* **memory**: each agent pod's memory as the node's cgroups account it (``memory.usage_in_bytes`` of the
  pod's cgroup under the node's tree, page cache included, as the kubelet reports it), and their sum.

    .venv/bin/python bench/bench_real_node.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster import ControlPlane, Kube, tools_bin  # noqa: E402
from localcluster.images import agent_archive, local_ca_dir, probe_archive  # noqa: E402
from localcluster.node import CGROUP_V1, Node, add_node  # noqa: E402
from tests.cluster.pulumi_project import make_project  # noqa: E402

NODE, NS = "gpu1", "nvidia-gpu"
CONFIG = """\
config:
  nvidia-gpu:cluster:
    kubernetesVersion: "1.34"
    namespace: nvidia-gpu
    nodeSetup: daemonset
    agentImage: {repository: localhost/nvidia-gpu-agent, digest: DIGEST, pullPolicy: Never}
    monitoring: {enabled: true, exporter: agent, scrape: annotations}
    kubeContext: prod
  nvidia-gpu:nodeGroups:
    - name: h100
      nodeSelector: {matchLabels: {example.com/gpu-pool: h100}}
      gpu: {model: H100-80GB, driverVersion: "550.54.15", sharing: Exclusive}
"""


def pod(name: str, image: str, gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never",
                                 "command": ["sleep", "3600"]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [container],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "nodeSelector": {"kubernetes.io/hostname": NODE}}}


def until_running(kube: Kube, name: str, timeout: float = 120.0) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if kube.get("v1", "Pod", name, "default").get("status", {}).get("phase") == "Running":
            return time.perf_counter() - start
        time.sleep(0.05)
    raise TimeoutError(f"pod {name} not Running after {timeout:.0f} s")


def start_latency(kube: Kube, name: str, image: str, gpus: int) -> float:
    kube.create(pod(name, image, gpus))
    seconds = until_running(kube, name)
    kube.delete("v1", "Pod", name, "default", gracePeriodSeconds="0")
    while kube.get_or_none("v1", "Pod", name, "default") is not None:
        time.sleep(0.1)
    return seconds


def pod_memory(node: Node, kube: Kube) -> dict[str, int]:
    """Agent pod name -> bytes its cgroup holds (the node's memory hierarchy)."""
    by_uid = {p["metadata"]["uid"].replace("-", "_"): p["metadata"]["name"] for p in kube.list("v1", "Pod", NS)
              if p["spec"].get("nodeName") == NODE}
    by_uid |= {k.replace("_", "-"): v for k, v in by_uid.items()}
    out = {}
    for usage in (CGROUP_V1 / "memory" / node.cgroup_root).rglob("memory.usage_in_bytes"):
        cgroup = usage.parent.name
        if cgroup.startswith("pod") and cgroup[3:] in by_uid:
            out[by_uid[cgroup[3:]]] = int(usage.read_text())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bin_dir = tools_bin()
    with tempfile.TemporaryDirectory(prefix="bench-real-node-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        digest = agent_archive(work / "agent.tar", "localhost/nvidia-gpu-agent:bench", buildah_root=work / "buildah",
                               ca_dir=local_ca_dir())
        probe = probe_archive(work / "probe.tar", "localhost/nvidia-gpu-test/gpu-probe:1",
                              REPO / "tests" / "cluster" / "gpu_probe.c")
        print(f"images built and exported: {time.perf_counter() - t:.1f} s")
        cp = ControlPlane(directory=work / "cluster", bin_dir=bin_dir,
                          components=("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"))
        cp.start()
        try:
            kube = cp.admin()
            t = time.perf_counter()
            node = add_node(cp.directory, NODE, bin_dir, kube, images=[work / "agent.tar", work / "probe.tar"],
                            machine="dgx-h100")
            print(f"node added and Ready: {time.perf_counter() - t:.1f} s")
            kube.patch("v1", "Node", NODE, {"metadata": {"labels": {"example.com/gpu-pool": "h100"}}})
            project = make_project(cp, work / "project", stack="prod")
            project.config_file().write_text(CONFIG.replace("DIGEST", digest))
            project.pulumi("stack", "init", "prod")
            image = f"localhost/nvidia-gpu-test/gpu-probe@{probe}"
            t = time.perf_counter()
            project.pulumi("up", "--yes", "--skip-preview", timeout=900)
            up = time.perf_counter() - t
            kube.create(pod("first", image, 1))
            until_running(kube, "first", timeout=300)
            first = time.perf_counter() - t
            kube.delete("v1", "Pod", "first", "default", gracePeriodSeconds="0")
            print(f"pulumi up: {up:.1f} s; from its start to the first GPU pod Running: {first:.1f} s")

            plain, gpu = [], []
            for i in range(args.rounds):
                plain.append(start_latency(kube, f"plain-{i}", image, 0))
                gpu.append(start_latency(kube, f"gpu-{i}", image, 1))
            p, g = statistics.median(plain), statistics.median(gpu)
            print(f"pod create -> Running, median of {args.rounds}: without a GPU {p:.2f} s, with one {g:.2f} s, "
                  f"ratio {g / p:.2f}")

            time.sleep(10)  # the agents at rest
            memory = pod_memory(node, kube)
            for name, used in sorted(memory.items()):
                print(f"  {name:40s} {used / 2**20:7.1f} MiB")
            print(f"agents' memory on the node (cgroups): {sum(memory.values()) / 2**20:.1f} MiB "
                  f"in {len(memory)} pods")
            project.pulumi("destroy", "--yes", "--skip-preview", timeout=900, check=False)
        finally:
            cp.stop(remove=False)


if __name__ == "__main__":
    main()
