"""Proof 3 (MIG manager): the MIG manager as a process, with its pod's identity, against a real API server.

The dev stack is applied for real; a kwok Node of the Deckhouse NodeGroup ``gpu-h100`` (its group
label, node template and ``gpu-setup-complete``) gets the stack's agent pods from the real DaemonSet
controller. The manager then runs as ``python -m node_agent`` with exactly the arguments of its
rendered DaemonSet (volume mount paths mapped onto a fake host root and the ConfigMap's content), the
environment the DaemonSet gives it (``NODE_NAME`` from the pod's ``spec.nodeName``), and only three
global options added: ``--nvml simulated:dgx-h100`` (state in the fake host root), ``--kubeconfig``
with a TokenRequest token bound to its DaemonSet pod on that node, so RBAC judges it as in a cluster,
and ``--log-level info`` (the refused evictions are visible only in the log). The test plays only what
is not in this control plane: Deckhouse's node-manager (approval, drain) and the cluster operator.

What the fakes in ``tests/node_agent/mig`` cannot show and this module does: the merge patches of labels, taints
and cordon as the real API server applies them; the real Eviction API with a PodDisruptionBudget whose
status the disruption controller keeps (``429`` for the blocked pod); the DaemonSet controller keeping
the GPU agents away while the ``mig-reconfigure`` taint is on and bringing them back afterwards; Events
the real server accepts; what the manager's ClusterRole, the node-confinement policy and the eviction
guard's webhook (which keeps a self-draining manager's evictions to its node) allow and deny; and that
the taint list the manager writes whole never drops a taint another controller added since the manager
read the Node (a resourceVersion precondition, 409).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Kube
from localcluster.client import ApiError
from localcluster.objects import create_kwok_node, wait_for
from node_agent.host import HostRoot
from node_agent.host.proc import boot_id
from node_agent.kube.transport import Kube as AgentKube
from node_agent.mig.executor import DEPLOY_LABELS, DRAIN_ANNOTATIONS, MigManager, Settings
from node_agent.mig.hostfiles import HostRebooter, HostStepLock
from node_agent.mig.kube import KubeNodeApi, NodeView
from node_agent.mig.machine import DrainMode
from node_agent.mig.nvmlbackend import NvmlMigBackend, SimulatedReset
from node_agent.nvml import NvmlBackend, open_nvml
from nvgpu import evictionguard as guard_contract
from nvgpu import labels
from nvgpu.migparted import load_config_text
from nvgpu.stackconfig import NodeSetupBackend
from nvidia_gpu.components.manifests import evictionguard as evictionguard_manifests
from nvidia_gpu.components.manifests.mig import manager_args
from nvidia_gpu.components.manifests.mig import rbac as mig_rbac
from tests.cluster.agents import NS, REPO, AgentIdentity, agent_command, identity
from tests.cluster.evictionguard import RunningGuard, running_guard
from tests.cluster.mig_manager import ManagerProcess, Rendered, layout, start_manager
from tests.cluster.stack import AppliedStack, rendered
from tests.kit.fakehost import build_fake_host, sim_state_file

PREFIX = "mig-"
GROUP = "gpu-h100"  #: the Deckhouse NodeGroup of the dev stack's MIG node group (h100-mig)
MACHINE = "dgx-h100"
MANAGER = "nvidia-gpu-mig-manager"
CONFIG_MAP = "nvidia-gpu-mig-parted-config"
SETUP = "node.deckhouse.io/gpu-setup-complete"
WORK_NS = "mig-work"
IMAGE = "registry.example/app@sha256:" + "0" * 64
#: The GPU agents of the h100-mig group that the manager must stop and the taint keep away.
CLIENT_DAEMONSETS = ("device-plugin-h100-mig", "gpu-labeller-h100-mig")
TAINT_KEY = labels.MIG_RECONFIGURE_TAINT_KEY
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  #: the node lifecycle controller's, while cordoned


# --- the manager as its DaemonSet runs it -------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(kube: Kube, dev_stack: AppliedStack) -> Rendered:
    ds = dev_stack.object("DaemonSet", MANAGER)
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    # The config as the API server holds it (what the kubelet would project into the pod).
    cm = kube.get("v1", "ConfigMap", volumes["config"]["configMap"]["name"], NS)
    assert cm["metadata"]["name"] == CONFIG_MAP
    template = dev_stack.object("NodeGroup", GROUP)["spec"]["nodeTemplate"]
    return Rendered(container, volumes, cm["data"]["config.yaml"], template)


@pytest.fixture
def managers() -> Iterator[list[ManagerProcess]]:
    """Manager processes a test started; stopped afterwards, their log printed (shown on failure)."""
    started: list[ManagerProcess] = []
    yield started
    for m in started:
        m.stop()
        print(f"--- manager log ({m.log}), exit {m.proc.returncode} ---\n{m.text()[-6000:]}")


@pytest.fixture(scope="module")
def work_ns(kube: Kube) -> str:
    if kube.get_or_none("v1", "Namespace", WORK_NS) is None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORK_NS}})
    return WORK_NS


def h100_node(kube: Kube, rendered_stack: Rendered, name: str, *, gpus: int = 0) -> dict[str, Any]:
    """A node of the gpu-h100 NodeGroup as Deckhouse makes it: group label, node template, setup done."""
    template = rendered_stack.node_template
    node_labels = {"node.deckhouse.io/group": GROUP, **template.get("labels", {}), SETUP: ""}
    return create_kwok_node(kube, name, node_labels, template.get("taints", []), gpus=gpus)


def gpu_pod(name: str, node: str, app: str, *, gpus: int = 1) -> dict[str, Any]:
    """A workload the scheduler puts on ``node`` (kwok runs it); ``gpus`` of ``nvidia.com/gpu``."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORK_NS, "labels": {"app": app}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": IMAGE, "resources": resources}],
        },
    }


def running(kube: Kube, name: str, namespace: str = WORK_NS) -> dict[str, Any] | None:
    pod = kube.get_or_none("v1", "Pod", name, namespace)
    ok = pod is not None and pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get(
        "deletionTimestamp")
    return pod if ok else None


def gone(kube: Kube, name: str, namespace: str = WORK_NS) -> bool:
    return kube.get_or_none("v1", "Pod", name, namespace) is None


def client_pods(kube: Kube, node: str) -> dict[str, str]:
    """DaemonSet name -> pod UID of the GPU agents (device plugin, labeller) Running on ``node``."""
    out: dict[str, str] = {}
    for pod in kube.list("v1", "Pod", NS, fieldSelector=f"spec.nodeName={node}"):
        owner = next((o["name"] for o in pod["metadata"].get("ownerReferences", []) if o["kind"] == "DaemonSet"), "")
        if owner in CLIENT_DAEMONSETS and pod.get("status", {}).get("phase") == "Running" \
                and not pod["metadata"].get("deletionTimestamp"):
            out[owner] = pod["metadata"]["uid"]
    return out


def all_clients(kube: Kube, node: str) -> dict[str, str] | None:
    pods = client_pods(kube, node)
    return pods if len(pods) == len(CLIENT_DAEMONSETS) else None


def node_events(kube: Kube, node: str) -> list[dict[str, Any]]:
    return kube.list("v1", "Event", "default", fieldSelector=f"involvedObject.kind=Node,involvedObject.name={node}")


def settled(kube: Kube, name: str, config: str) -> dict[str, Any] | None:
    """The Node once the manager has given it back after applying ``config``.

    The node lifecycle controller taints a cordoned node ``node.kubernetes.io/unschedulable`` and
    removes that taint only after the uncordon: wait for it too before comparing taints.
    """
    node = kube.get("v1", "Node", name)
    meta, spec = node["metadata"], node["spec"]
    done = (
        meta["labels"].get(labels.MIG_CONFIG) == config
        and meta["labels"].get(labels.MIG_CONFIG_STATE) == "success"
        and not any(t["key"] in (TAINT_KEY, UNSCHEDULABLE_TAINT) for t in spec.get("taints", []))
        and not spec.get("unschedulable")
    )
    return node if done else None


def assert_given_back(node: dict[str, Any], rendered_stack: Rendered) -> None:
    """Nothing of the reconfiguration left on the Node: only the template's taints, no pause, no drain."""
    meta, spec = node["metadata"], node["spec"]
    assert meta["labels"][labels.MIG_CONFIG_STATE] == "success"
    assert not [k for k in meta["labels"] if k.startswith(labels.GPU_DEPLOY_PREFIX)], meta["labels"]
    assert spec.get("taints", []) == rendered_stack.node_template.get("taints", [])
    assert not spec.get("unschedulable")
    annotations = meta.get("annotations", {})
    assert not [k for k in annotations if k in DRAIN_ANNOTATIONS or k == labels.MIG_FAILURE_REASON], annotations


def evict(kube: Kube, name: str, namespace: str = WORK_NS, *, dry_run: bool = False) -> None:
    """The Eviction API (``pods/eviction``), as ``kubectl drain`` and Deckhouse's node-manager call it."""
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                 {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}},
                 query={"dryRun": "All"} if dry_run else None)


# --- 1. Deckhouse: approval and drain by node-manager ---------------------------------------------------


@pytest.mark.usefixtures("work_ns")
def test_deckhouse_flow_waits_for_approval_and_drain_then_gives_the_node_back(
        kube: Kube, stack: Rendered, tmp_path: Path, managers: list[ManagerProcess]) -> None:
    name = f"{PREFIX}h100-deckhouse"
    h100_node(kube, stack, name, gpus=8)
    ident = identity(kube, MANAGER, name, tmp_path)
    host = build_fake_host(tmp_path / "host", MACHINE).root
    first = stack.node_template["labels"][labels.MIG_CONFIG]
    # The GPUs already carry the group's layout (applied when the node joined), by the one-shot tool.
    (tmp_path / "mig.yaml").write_text(stack.config_text)
    applied = subprocess.run(agent_command("--host-root", str(host), "--nvml", f"simulated:{MACHINE}", "mig", "apply",
                                           "--config", str(tmp_path / "mig.yaml"), "--name", first),
                             capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    before = layout(host)
    kube.create(gpu_pod("dh-train", name, "dh-train"))
    wait_for(lambda: running(kube, "dh-train"), timeout=30, what="the GPU workload Running")
    clients = wait_for(lambda: all_clients(kube, name), timeout=30, what="device plugin and labeller Running")

    m = start_manager(stack, ident, tmp_path)
    managers.append(m)
    # Already applied: the manager only records success, disrupting nothing.
    wait_for(lambda: settled(kube, name, first), timeout=30, interval=0.2, what="state=success for the template")
    assert layout(host) == before and running(kube, "dh-train")

    target = "all-3g.40gb"
    kube.patch("v1", "Node", name, {"metadata": {"labels": {labels.MIG_CONFIG: target}}})

    def asked() -> dict[str, Any] | None:
        node = kube.get("v1", "Node", name)
        return node if labels.DISRUPTION_REQUIRED in node["metadata"].get("annotations", {}) else None

    node = wait_for(asked, timeout=30, interval=0.2, what="disruption-required on the Node")
    meta = node["metadata"]
    assert meta["labels"][labels.MIG_CONFIG_STATE] == "pending"
    assert all(meta["labels"].get(k) == labels.PAUSED_FOR_MIG_CHANGE for k in DEPLOY_LABELS), meta["labels"]
    assert {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    # The template's taint survived the manager's patch of the taint list.
    assert all(t in node["spec"]["taints"] for t in stack.node_template.get("taints", []))
    assert not node["spec"].get("unschedulable")
    # Without approval nothing is disrupted: no drain asked for, no pod touched, no GPU changed.
    assert labels.DRAINING not in meta.get("annotations", {})
    assert running(kube, "dh-train") and client_pods(kube, name) == clients and layout(host) == before
    # Approval can take hours: meanwhile the manager blocks in a Node watch instead of polling the server.
    cpu, t0 = m.cpu_seconds(), time.monotonic()
    time.sleep(2)
    busy = (m.cpu_seconds() - cpu) / (time.monotonic() - t0)
    assert busy < 0.1, f"the manager used {busy:.0%} of a CPU while waiting for approval"

    # Deckhouse's node-manager approves the disruption...
    kube.patch("v1", "Node", name, {"metadata": {"annotations": {labels.DISRUPTION_APPROVED: ""}}})

    def draining() -> str | None:
        annotations: dict[str, str] = kube.get("v1", "Node", name)["metadata"].get("annotations", {})
        return annotations.get(labels.DRAINING)

    source = wait_for(draining, timeout=30, interval=0.2, what="the manager asking for the drain")
    assert source == "nvidia-gpu-mig-manager"
    assert running(kube, "dh-train"), "in Deckhouse mode node-manager drains, not the MIG manager"
    # ...and drains: cordon, evict through the Eviction API, mark drained.
    kube.patch("v1", "Node", name, {"spec": {"unschedulable": True}})
    evict(kube, "dh-train")
    wait_for(lambda: gone(kube, "dh-train"), timeout=30, what="the workload evicted")
    kube.patch("v1", "Node", name, {"metadata": {"annotations": {labels.DRAINED: source}}})

    node = wait_for(lambda: settled(kube, name, target), timeout=60, interval=0.2,
                    what=f"the node given back with {target} applied")
    assert_given_back(node, stack)
    assert layout(host) == [["3g.40gb", "3g.40gb"]] * 8
    assert m.alive(), m.text()
    # The GPU agents were stopped for the change (the taint kept their DaemonSets away, or the manager
    # would still be waiting for them) and the DaemonSet controller brings them back once it is gone.
    back = wait_for(lambda: all_clients(kube, name), timeout=30, what="device plugin and labeller back")
    assert not set(back.values()) & set(clients.values()), "the agents' pods were replaced"

    (event,) = [e for e in node_events(kube, name) if e["source"].get("component") == MANAGER]
    assert (event["reason"], event["type"]) == ("MigReconfigured", "Normal")
    assert target in event["message"] and event["involvedObject"]["uid"] == node["metadata"]["uid"]


# --- 2. Elsewhere: cordon, and evict through the Eviction API ---------------------------------------------


def cordon_drain(dev_stack: AppliedStack) -> str:
    """``--drain`` as the stack renders it for clusters without Deckhouse (``nodeSetup: daemonset``)."""
    config = rendered(dev_stack.name).config
    assert config is not None
    deckhouse = manager_args(config.cluster)
    elsewhere = manager_args(config.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET}))
    changed = [(a, b) for a, b in zip(deckhouse, elsewhere, strict=True) if a != b]
    assert changed == [("deckhouse", "cordon")], changed
    return elsewhere[elsewhere.index("--drain") + 1]


def pdb_status(kube: Kube, name: str) -> dict[str, Any] | None:
    """The PodDisruptionBudget's status once the disruption controller has seen its latest spec."""
    pdb = kube.get("policy/v1", "PodDisruptionBudget", name, WORK_NS)
    status = pdb.get("status", {})
    return status if status.get("observedGeneration") == pdb["metadata"]["generation"] else None


@pytest.fixture
def cordon_rbac(kube: Kube, dev_stack: AppliedStack, tmp_path: Path) -> Iterator[RunningGuard]:
    """The manager's ClusterRole as the stack renders it for clusters without Deckhouse: there it drains
    itself and may evict (on Deckhouse, the dev stack's own, it may not), and the eviction guard the stack
    emits with it judges each of its evictions; the dev stack's role is put back after."""
    config = rendered(dev_stack.name).config
    assert config is not None
    elsewhere = config.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET})
    assert evictionguard_manifests.wanted(elsewhere, cordon_drain(dev_stack))
    _, role, _ = mig_rbac(NS, elsewhere)
    _, deckhouse_role, _ = mig_rbac(NS, config.cluster)
    assert any("pods/eviction" in r["resources"] for r in role["rules"])
    kube.apply(role)
    try:
        with running_guard(kube, NS, tmp_path / "guard") as guard:
            yield guard
    finally:
        kube.apply(deckhouse_role)


@pytest.mark.usefixtures("work_ns", "cordon_rbac")
def test_cordon_flow_evicts_gpu_pods_through_the_pdb_and_uncordons(
        kube: Kube, dev_stack: AppliedStack, stack: Rendered, tmp_path: Path, managers: list[ManagerProcess]) -> None:
    name = f"{PREFIX}h100-cordon"
    h100_node(kube, stack, name, gpus=8)
    ident = identity(kube, MANAGER, name, tmp_path)
    host = build_fake_host(tmp_path / "host", MACHINE).root  # GPUs as delivered: MIG off
    assert layout(host) == [[]] * 8
    train = ("train-0", "train-1")
    for pod in train:
        kube.create(gpu_pod(pod, name, "mig-train"))
    kube.create(gpu_pod("web", name, "mig-web", gpus=0))  # no GPU: not the manager's to evict
    # One disruption allowed for two training pods: the second eviction must be refused.
    kube.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                 "metadata": {"name": "mig-train", "namespace": WORK_NS},
                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "mig-train"}}}})
    web = wait_for(lambda: running(kube, "web"), timeout=30, what="the web pod Running")
    for pod in train:
        wait_for(lambda p=pod: running(kube, p), timeout=30, what=f"{pod} Running")  # type: ignore[misc]
    wait_for(lambda: (s := pdb_status(kube, "mig-train")) and s.get("disruptionsAllowed") == 1 and s,
             timeout=30, what="the PDB allowing one disruption")
    clients = wait_for(lambda: all_clients(kube, name), timeout=30, what="device plugin and labeller Running")

    m = start_manager(stack, ident, tmp_path, drain=cordon_drain(dev_stack))
    managers.append(m)
    config = stack.node_template["labels"][labels.MIG_CONFIG]

    def one_left() -> list[str] | None:
        left = [p for p in train if not gone(kube, p)]
        return left if len(left) == 1 and kube.get("v1", "Node", name)["spec"].get("unschedulable") else None

    (blocked,) = wait_for(one_left, timeout=60, interval=0.2, what="the node cordoned, one training pod evicted")
    refusal = f"event=evict-refused pod={WORK_NS}/{blocked} reason=pdb"
    wait_for(lambda: m.text().count(refusal) >= 2, timeout=30, interval=0.2,
             what=f"the server refusing {blocked}'s eviction (429) twice: the manager retries")
    assert running(kube, blocked), "the PDB keeps the last training pod"
    assert (pdb_status(kube, "mig-train") or {}).get("disruptionsAllowed") == 0
    node = kube.get("v1", "Node", name)
    assert node["metadata"]["labels"][labels.MIG_CONFIG_STATE] == "pending"
    assert {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert labels.DISRUPTION_REQUIRED not in node["metadata"].get("annotations", {}), "no Deckhouse here"
    assert layout(host) == [[]] * 8 and client_pods(kube, name) == clients, "nothing touched before the drain"

    # The owner relaxes the budget; the manager's next retry gets through.
    kube.patch("policy/v1", "PodDisruptionBudget", "mig-train", {"spec": {"minAvailable": 0}}, WORK_NS)
    node = wait_for(lambda: settled(kube, name, config), timeout=60, interval=0.2,
                    what=f"the node uncordoned with {config} applied")
    assert_given_back(node, stack)
    assert all(gone(kube, p) for p in train)
    after = running(kube, "web")
    assert after is not None and after["metadata"]["uid"] == web["metadata"]["uid"], "the web pod stayed"
    assert layout(host) == [["1g.10gb"] * 7] * 8
    assert m.alive(), m.text()
    back = wait_for(lambda: all_clients(kube, name), timeout=30, what="device plugin and labeller back")
    assert not set(back.values()) & set(clients.values())
    (event,) = [e for e in node_events(kube, name) if e["source"].get("component") == MANAGER]
    assert (event["reason"], event["type"]) == ("MigReconfigured", "Normal") and config in event["message"]


# --- 3. RBAC: the manager's identity can do what it needs and nothing else -------------------------------


@pytest.fixture(scope="module")
def rbac_identity(kube: Kube, stack: Rendered, tmp_path_factory: pytest.TempPathFactory) -> AgentIdentity:
    name = f"{PREFIX}h100-rbac"
    h100_node(kube, stack, name)
    return identity(kube, MANAGER, name, tmp_path_factory.mktemp("mig-rbac"))


@pytest.fixture(scope="module")
def other_node_pod(kube: Kube, work_ns: str) -> dict[str, Any]:
    """A pod on a node that is not the manager's (an ordinary worker)."""
    node = f"{PREFIX}worker"
    create_kwok_node(kube, node, {"node.deckhouse.io/group": "mig-worker"})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere", "namespace": work_ns},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": IMAGE}]}}
    kube.create(pod)
    return wait_for(lambda: running(kube, "elsewhere"), timeout=30, what="the other node's pod Running")


def _rules(role: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(group, resource, subresource, verb) for every grant of a ClusterRole."""
    out = []
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                resource, _, sub = res.partition("/")
                out += [(group, resource, sub, verb) for verb in rule["verbs"]]
    return out


def test_rbac_allows_every_call_the_manager_makes(kube: Kube, dev_stack: AppliedStack,
                                                   rbac_identity: AgentIdentity) -> None:
    role = kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", MANAGER)
    assert role["rules"] == dev_stack.object("ClusterRole", MANAGER)["rules"], "the server holds the rendered role"
    me = rbac_identity.kube
    for group, resource, sub, verb in _rules(role):
        namespace = "default" if resource == "events" else WORK_NS
        assert me.can_i(verb, resource, group=group, subresource=sub, namespace=namespace), (group, resource, verb)
    # The calls themselves, as the manager makes them, on its own node.
    name = rbac_identity.pod["spec"]["nodeName"]
    node = me.get("v1", "Node", name)
    pods = me.list("v1", "Pod", fieldSelector=f"spec.nodeName={name}")
    assert rbac_identity.pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in pods}
    watched = me.request("GET", "/api/v1/nodes", query={"watch": "true", "fieldSelector": f"metadata.name={name}",
                                                         "resourceVersion": node["metadata"]["resourceVersion"],
                                                         "timeoutSeconds": "1"})
    assert watched is None or "ERROR" not in str(watched)
    probe = labels.GPU_DEPLOY_PREFIX + "nvsm"  # a label its role writes (it pauses NVIDIA's components)
    me.patch("v1", "Node", name, {"metadata": {"labels": {probe: "x"}}})
    assert kube.get("v1", "Node", name)["metadata"]["labels"][probe] == "x"
    me.patch("v1", "Node", name, {"metadata": {"labels": {probe: None}}})
    event = me.create({"apiVersion": "v1", "kind": "Event",
                       "metadata": {"generateName": f"{name}.rbac-", "namespace": "default"},
                       "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name,
                                          "uid": node["metadata"]["uid"]},
                       "reason": "RbacProbe", "message": "probe", "type": "Normal",
                       "source": {"component": MANAGER, "host": name}})
    assert kube.get("v1", "Event", event["metadata"]["name"], "default")["reason"] == "RbacProbe"


@pytest.fixture(scope="module")
def deployment(kube: Kube, work_ns: str) -> str:
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "mig-app", "namespace": work_ns},
                 "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "mig-app"}},
                          "template": {"metadata": {"labels": {"app": "mig-app"}},
                                       "spec": {"containers": [{"name": "c", "image": IMAGE}]}}}})
    return "mig-app"


def test_rbac_denies_everything_else(kube: Kube, rbac_identity: AgentIdentity, deployment: str,
                                     other_node_pod: dict[str, Any]) -> None:
    """Each call the real authorizer must refuse (403), and nothing changed behind the refusal."""
    me = rbac_identity.kube
    node = rbac_identity.pod["spec"]["nodeName"]
    sa = f"system:serviceaccount:{NS}:{rbac_identity.service_account}"
    patch = {"metadata": {"labels": {"owned-by": "mig-manager"}}}
    escalate = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "mig-manager-escalates"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": rbac_identity.service_account, "namespace": NS}]}
    pod = gpu_pod("sneaky", node, "sneaky")
    calls: list[tuple[str, str, str, Any]] = [
        ("list Secrets in its namespace", "GET", f"/api/v1/namespaces/{NS}/secrets", None),
        ("list Secrets cluster-wide", "GET", "/api/v1/secrets", None),
        ("read a Secret", "GET", f"/api/v1/namespaces/{NS}/secrets/anything", None),
        ("patch a Deployment", "PATCH", f"/apis/apps/v1/namespaces/{WORK_NS}/deployments/{deployment}", patch),
        ("patch its own DaemonSet", "PATCH", f"/apis/apps/v1/namespaces/{NS}/daemonsets/{MANAGER}", patch),
        ("patch its mig-parted ConfigMap", "PATCH", f"/api/v1/namespaces/{NS}/configmaps/{CONFIG_MAP}", patch),
        ("create a ClusterRoleBinding", "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", escalate),
        ("delete its Node", "DELETE", f"/api/v1/nodes/{node}", None),
        ("patch its Node's status (capacity)", "PATCH", f"/api/v1/nodes/{node}/status",
         {"status": {"capacity": {"nvidia.com/gpu": "99"}}}),
        ("create a pod", "POST", f"/api/v1/namespaces/{WORK_NS}/pods", pod),
        ("exec into a pod", "POST", f"/api/v1/namespaces/{WORK_NS}/pods/elsewhere/exec", None),
        ("mint a token for its ServiceAccount", "POST",
         f"/api/v1/namespaces/{NS}/serviceaccounts/{rbac_identity.service_account}/token",
         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
    ]
    allowed = []
    for what, method, path, body in calls:
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        try:
            me.request(method, path, body, content_type=content, what=what)
        except ApiError as e:
            assert (e.status, e.reason) == (403, "Forbidden"), f"{what}: {e}"
            assert sa in e.message, e.message
            continue
        allowed.append(what)
    assert not allowed, f"the mig-manager may {allowed}"
    # Nothing happened behind the refusals.
    for kind, name, namespace in (("Deployment", deployment, WORK_NS), ("DaemonSet", MANAGER, NS)):
        assert "owned-by" not in kube.get("apps/v1", kind, name, namespace)["metadata"].get("labels", {})
    assert kube.get_or_none("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "mig-manager-escalates") is None
    assert kube.get_or_none("v1", "Pod", "sneaky", WORK_NS) is None
    assert kube.get("v1", "Node", node)["status"]["capacity"].get("nvidia.com/gpu") != "99"


POLICY = "nvidia-gpu-node-agents-own-node"
DENIED_BY = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request"


def test_manager_on_deckhouse_cannot_evict_at_all(kube: Kube, rbac_identity: AgentIdentity,
                                                  other_node_pod: dict[str, Any]) -> None:
    """On Deckhouse node-manager drains: the stack gives the manager no eviction right, so no Eviction of
    its, on any node, passes the authorizer."""
    with pytest.raises(ApiError) as caught:
        evict(rbac_identity.kube, "elsewhere")
    assert caught.value.status == 403 and 'cannot create resource "pods/eviction"' in caught.value.message
    assert not gone(kube, "elsewhere")


def test_manager_that_drains_itself_cannot_evict_pods_on_another_node(
        kube: Kube, rbac_identity: AgentIdentity, other_node_pod: dict[str, Any], cordon_rbac: RunningGuard) -> None:
    """RBAC grants ``pods/eviction`` for every pod; the eviction guard, which looks the pod up, refuses
    the one on another node, dry run or not, with its message. The same call by the cluster's admin
    never reaches the guard (the webhook matches only the manager's ServiceAccount)."""
    mine = rbac_identity.pod["spec"]["nodeName"]
    other = other_node_pod["spec"]["nodeName"]
    assert other != mine
    for dry_run in (True, False):
        with pytest.raises(ApiError) as caught:
            evict(rbac_identity.kube, "elsewhere", dry_run=dry_run)
        assert (caught.value.status, caught.value.reason) == (403, "Forbidden"), caught.value
        assert f'admission webhook "{guard_contract.WEBHOOK_NAME}" denied the request' in caught.value.message
        assert guard_contract.denial(mine, WORK_NS, "elsewhere", other) in caught.value.message
        assert running(kube, "elsewhere")
    decisions = cordon_rbac.guard.decisions
    evict(kube, "elsewhere", dry_run=True)
    assert cordon_rbac.guard.decisions == decisions, "an admin's eviction went through the guard"


@pytest.mark.usefixtures("work_ns")
def test_manager_may_evict_on_its_own_node_and_the_guard_fails_closed(
        kube: Kube, rbac_identity: AgentIdentity, cordon_rbac: RunningGuard) -> None:
    """Its own node's pod passes the guard (dry run); with the guard unreachable the manager's eviction
    is refused, not let through, while the admin's still works."""
    mine = rbac_identity.pod["spec"]["nodeName"]
    kube.create(gpu_pod("mine", mine, "mig-own", gpus=0))
    wait_for(lambda: running(kube, "mine"), timeout=30, what="the pod on the manager's node Running")
    decisions = cordon_rbac.guard.decisions
    evict(rbac_identity.kube, "mine", dry_run=True)
    assert cordon_rbac.guard.decisions == decisions + 1 and running(kube, "mine")
    cordon_rbac.guard.stop()
    with pytest.raises(ApiError) as caught:
        evict(rbac_identity.kube, "mine", dry_run=True)
    assert caught.value.status == 500 and "failed calling webhook" in caught.value.message, caught.value
    evict(kube, "mine", dry_run=True)
    kube.delete("v1", "Pod", "mine", WORK_NS)


def test_manager_cannot_patch_another_node(kube: Kube, rbac_identity: AgentIdentity) -> None:
    """The node-confinement policy: the manager's token names its node, and only that Node may be changed."""
    other = f"{PREFIX}worker-2"
    create_kwok_node(kube, other, {"node.deckhouse.io/group": "mig-worker"})
    mine = rbac_identity.pod["spec"]["nodeName"]
    with pytest.raises(ApiError) as caught:
        rbac_identity.kube.patch("v1", "Node", other, {"spec": {"unschedulable": True}})
    assert (caught.value.status, caught.value.reason) == (403, "Forbidden"), caught.value
    assert DENIED_BY in caught.value.message
    assert f"the mig-manager on node {mine} may only change its own node, not node {other}" in caught.value.message
    assert not kube.get("v1", "Node", other)["spec"].get("unschedulable")


# --- 4. Concurrent writers: the taint list is never written from a stale read ---------------------------


class RacingNodeApi(KubeNodeApi):
    """The manager's real API client, but another controller taints the Node right after the first read."""

    def __init__(self, api: Any, node_name: str, admin: Kube, taint: dict[str, str]) -> None:
        super().__init__(api, node_name)
        self.admin = admin
        self.taint = taint
        self.raced = False

    def read_node(self) -> NodeView:
        view = super().read_node()
        if not self.raced:
            self.raced = True
            current = self.admin.get("v1", "Node", self.node_name)["spec"].get("taints", [])
            self.admin.patch("v1", "Node", self.node_name, {"spec": {"taints": [*current, self.taint]}})
        return view


@pytest.fixture
def race_node(kube: Kube, stack: Rendered) -> Iterator[str]:
    name = f"{PREFIX}h100-race"
    h100_node(kube, stack, name)
    yield name
    # The other controller is done: its taint goes (an untolerated taint would count the stack's agent
    # pods on this node as misscheduled in their DaemonSets' status, which other modules check).
    kube.patch("v1", "Node", name, {"spec": {"taints": stack.node_template.get("taints", [])}})


def test_a_taint_added_meanwhile_survives_the_managers_taint_patches(
        kube: Kube, stack: Rendered, race_node: str, tmp_path: Path) -> None:
    """Merge patch replaces ``spec.taints`` whole: a list computed from a stale read would drop the other's taint."""
    name = race_node
    ident = identity(kube, MANAGER, name, tmp_path)
    # With the timestamp the node lifecycle controller stamps on its taints: given back unchanged too.
    maintenance = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule",
                   "timeAdded": "2026-01-01T00:00:00Z"}
    node_api = RacingNodeApi(AgentKube.connect(ident.kubeconfig), name, kube, maintenance)
    host = build_fake_host(tmp_path / "host", MACHINE).root
    state = sim_state_file(host, MACHINE)
    config = load_config_text(stack.config_text, CONFIG_MAP)
    with open_nvml(NvmlBackend("simulated", MACHINE, state)) as nvml:
        root = HostRoot(host, exec_mode="direct")
        manager = MigManager(node=node_api, backend=NvmlMigBackend(nvml, SimulatedReset(MACHINE, state)),
                             load_config=lambda: config, files=root, step_lock=HostStepLock(root),
                             boot_id=lambda: boot_id(root), clock=time.time, rebooter=HostRebooter(root),
                             settings=Settings(drain=DrainMode.DECKHOUSE))
        waiting = manager.run_until_blocked()  # begin, pause, ask for approval: then wait for Deckhouse
        assert node_api.raced and waiting.reason.startswith(f"waiting for {labels.DISRUPTION_APPROVED}"), waiting
        taints = kube.get("v1", "Node", name)["spec"]["taints"]
        assert maintenance in taints, f"the manager's pause dropped a taint set meanwhile: {taints}"
        assert {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"} in taints
        # Stopped before approval: abort, give the node back, keep the other controller's taint.
        manager.stop.set()
        assert manager.run_until_blocked().act.value == "exit"
    node = kube.get("v1", "Node", name)
    assert node["spec"]["taints"] == [*stack.node_template.get("taints", []), maintenance]
    assert labels.MIG_CONFIG_STATE not in node["metadata"]["labels"]  # aborted: the state it had before
    assert not [k for k in node["metadata"].get("annotations", {}) if k in DRAIN_ANNOTATIONS]
