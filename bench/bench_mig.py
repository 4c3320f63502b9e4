"""MIG: plan+apply time on 8-GPU simulated nodes, and API calls per reconfiguration.

In one run, through nvidia-ml-py with the simulated machines underneath (the production NVML code):

* plan + apply (mode change, instances, verification) of ``all-balanced`` from MIG off, then a
  re-layout to ``all-<smallest profile>``, on every simulated MIG machine. Target: < 1 s per 8-GPU node.
  Measured with the simulator in memory (the production code path; the figure that matters) and with
  its state in a shared JSON file (what separate processes use; every NVML mutation rewrites the file,
  which is simulator cost, not agent cost).
* a whole reconfiguration by the MIG manager (journal, state machine, Node flow) on ``dgx-h100``,
  Deckhouse approval flow and cordon flow, waits excluded (the fake cluster answers at once): wall
  time, ratio to the bare plan+apply, and the number of Kubernetes API calls.
* the same cordon-flow reconfiguration through the real ``kubernetes`` client against a kmock API
  server on loopback: HTTP calls and wall time (kmock answers each call in ~10-30 ms).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402

from node_agent.mig import apply  # noqa: E402
from node_agent.mig.executor import MigManager, Settings  # noqa: E402
from node_agent.mig.hardware import snapshot  # noqa: E402
from node_agent.mig.kube import KubeNodeApi  # noqa: E402
from node_agent.mig.machine import DrainMode  # noqa: E402
from node_agent.mig.nvmlbackend import NvmlMigBackend, SimulatedReset  # noqa: E402
from node_agent.mig.plan import diff, plan  # noqa: E402
from node_agent.nvml import NvmlBackend, open_nvml  # noqa: E402
from nvgpu import labels  # noqa: E402
from nvgpu.migparted import build_config  # noqa: E402
from nvml_sim import MACHINES, provider  # noqa: E402
from tests.kit.kmock import api, kmock_server, kube  # noqa: E402
from tests.node_agent.mig.fakes import Clock, FakeNode, MemoryFiles, Rebooter, StepLock, pod  # noqa: E402
from tests.node_agent.mig.harness import clients_leave, deckhouse_approver  # noqa: E402

provider.register()  # in-process simulated:<machine> sessions, as node_agent.cli registers it

CONFIG = build_config()
RUNS = 5
TARGET_S = 1.0


def _smallest(machine: str) -> str:
    mig = MACHINES[machine].model.mig
    assert mig is not None
    return "all-" + min((p for p in mig.profiles if not p.media_extensions), key=lambda p: p.memory_slices).name


def plan_apply(backend: NvmlMigBackend, name: str) -> float:
    t0 = time.perf_counter()
    gpus = list(backend.gpus())
    node_plan = plan(CONFIG, name, gpus)
    apply.apply_modes(backend, node_plan)
    apply.apply_layouts(backend, node_plan, gpus)
    assert diff(node_plan, snapshot(backend, gpus)).applied
    return time.perf_counter() - t0


def bench_plan_apply(shared_file: bool) -> dict[str, float]:
    """Returns the median MIG-off -> all-balanced time per machine."""
    where = "state in a shared file" if shared_file else "in memory"
    print(f"plan+apply on simulated machines, {where} (median of {RUNS}, fresh machine each run)")
    balanced: dict[str, float] = {}
    for machine, spec in MACHINES.items():
        if spec.model.mig is None:
            continue
        first, second = [], []
        for _ in range(RUNS):
            with tempfile.TemporaryDirectory() as d:
                state = Path(d) / "sim.json" if shared_file else None
                with open_nvml(NvmlBackend("simulated", machine, state)) as nvml:
                    backend = NvmlMigBackend(nvml, SimulatedReset(machine, state))
                    first.append(plan_apply(backend, "all-balanced"))
                    second.append(plan_apply(backend, _smallest(machine)))
        a, b = statistics.median(first), statistics.median(second)
        balanced[machine] = a
        print(f"  {machine:14s} {spec.gpu_count} GPUs: MIG off -> all-balanced {a * 1000:7.1f} ms, "
              f"-> {_smallest(machine):13s} {b * 1000:7.1f} ms  (target < {TARGET_S * 1000:.0f} ms: "
              f"{'ok' if max(a, b) < TARGET_S else 'MISSED'})")
    return balanced


def manager_run(node: object, backend: NvmlMigBackend, drain: DrainMode) -> tuple[float, int]:
    m = MigManager(node=node, backend=backend, load_config=lambda: CONFIG, files=MemoryFiles(),  # type: ignore[arg-type]
                   step_lock=StepLock(), boot_id=lambda: "b", clock=Clock(), rebooter=Rebooter(),
                   settings=Settings(drain=drain))
    t0 = time.perf_counter()
    busy = 0.0
    for _ in range(20):
        action = m.run_until_blocked()
        busy = time.perf_counter() - t0
        if action.act.value == "idle":
            break
        m._node = None
        node.wait_for_change("", 0)  # type: ignore[attr-defined]
    return busy, len(m.history)


def bench_manager(bare_s: float) -> None:
    print("MIG manager, dgx-h100, MIG off -> all-balanced (in-memory API server, waits excluded)")
    for drain in (DrainMode.DECKHOUSE, DrainMode.CORDON):
        times, calls = [], []
        for _ in range(RUNS):
            with tempfile.TemporaryDirectory() as d:
                state = Path(d) / "sim.json"
                with open_nvml(NvmlBackend("simulated", "dgx-h100", state)) as nvml:
                    backend = NvmlMigBackend(nvml, SimulatedReset("dgx-h100", state))
                    node = FakeNode(labels={labels.MIG_CONFIG: "all-balanced", labels.DEVICE_GPU_CONFIG: "MIG"})
                    node.pods = [pod("plugin", app="device-plugin", daemonset=True), pod("train", gpu=True)]
                    node.on_wait = [deckhouse_approver, clients_leave] if drain is DrainMode.DECKHOUSE else []
                    t, _ = manager_run(node, backend, drain)
                    times.append(t)
                    calls.append(node.calls)
        t = statistics.median(times)
        print(f"  {drain.value:9s}: {t * 1000:7.1f} ms ({t / bare_s:.2f}x the bare plan+apply of the same change), "
              f"{statistics.median(calls):.0f} API calls per reconfiguration")


def bench_http() -> None:
    print("MIG manager over HTTP (node_agent.kube, kmock on loopback), dgx-h100, cordon flow")
    with kmock_server() as url, tempfile.TemporaryDirectory() as d:
        core = client.CoreV1Api(api(url))
        core.create_node({"metadata": {"name": "gpu-1", "labels": {
            labels.MIG_CONFIG: "all-balanced", labels.DEVICE_GPU_CONFIG: "MIG"}}})
        core.create_namespaced_pod("web", {"metadata": {"name": "web", "namespace": "web"},
                                           "spec": {"nodeName": "cpu-1", "containers": [{"name": "c", "image": "i"}]}})
        node = KubeNodeApi(kube(url), "gpu-1")
        state = Path(d) / "sim.json"
        with open_nvml(NvmlBackend("simulated", "dgx-h100", state)) as nvml:
            backend = NvmlMigBackend(nvml, SimulatedReset("dgx-h100", state))
            t, actions = manager_run(node, backend, DrainMode.CORDON)
        state_label = core.read_node("gpu-1").metadata.labels.get(labels.MIG_CONFIG_STATE)
        print(f"  {node.calls} HTTP calls, {actions} actions, {t * 1000:.0f} ms wall, state={state_label}")


def main() -> None:
    bench_plan_apply(shared_file=False)
    balanced = bench_plan_apply(shared_file=True)
    bench_manager(balanced["dgx-h100"])
    bench_http()


if __name__ == "__main__":
    main()
