"""What the stack's cluster-wide controllers cost the API server at rest, on a kwok fleet of 10 and then
1,000 GPU nodes: their load must not grow with the fleet.

One control plane of the pinned build (``make tools``: etcd, kube-apiserver with an audit log of the
controllers' requests only, kube-scheduler, kube-controller-manager, kwok playing every node's kubelet).
A container-driver node group as the stack renders it: its driver DaemonSet (the controller-manager and the
scheduler place one pod a node, kwok runs them), and the two controllers as the stack deploys them, each a
process of its own under its ServiceAccount with the stack's own RBAC:

* ``driver-upgrade``: settled (every driver current), it waits on watches of the driver DaemonSets, their
  pods and the nodes whose upgrade state is not done;
* ``eviction-guard``: the webhook server, whose only request at rest is its CA-bundle check every minute.

Beside them, in this process, the driver upgrade controller's former loop as the baseline: a round every
5 s (the DaemonSets, their pods and one list of every node of the groups), under a ServiceAccount of its
own. Each phase (the small fleet, then the large one) lets everything settle, then counts each account's
requests in the audit log over the window, each process's CPU, and the baseline round's time and the size
of its node list.

    .venv/bin/python bench/bench_controllers.py                # 10, then 1,000 nodes, 120 s windows
    .venv/bin/python bench/bench_controllers.py --large 200 --window 60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import audit  # noqa: E402
from bench.bench_vs_nvidia import cpu_s  # noqa: E402
from localcluster import ControlPlane, Kube  # noqa: E402
from localcluster.controlplane import free_port  # noqa: E402
from localcluster.objects import kwok_node, service_account_kube, wait_for, write_kubeconfig  # noqa: E402
from node_agent.driverupgrade.controller import UpgradeController  # noqa: E402
from node_agent.kube.transport import Kube as AgentKube  # noqa: E402
from nvgpu import labels  # noqa: E402
from nvgpu.evictionguard import COMPONENT as GUARD  # noqa: E402
from nvgpu.stackconfig import load_stack_config  # noqa: E402
from nvidia_gpu.components.manifests import driver, driverupgrade, evictionguard  # noqa: E402

NS = "bench-ctl"
UPGRADE = driverupgrade.COMPONENT
BASELINE = f"{UPGRADE}-timer"  #: the ServiceAccount of the former loop, bound to the same roles
ACCOUNTS = (UPGRADE, GUARD, BASELINE)
NODE_LABELS = {"pool": "bench", labels.OS_RELEASE_ID: "ubuntu", labels.OS_RELEASE_VERSION_ID: "22.04",
               labels.NODE_GROUP: "bench"}
GPU_TAINT = {"key": labels.GPU_TAINT_KEY, "value": labels.GPU_TAINT_VALUE, "effect": "NoSchedule"}
BASELINE_INTERVAL_S = 5.0


def audit_policy() -> str:
    users = ", ".join(f'"system:serviceaccount:{NS}:{a}"' for a in ACCOUNTS)
    return ("apiVersion: audit.k8s.io/v1\nkind: Policy\n"
            'omitStages: ["ResponseStarted", "ResponseComplete", "Panic"]\n'
            f"rules:\n- level: Metadata\n  users: [{users}]\n- level: None\n")


def stack() -> Any:
    return load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "namespace": NS, "driverRoot": "/run/nvidia/driver",
                    "agentImage": {"repository": "registry.example.com/agent", "tag": "1.0.0"}},
        "nodeGroups": [{"name": "bench", "nodeSelector": {"matchLabels": {"pool": "bench"}},
                        "gpu": {"model": "H100-80GB", "driver": {"source": "container", "version": "550.90.07",
                                                                 "osReleases": ["ubuntu22.04"]}}}]})


def install(admin: Kube) -> None:
    """The namespace, both controllers' RBAC as the stack renders it (and the baseline's account bound to
    the upgrade controller's roles), the guard's webhook configuration and its policy, the driver DaemonSet."""
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    admin.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": BASELINE, "namespace": NS}})
    for obj in (*evictionguard.rbac(NS), evictionguard.webhook_configuration(NS),
                evictionguard.ca_only_policy(NS), evictionguard.ca_only_policy_binding(NS)):
        admin.apply(obj)
    for obj in driverupgrade.rbac(NS):
        admin.apply(obj)
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            twin = json.loads(json.dumps(obj))
            twin["metadata"]["name"] = f"{obj['metadata']['name']}-timer"
            twin["subjects"] = [{"kind": "ServiceAccount", "name": BASELINE, "namespace": NS}]
            admin.apply(twin)
    cfg = stack()
    for ds in driver.driver_daemonsets(NS, cfg.cluster, cfg.node_groups[0]):
        admin.apply(ds)


def kubeconfig(admin: Kube, account: str, work: Path) -> Path:
    return write_kubeconfig(service_account_kube(admin, NS, account, seconds=7200), work / f"{account}.kubeconfig",
                            user=account)


def grow(admin: Kube, upto: int) -> None:
    """kwok GPU nodes of the group up to ``upto``, then wait for every one's driver pod to run and be ready."""
    have = {n["metadata"]["name"] for n in admin.list("v1", "Node", labelSelector="pool=bench")}
    t0 = time.monotonic()
    for i in range(upto):
        name = f"gpu-{i:04d}"
        if name not in have:
            admin.create(kwok_node(name, NODE_LABELS, [GPU_TAINT]))
    print(f"  {upto - len(have)} nodes created in {time.monotonic() - t0:.0f} s", flush=True)

    def ready() -> bool:
        pods = admin.list("v1", "Pod", NS, labelSelector=driver.DRIVER_SELECTOR_LABEL)
        up = sum(1 for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                        for c in (p.get("status") or {}).get("conditions") or []))
        print(f"  driver pods ready: {up}/{upto}", flush=True)
        return up >= upto

    wait_for(ready, timeout=1800, interval=15, what=f"{upto} driver pods ready")
    print(f"  fleet of {upto} ready after {time.monotonic() - t0:.0f} s", flush=True)


class Baseline:
    """The driver upgrade controller's former loop: a round every 5 s, whatever the fleet does."""

    def __init__(self, kube: AgentKube) -> None:
        self.controller = UpgradeController(kube, NS)
        self.times: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True, name="baseline")

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.controller.run_round()
            except Exception as e:  # reported with the figures: a refused round is no baseline
                self.errors.append(str(e))
            self.times.append(time.perf_counter() - t0)
            self.stop.wait(BASELINE_INTERVAL_S)


def measure(audit_log: Path, admin: Kube, procs: dict[str, int], baseline: Baseline, *, settle: float,
            window: float) -> dict[str, Any]:
    time.sleep(settle)
    before = {a: cpu_s(pid) for a, pid in procs.items()}
    rounds_from = len(baseline.times)
    since = datetime.now(UTC)
    time.sleep(window)
    until = datetime.now(UTC)
    cpu = {a: (cpu_s(pid) - before[a]) / window * 100 for a, pid in procs.items()}
    time.sleep(2)  # the audit backend's buffer
    counts = audit.count(audit_log, NS, since, until)
    listed = json.dumps(admin.request("GET", "/api/v1/nodes", query={"labelSelector": labels.NODE_GROUP}))
    return {"counts": counts, "cpu": cpu, "round_ms": statistics.median(baseline.times[rounds_from:]) * 1000,
            "node_list_kib": len(listed) / 1024, "window": window}


def report(phases: dict[int, dict[str, Any]]) -> None:
    sizes = sorted(phases)
    print("\nrequests per minute at rest, by account, verb and resource")
    keys = sorted({k for p in phases.values() for k in p["counts"]})
    print(f"{'account':<28}{'verb':<8}{'resource':<34}" + "".join(f"{f'{n} nodes':>14}" for n in sizes))
    for k in keys:
        print(f"{k[0]:<28}{k[1]:<8}{k[2]:<34}"
              + "".join(f"{phases[n]['counts'][k] * 60 / phases[n]['window']:>14.2f}" for n in sizes))
    print("\ntotals per minute, CPU % of one core")
    print(f"{'':<44}" + "".join(f"{f'{n} nodes':>14}" for n in sizes) + f"{'ratio':>10}")
    for account in ACCOUNTS:
        per_min = [sum(v for k, v in phases[n]["counts"].items() if k[0] == account) * 60 / phases[n]["window"]
                   for n in sizes]
        ratio = per_min[-1] / per_min[0] if per_min[0] else float("nan")
        print(f"{account + ' requests/min':<44}" + "".join(f"{v:>14.2f}" for v in per_min) + f"{ratio:>10.2f}")
    for account in (UPGRADE, GUARD):
        cpu = [phases[n]["cpu"][account] for n in sizes]
        print(f"{account + ' CPU %':<44}" + "".join(f"{v:>14.3f}" for v in cpu))
    print(f"{BASELINE + ' round, median ms':<44}" + "".join(f"{phases[n]['round_ms']:>14.1f}" for n in sizes))
    print(f"{'its node list per round, KiB':<44}" + "".join(f"{phases[n]['node_list_kib']:>14.0f}" for n in sizes))
    print(f"{'  the same every minute, KiB':<44}"
          + "".join(f"{phases[n]['node_list_kib'] * 60 / BASELINE_INTERVAL_S:>14.0f}" for n in sizes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=10, help="nodes in the first phase (default: %(default)s)")
    ap.add_argument("--large", type=int, default=1000, help="nodes in the second phase (default: %(default)s)")
    ap.add_argument("--window", type=float, default=120, help="seconds counted per phase (default: %(default)s)")
    ap.add_argument("--settle", type=float, default=30, help="seconds of rest before each window")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ctl-") as tmp:
        work = Path(tmp)
        args_audit, audit_log = audit.apiserver_args(audit_policy(), work)
        cp = ControlPlane(work / "cp", apiserver_args=args_audit)
        cp.start()
        procs: list[subprocess.Popen[bytes]] = []
        baseline: Baseline | None = None
        try:
            admin = cp.admin()
            install(admin)
            print(f"phase 1: {args.small} nodes", flush=True)
            grow(admin, args.small)
            agent = [sys.executable, "-m", "node_agent", "--log-level", "warning", "--kubeconfig"]
            started = {UPGRADE: [*agent, str(kubeconfig(admin, UPGRADE, work)), "driver-upgrade", "--namespace", NS],
                       GUARD: [*agent, str(kubeconfig(admin, GUARD, work)), "eviction-guard", "--namespace", NS,
                               "--listen", f"127.0.0.1:{free_port()}"]}
            for cmd in started.values():
                procs.append(subprocess.Popen(cmd, cwd=REPO))
            pids = dict(zip(started, (p.pid for p in procs), strict=True))
            baseline = Baseline(AgentKube.connect(kubeconfig(admin, BASELINE, work)))
            baseline.thread.start()
            phases = {args.small: measure(audit_log, admin, pids, baseline, settle=args.settle, window=args.window)}
            print(f"phase 2: {args.large} nodes", flush=True)
            grow(admin, args.large)
            phases[args.large] = measure(audit_log, admin, pids, baseline, settle=args.settle, window=args.window)
            if any(p.poll() is not None for p in procs):
                print("a controller exited during the bench", file=sys.stderr)
                return 1
            report(phases)
            if baseline.errors:
                print(f"\nthe baseline's rounds failed {len(baseline.errors)} times: {baseline.errors[0]}")
                return 1
        finally:
            if baseline is not None:
                baseline.stop.set()
            for p in procs:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
            cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
