"""What a fleet pays at rest: API requests per GPU node per minute, by agent and verb, against NVIDIA's GFD.

A real API server (etcd and kube-apiserver from ``make tools``) writes an audit log (every request at its
``RequestReceived`` stage, metadata only). Each agent kind runs under a ServiceAccount of its own, so the
log's ``user.username`` says whose request it was. For ``--nodes`` simulated GPU nodes, each with a host
tree of its own on NVIDIA's mock NVML machine (``tests/compare/peers.py``), this starts what our
DaemonSets run on a device-plugin node, rendered from ``components/`` with the DaemonSets' own arguments
(``bench_vs_nvidia.our_containers``: setup init container once, then setup monitor, labeller with the GPU
inventory, device plugin with a kubelet stand-in, MIG manager on a node carrying ``nvidia.com/mig.config``),
and beside them NVIDIA's GPU feature discovery (v0.19, ``--sleep-interval 60s``, with a kubeconfig of its
own). Once every agent has settled (the Node labelled, the MIG manager converged) plus ``--settle``
seconds, the requests of a ``--window`` are counted.

Printed: requests per node per minute by agent and verb, the writes among them (Node writes apart), the
same extrapolated to 1,000 nodes (the agents of one node touch only that node's objects, so the load is
linear in the node count), and NVIDIA's GFD from the same run. Target (issue 36): at most 1 request per
minute per GPU node for all our agents together, and no writes at rest.

Watches count once, when they are opened (their timeouts are minutes, so a window shorter than one can
miss a re-open: the default window is 6 minutes, past the 5-minute watch timeouts).

Usage: ``python bench/bench_fleet.py [--nodes 2] [--window 360] [--settle 30]``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import audit  # noqa: E402
from bench.bench_vs_nvidia import (  # noqa: E402
    MODELS,
    Container,
    Processes,
    _mig_settled,
    cpu_s,
    our_containers,
    real_pid,
    transient,
    wait_for,
)
from localcluster import ControlPlane  # noqa: E402
from localcluster.client import Kube  # noqa: E402
from nvgpu import inventory, labels  # noqa: E402
from nvidia_gpu.components.manifests import inventory as inventory_manifests  # noqa: E402
from tests.compare.peers import DMI_PRODUCT, Machine, machine, namespaced  # noqa: E402

NAMESPACE = "bench-fleet"
GFD = "gpu-feature-discovery"
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["ResponseStarted", "ResponseComplete", "Panic"]
rules:
- level: Request  # what a Node write carried, for whoever asks why it happened (--keep)
  verbs: ["patch", "update"]
  resources: [{group: "", resources: ["nodes"]}]
- level: Metadata
"""
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DRA_SUFFIX = "-dra"  #: the ServiceAccounts of a DRA node's agents end so


@dataclass(frozen=True)
class Agent:
    """One process on one node, and the ServiceAccount its requests are logged under."""

    node: str
    account: str
    argv: tuple[str, ...]
    env: dict[str, str]
    pids: list[int] = field(default_factory=list)  #: the process (behind unshare for NVIDIA's), once started


def _account(container: Container, dra: bool) -> str:
    """The ServiceAccount: one per agent kind and node mode (a DRA node's labeller apart)."""
    return container.name.replace("_", "-").lower() + (DRA_SUFFIX if dra else "")


def control_plane(work: Path) -> tuple[ControlPlane, Path]:
    args, log = audit.apiserver_args(AUDIT_POLICY, work)
    cp = ControlPlane(work / "cp", components=("etcd", "kube-apiserver"), apiserver_args=args)
    cp.start()
    return cp, log


def identity(cp: ControlPlane, admin: Kube, account: str, work: Path) -> Path:
    """A kubeconfig for ``account`` in the bench namespace, bound to cluster-admin: this bench counts
    requests, the agents' own roles are the cluster tests' business."""
    with contextlib.suppress(Exception):  # made by an earlier node already
        admin.create({"apiVersion": "v1", "kind": "ServiceAccount",
                      "metadata": {"name": account, "namespace": NAMESPACE}})
        admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                      "metadata": {"name": f"{NAMESPACE}-{account}"},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "cluster-admin"},
                      "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]})
    path = work / f"{account}.kubeconfig"
    if not path.exists():
        answer = admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}})
        token = answer["status"]["token"]
        path.write_text(Kube(server=cp.server, token=token, ca_file=admin.ca_file).kubeconfig_text(account))
    return path


def _with_kubeconfig(argv: tuple[str, ...], kubeconfig: Path) -> tuple[str, ...]:
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--kubeconfig":
            out[i + 1] = str(kubeconfig)
    return tuple(out)


def _established(admin: Kube) -> bool:
    try:
        crd = admin.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{inventory.CRD_NAME}")
    except Exception:
        return False
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def node_labels(admin: Kube, node: str) -> dict[str, str]:
    try:
        obj = admin.request("GET", f"/api/v1/nodes/{node}")
    except Exception:
        return {}
    return dict((obj.get("metadata") or {}).get("labels") or {})


def start_node(procs: Processes, cp: ControlPlane, admin: Kube, m: Machine, *, node: str, work: Path,
               dra: bool = False, log_level: str = "") -> list[Agent]:
    """The Node object, the setup init container run once, then the node's long-running agents and GFD."""
    node_labels_ = {"gpu": "bench", "kubernetes.io/hostname": node}
    if not dra:  # the MIG manager runs where a MIG config is asked for; all-disabled is what the mock's GPUs are
        node_labels_[labels.MIG_CONFIG] = "all-disabled"
    admin.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": node_labels_}})
    env = m.env(NODE_NAME=node)
    placeholder = work / "placeholder.kubeconfig"
    containers = our_containers(m, work, placeholder, dra=dra)
    agents: list[Agent] = []
    for c in containers:
        kubeconfig = identity(cp, admin, _account(c, dra), work.parent)
        argv = _with_kubeconfig(c.argv, kubeconfig)
        if log_level and argv[1:3] == ("-m", "node_agent"):
            argv = (*argv[:3], "--log-level", log_level, *argv[3:])
        if c.init:
            run = transient(argv, env)
            if run.rc != 0 and labels.GPU_SETUP_COMPLETE not in node_labels(admin, node):
                print(f"  {node}: {c.name} exited {run.rc} on this mock; the bench opens the setup gate itself")
                admin.request("PATCH", f"/api/v1/nodes/{node}",
                              {"metadata": {"labels": {labels.GPU_SETUP_COMPLETE: ""}}},
                              content_type="application/merge-patch+json")
            continue
        if c.kubelet_dir is not None:
            procs.kubelet(c.kubelet_dir)
        agents.append(Agent(node, _account(c, dra), argv, env))
    gfd_out = work / "gfd-features"
    gfd = [str(m.tools / GFD), "--use-node-feature-api=false", "--output-file", str(gfd_out),
           "--machine-type-file", str(m.root / DMI_PRODUCT.lstrip("/")), "--sleep-interval", "60s"]
    gfd_account = GFD + (DRA_SUFFIX if dra else "")
    agents.append(Agent(node, gfd_account, tuple(namespaced(m, gfd)),
                        {**env, "KUBECONFIG": str(identity(cp, admin, gfd_account, work.parent))}))
    for a in agents:
        proc = procs.start(f"{node}-{a.account}", a.argv, a.env)
        # NVIDIA's runs behind unshare (its mount namespace): the process that exec'd into GFD is measured.
        a.pids.append(real_pid(proc.pid, GFD) if a.account.startswith(GFD) else proc.pid)
    return agents


def report_cpu(agents: list[Agent], before: dict[int, float], window_s: float) -> None:
    """Each agent's CPU while at rest, as a share of one core, averaged over the nodes of its kind."""
    shares: dict[str, list[float]] = {}
    for a in agents:
        if a.pids:
            shares.setdefault(a.account, []).append((cpu_s(a.pids[0]) - before[a.pids[0]]) / window_s * 100)
    print(f"\nCPU at rest, % of one core (mean over nodes, {window_s:.0f} s)")
    for account, values in sorted(shares.items()):
        print(f"{account:<28}{statistics.fmean(values):>8.3f}")


def report(counts: Counter[tuple[str, str, str]], nodes: dict[str, int], window_s: float) -> bool:
    """Per node mode (device plugin, DRA): each agent's requests per node per minute, the totals against
    GFD's, the writes, and the extrapolation to 1,000 nodes."""
    ok = True
    for mode, n in nodes.items():
        if not n:
            continue
        dra = mode == "dra"
        mine = {k: v for k, v in counts.items() if k[0].endswith(DRA_SUFFIX) == dra}
        per_min = 60.0 / window_s / n
        gfd = sum(v for k, v in mine.items() if k[0].startswith(GFD))
        ours = {k: v for k, v in mine.items() if not k[0].startswith(GFD)}
        print(f"\n{mode} nodes: requests per node per minute at rest ({n} nodes, {window_s:.0f} s window)")
        print(f"{'agent':<28}{'verb':<8}{'resource':<26}{'per node/min':>14}")
        for (account, verb, resource), c in sorted(mine.items()):
            print(f"{account:<28}{verb:<8}{resource:<26}{c * per_min:>14.2f}")
        total = sum(ours.values()) * per_min
        writes = sum(v for k, v in ours.items() if k[1] in WRITE_VERBS) * per_min
        node_writes = sum(v for k, v in ours.items() if k[1] in WRITE_VERBS and k[2] == "nodes") * per_min
        print(f"{'':<28}{'ours, all agents':<34}{'NVIDIA GFD':>14}")
        print(f"{'requests /node/min':<28}{total:<34.2f}{gfd * per_min:>14.2f}")
        print(f"{'writes /node/min':<28}{writes:<34.2f}")
        print(f"{'Node writes /node/min':<28}{node_writes:<34.2f}")
        print(f"{'at 1,000 nodes, req/s':<28}{total * 1000 / 60:<34.2f}{gfd * per_min * 1000 / 60:>14.2f}")
        met = total <= 1.0 and writes == 0
        ok = ok and met
        print(f"target: <= 1 request/node/min, no writes at rest: {'MET' if met else 'MISSED'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="device-plugin nodes (default 2)")
    parser.add_argument("--dra-nodes", type=int, default=1, help="DRA nodes (default 1)")
    parser.add_argument("--window", type=float, default=360.0, help="seconds of rest counted (default 360)")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after settling before the window")
    parser.add_argument("--machine", default="dgxh100", choices=sorted(MODELS))
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    parser.add_argument("--agent-log-level", default="", help="e.g. info: the agents' --log-level (with --keep)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    trees: list[Path] = []
    (work / "logs").mkdir()
    procs = Processes(work / "logs")
    cp, audit_log = control_plane(work)
    try:
        admin = cp.admin()
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        admin.create(inventory_manifests.crd())  # the GPU objects the labeller keeps, as the stack installs
        wait_for(lambda: _established(admin), timeout=60)
        # The stack's DRA uninstall marker, armed as a running stack's is.
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nvidia-gpu"}})
        admin.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "dra-uninstall-marker", "namespace": "nvidia-gpu"}})
        agents: list[Agent] = []
        names = [(f"gpu-node-{i}", False) for i in range(args.nodes)]
        names += [(f"dra-node-{i}", True) for i in range(args.dra_nodes)]
        for name, dra in names:
            node_work = work / name
            node_work.mkdir()
            # A DRA node's host tree holds the plugin's unix sockets: a short path (107 bytes at most).
            tree = Path(tempfile.mkdtemp(prefix="bf", dir="/tmp")) if dra else node_work / "machine"
            trees.append(tree)
            agents += start_node(procs, cp, admin, machine(args.machine, tree), node=name, work=node_work,
                                 dra=dra, log_level=args.agent_log_level)
            print(f"  {name}: agents started")
        settled = wait_for(lambda: all(
            GPU_PRODUCT_LABEL in (nl := node_labels(admin, n)) and (dra or _mig_settled(nl)) for n, dra in names),
            timeout=180)
        print(f"  settled: {settled}; resting {args.settle:.0f} s, then counting {args.window:.0f} s")
        time.sleep(args.settle)
        before = {a.pids[0]: cpu_s(a.pids[0]) for a in agents if a.pids}
        since = datetime.now().astimezone()
        time.sleep(args.window)
        until = datetime.now().astimezone()
        report_cpu(agents, before, (until - since).total_seconds())
        report(audit.count(audit_log, NAMESPACE, since, until), {"device-plugin": args.nodes, "dra": args.dra_nodes},
                    (until - since).total_seconds())
    finally:
        procs.stop_all()
        cp.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            for path in (work, *trees):
                shutil.rmtree(path, ignore_errors=True)
    return 0  # benchmarks report (MET/MISSED above), tests assert


if __name__ == "__main__":
    sys.exit(main())
