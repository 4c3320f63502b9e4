"""What the driver upgrade controller's idle round costs the API server, against a real kube-apiserver on
loopback.

The controller runs a round every 5 s for as long as the stack has container-sourced drivers, so its idle
round (every driver pod current, nothing to do) is what it costs a cluster almost all the time. One
throwaway etcd and kube-apiserver (the pinned build, ``make tools``), a driver DaemonSet of the stack's
rendering, and N Nodes of its group each with a current driver pod. Measured in one run, so the ratios hold
on a noisy machine:

* the idle round: its median time and its requests (a list of the DaemonSets, one of each DaemonSet's
  pods, one of the groups' nodes: the same for 10 nodes as for 200);
* the floor: one list of the N nodes, the least a round that looks at every node can read;
* the peer: a read of each node, N GETs, what a round reading node by node would cost.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import median_ms  # noqa: E402
from localcluster import ControlPlane, tools_bin  # noqa: E402
from localcluster.objects import kwok_node  # noqa: E402
from node_agent.driverupgrade.controller import UpgradeController  # noqa: E402
from node_agent.kube import nodes  # noqa: E402
from node_agent.kube.transport import Kube as AgentKube  # noqa: E402
from nvgpu import labels  # noqa: E402
from nvgpu.driver import DRIVER_SPEC_ANNOTATION  # noqa: E402
from nvgpu.stackconfig import load_stack_config  # noqa: E402
from nvidia_gpu.components.manifests import driver  # noqa: E402

NS = "bench-drivers"
SIZES = (10, 200)
RUNS = 15


def _driver_pod(ds: dict[str, Any], node: str) -> dict[str, Any]:
    template = ds["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{ds['metadata']['name']}-{node}", "namespace": NS,
                         "labels": template["metadata"]["labels"], "annotations": template["metadata"]["annotations"],
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "controller": True,
                                              "name": ds["metadata"]["name"], "uid": ds["metadata"]["uid"]}]},
            "spec": {"nodeName": node, "containers": [{"name": "nvidia-driver-ctr",
                                                       "image": template["spec"]["containers"][0]["image"]}]}}


def main() -> None:
    cfg = load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "namespace": NS,
                    "agentImage": {"repository": "registry.example.com/agent", "tag": "1.0.0"}},
        "nodeGroups": [{"name": "bench", "nodeSelector": {"matchLabels": {"pool": "bench"}},
                        "gpu": {"model": "H100-80GB", "driver": {"source": "container", "version": "550.90.07",
                                                                 "osReleases": ["ubuntu22.04"]}}}]})
    (manifest,) = driver.driver_daemonsets(NS, cfg.cluster, cfg.node_groups[0])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-driver-upgrade-") as tmp:
        cp = ControlPlane(directory=Path(tmp) / "cp", components=("etcd", "kube-apiserver"), bin_dir=tools_bin())
        cp.start(timeout=90)
        try:
            admin = cp.admin()
            admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            # No controller manager here to make the namespace's default ServiceAccount, which pods need.
            admin.create({"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": "default", "namespace": NS}})
            admin.create(manifest)
            ds = admin.get("apps/v1", "DaemonSet", manifest["metadata"]["name"], NS)
            assert DRIVER_SPEC_ANNOTATION in ds["spec"]["template"]["metadata"]["annotations"]
            kube = AgentKube.connect(cp.kubeconfig)
            made = 0
            for size in SIZES:
                for i in range(made, size):
                    name = f"gpu-{i:03d}"
                    admin.create(kwok_node(name, {"pool": "bench", labels.NODE_GROUP: "bench"}, gpus=8))
                    admin.create(_driver_pod(ds, name))
                made = size
                controller = UpgradeController(kube, NS)
                first = controller.run_round()
                assert len(first.steps) == size and all(s.act.value == "nothing" for s in first.steps.values())
                before = kube.calls
                controller.run_round()
                requests = kube.calls - before
                round_ms = median_ms(controller.run_round, RUNS)
                list_ms = median_ms(lambda: kube.items(nodes.NODES, query={"labelSelector": labels.NODE_GROUP}),
                                    RUNS)
                names = [f"gpu-{i:03d}" for i in range(size)]
                gets_ms = median_ms(lambda names=names: [nodes.get_node(kube, n) for n in names], RUNS)  # type: ignore[misc]
                rows.append((size, requests, round_ms, list_ms, gets_ms))
        finally:
            cp.stop()
    print(f"driver upgrade controller, idle round against kube-apiserver on loopback ({RUNS} runs, medians):")
    for size, requests, round_ms, list_ms, gets_ms in rows:
        print(f"  {size:4d} nodes: round {round_ms:7.1f} ms in {requests} requests;"
              f" floor (list the nodes) {list_ms:6.1f} ms -> {round_ms / list_ms:.2f}x;"
              f" peer (GET each node) {gets_ms:7.1f} ms -> round is {round_ms / gets_ms:.2f}x of it")


if __name__ == "__main__":
    main()
