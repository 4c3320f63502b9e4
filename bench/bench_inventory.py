"""What keeping the GPU inventory costs a labeller run, against a real kube-apiserver on loopback.

One throwaway etcd and kube-apiserver (the pinned build, ``make tools``), the stack's CRD, one Node, an
8-GPU simulated DGX H100 read through the agent's NVML layer. Measured in one run, so the ratios hold
on a noisy machine:

* the first sync (8 creates and 8 status patches),
* a steady sync (nothing changed: one list), against one GET of the Node (what every labeller run does
  anyway to read its labels), as a ratio,
* a sync after a MIG layout change (8 status patches, 56 MIG instances),
* a sync after a GPU is lost (one status patch).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import median_ms  # noqa: E402
from localcluster import ControlPlane, tools_bin  # noqa: E402
from localcluster.dryrun import install_crds  # noqa: E402
from localcluster.objects import kwok_node  # noqa: E402
from node_agent.kube.transport import Kube as AgentKube  # noqa: E402
from node_agent.labeller import inventory  # noqa: E402
from node_agent.labeller.inventory import InventoryContext  # noqa: E402
from node_agent.nvml import NvmlBackend, open_nvml  # noqa: E402
from nvgpu import inventory as api  # noqa: E402
from nvgpu.migparted import build_config  # noqa: E402
from nvidia_gpu.components.manifests.inventory import crd  # noqa: E402
from nvml_sim import SimulatedMachine, provider  # noqa: E402
from tests.kit.fakehost import build_fake_host, sim_state_file  # noqa: E402

provider.register()  # in-process simulated:<machine> sessions, as node_agent.cli registers it

MACHINE = "dgx-h100"
NODE = "bench-h100"
RUNS = 30



def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-inventory-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(directory=work / "cp", components=("etcd", "kube-apiserver"), bin_dir=tools_bin())
        cp.start(timeout=90)
        try:
            admin = cp.admin()
            crd_file = work / "crd.yaml"
            crd_file.write_text(yaml.safe_dump(crd("nvidia-gpu")))
            install_crds(admin, [crd_file])
            admin.create(kwok_node(NODE))
            uid = admin.get("v1", "Node", NODE)["metadata"]["uid"]
            kube = AgentKube.connect(cp.kubeconfig)
            root = build_fake_host(work / "host", MACHINE).root
            state = sim_state_file(root, MACHINE)
            ctx = InventoryContext(sharing="MIG", mig_strategy="mixed")

            def read() -> tuple[object, object]:
                with open_nvml(NvmlBackend("simulated", MACHINE, state)) as nvml:
                    return nvml.inventory(), nvml.driver()

            def sync() -> inventory.SyncResult:
                inv, driver = read()
                return inventory.sync(kube, NODE, inv, driver, ctx, node_uid=lambda: uid)  # type: ignore[arg-type]

            def timed(call: Callable[[], inventory.SyncResult]) -> tuple[float, inventory.SyncResult]:
                start = time.perf_counter()
                result = call()
                return (time.perf_counter() - start) * 1000, result

            first_ms, first = timed(sync)
            assert len(first.created) == 8, first
            steady_ms = median_ms(sync)
            node_get_ms = median_ms(lambda: kube.get(f"/api/v1/nodes/{NODE}"))
            nvml_ms = median_ms(read)
            config = work / "mig.yaml"
            config.write_text(build_config().to_yaml())
            subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(root), "--nvml",
                            f"simulated:{MACHINE}", "mig", "apply", "--config", str(config), "--name", "all-1g.10gb"],
                           check=True, capture_output=True, cwd=REPO, timeout=120)
            mig_ms, mig = timed(sync)
            assert len(mig.updated) == 8, mig
            SimulatedMachine(MACHINE, state).lose_gpu(5)
            lost_ms, lost = timed(sync)
            assert lost.updated == (api.object_name(NODE, 5),), lost
        finally:
            cp.stop()
    print(f"GPU inventory of an 8-GPU node against kube-apiserver on loopback ({RUNS} runs, medians):")
    print(f"  first sync (8 creates + 8 status patches): {first_ms:7.1f} ms")
    print(f"  steady sync (one list, nothing written):  {steady_ms:7.1f} ms, of which reading NVML {nvml_ms:.1f} ms")
    print(f"  one GET of the Node (every run does it):  {node_get_ms:7.1f} ms  -> steady sync = "
          f"{steady_ms / node_get_ms:.1f}x a Node GET")
    print(f"  after a MIG change (8 patches, 56 MIG instances): {mig_ms:7.1f} ms")
    print(f"  after a GPU is lost (1 patch):            {lost_ms:7.1f} ms")


if __name__ == "__main__":
    main()
