"""Every node agent that writes Nodes or Pods is kept to its own node by the API server itself.

The dev stack as applied to the real control plane, two kwok Nodes per agent, and each agent's own
pod-bound token (the one its pod gets, carrying ``authentication.kubernetes.io/node-name``): the calls
the agent makes on its own node pass; the same calls aimed at the other node, and the writes no agent
needs (a label outside the GPU domains, a controller's taint, a cordon by the labeller), are refused by
the stack's ValidatingAdmissionPolicy with its own message. Writes are dry runs (admission runs on them
too), so the agents' real Nodes are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import ApiError, ControlPlane, Kube
from localcluster.client import MERGE_PATCH
from localcluster.dryrun import install_crds
from localcluster.objects import create_kwok_node, service_account_kube, wait_for
from nvgpu import inventory
from nvgpu import labels as names
from nvidia_gpu.components.manifests import confinement
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.preview import crds
from tests.cluster.agents import NS, AgentIdentity, create_group_nodes, identity
from tests.cluster.stack import AppliedStack, apply_stack
from tests.kit.tools import required_bin

pytestmark = pytest.mark.cluster

POLICY = confinement.policy_name(NS)
DENIED_BY = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request"
#: The prod stack (no Deckhouse: a privileged setup DaemonSet prepares the nodes), in its own namespace.
PROD_NS = "gpu-system"
PROD_POLICY = confinement.policy_name(PROD_NS)
SETUP = ("gpu-setup-h100-train", {"node.kubernetes.io/instance-type": "p5.48xlarge"})
#: (DaemonSet, Deckhouse NodeGroup) of the agents under test, from the dev stack.
LABELLER = ("gpu-labeller-a100-train", "gpu-a100")
MIG = ("nvidia-gpu-mig-manager", "gpu-h100")


@pytest.fixture(scope="module")
def agents(kube: Kube, dev_stack: AppliedStack, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, AgentIdentity]]:
    work = tmp_path_factory.mktemp("confinement")
    nodes = {"labeller": ("conf-a100-a", "conf-a100-b"), "mig": ("conf-h100-a", "conf-h100-b")}
    create_group_nodes(kube, dev_stack, LABELLER[1], nodes["labeller"])
    create_group_nodes(kube, dev_stack, MIG[1], nodes["mig"])
    try:
        found = {
            "labeller": identity(kube, LABELLER[0], nodes["labeller"][0], work),
            "mig": identity(kube, MIG[0], nodes["mig"][0], work),
        }
        _enforced(found["labeller"].kube, nodes["labeller"][1], POLICY)
        yield found
    finally:
        for name in (*nodes["labeller"], *nodes["mig"]):
            kube.delete("v1", "Node", name)


def _dry_patch(me: Kube, node: str, body: dict[str, Any]) -> Any:
    return me.request("PATCH", me.resource("v1", "Node").path(None, node), body, content_type=MERGE_PATCH,
                      query={"dryRun": "All"})


def _refused(call: Callable[[], Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def _denied(call: Callable[[], Any], message: str, policy: str = POLICY) -> None:
    """Refused by the confinement policy (403 Forbidden, not 422: who writes, not what), with ``message``."""
    e = _refused(call)
    assert (e.status, e.reason) == (403, "Forbidden"), e
    assert f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request" in e.message, e.message
    assert message in e.message, e.message


def _enforced(me: Kube, other: str, policy: str) -> None:
    """Wait until the API server enforces ``policy`` for ``me``: a binding takes effect once the server's
    policy informer has seen it and type-checked the policy (about a second on a fresh control plane, longer
    under load), so a call made straight after the apply may pass unchecked."""
    def refused() -> bool | None:
        try:
            _dry_patch(me, other, {"metadata": {"labels": {names.GPU_SETUP_COMPLETE: ""}}})
        except ApiError as e:
            return (e.status == 403 and f"ValidatingAdmissionPolicy '{policy}'" in e.message) or None
        return None
    wait_for(refused, timeout=60, interval=0.2, what=f"{policy} enforced")


def _taints(kube: Kube, node: str) -> list[dict[str, Any]]:
    return list(kube.get("v1", "Node", node)["spec"].get("taints") or [])


def test_the_labeller_changes_only_its_own_node_and_only_its_own_labels(kube: Kube,
                                                                        agents: dict[str, AgentIdentity]) -> None:
    me = agents["labeller"].kube
    own = agents["labeller"].pod["spec"]["nodeName"]
    other = "conf-a100-b" if own == "conf-a100-a" else "conf-a100-a"
    who = f"the {AgentRole.LABELLER.value} on node {own}"

    # What it does on its own node passes: GPU labels, its ownership annotations, the group's taints.
    _dry_patch(me, own, {"metadata": {"labels": {"nvidia.com/gpu.count": "8", names.NODE_GROUP: "a100-train"},
                                      "annotations": {names.OWNED_NODE_LABELS: "nvidia.com/gpu.count"}}})
    dedicated = {"key": "dedicated", "value": "ml-training", "effect": "PreferNoSchedule"}  # a dev group's taint key
    _dry_patch(me, own, {"spec": {"taints": [*_taints(kube, own), dedicated]}})

    # The same call aimed at the other node is refused.
    _denied(lambda: _dry_patch(me, other, {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}}),
            f"{who} may only change its own node, not node {other}")
    # On its own node: no label outside the GPU domains (a node that names itself control plane would
    # attract its workloads), no controller's taint, no cordon, no other spec field.
    _denied(lambda: _dry_patch(me, own, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            "may not change node label(s) node-role.kubernetes.io/control-plane: not labels its role writes")
    _denied(lambda: _dry_patch(me, own, {"metadata": {"annotations": {"example.com/owner": "me"}}}),
            "may not change node annotation(s) example.com/owner")
    out_of_service = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
    _denied(lambda: _dry_patch(me, own, {"spec": {"taints": [*_taints(kube, own), out_of_service]}}),
            "may not change taint(s) node.kubernetes.io/out-of-service that Kubernetes' controllers own")
    _denied(lambda: _dry_patch(me, own, {"spec": {"unschedulable": True}}), "may not cordon or uncordon its node")
    _denied(lambda: _dry_patch(me, own, {"spec": {"providerID": "kwok://somewhere-else"}}),
            "may change only labels, annotations, taints and cordon on its node")


def test_the_labeller_writes_only_what_its_role_writes_on_its_own_node(kube: Kube,
                                                                        agents: dict[str, AgentIdentity]) -> None:
    """What the review did with the unprivileged labeller's token, each refused: a foreign owner (the garbage
    collector deleted the Node a second later), a finalizer, approving its own node's Deckhouse disruption,
    lifting an administrator's taint, forging the driver upgrade's or the MIG manager's state, pausing
    another component, and squatting on another node's GPU object name."""
    me = agents["labeller"].kube
    own = agents["labeller"].pod["spec"]["nodeName"]
    other = "conf-a100-b" if own == "conf-a100-a" else "conf-a100-a"
    node_uid = kube.get("v1", "Node", other)["metadata"]["uid"]
    _denied(lambda: _dry_patch(me, own, {"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": other, "uid": node_uid}]}}),
        "may not change its node's owner references or finalizers")
    _denied(lambda: _dry_patch(me, own, {"metadata": {"finalizers": ["example.com/hold"]}}),
            "may not change its node's owner references or finalizers")
    _denied(lambda: _dry_patch(me, own, {"metadata": {"annotations": {names.DISRUPTION_APPROVED: ""}}}),
            f"may not change node annotation(s) {names.DISRUPTION_APPROVED}: not annotations its role writes")
    for key, value in ((names.DRIVER_UPGRADE_STATE, "upgrade-failed"), (names.MIG_CONFIG_STATE, "failed"),
                       (names.GPU_DEPLOY_PREFIX + "device-plugin", "false"), (names.GPU_SETUP_COMPLETE, "forged")):
        _denied(lambda key=key, value=value: _dry_patch(me, own, {"metadata": {"labels": {key: value}}}),  # type: ignore[misc]
                f"may not change node label(s) {key}: not labels its role writes")
    # An administrator's taint on the labeller's node: the labeller may not lift it (it is not a key any
    # node group declares), while the group's own taint stays its to set.
    hold = {"key": "example.com/maintenance", "value": "disk", "effect": "NoSchedule"}
    kube.patch("v1", "Node", own, {"spec": {"taints": [*_taints(kube, own), hold]}})
    try:
        _denied(lambda: _dry_patch(me, own, {"spec": {"taints": [t for t in _taints(kube, own) if t != hold]}}),
                "may not change taint(s) example.com/maintenance: not taints its role or the node groups declare")
        _denied(lambda: _dry_patch(me, own, {"spec": {"taints": [*_taints(kube, own), {**hold, "key": "team"}]}}),
                "may not change taint(s) team: not taints its role or the node groups declare")
    finally:
        kube.patch("v1", "Node", own, {"spec": {"taints": [t for t in _taints(kube, own) if t != hold]}})
    # GPU objects: only <own node>-gpu<index>, labelled and owned as its own node's.
    def create(name: str, node: str, index: int = 0, label: str | None = None) -> Any:
        return me.request("POST", inventory.collection_path(), {
            "apiVersion": inventory.API_VERSION, "kind": inventory.KIND,
            "metadata": {"name": name, "labels": {inventory.NODE_LABEL: label or node}},
            "spec": {"node": node, "index": index}}, query={"dryRun": "All"})

    create(f"{own}-gpu3", own, 3)
    for name, index, label in ((f"{other}-gpu0", 0, None), (f"{own}-gpu1", 0, None), (f"{own}-gpu0", 0, other)):
        _denied(lambda name=name, index=index, label=label: create(name, own, index, label),  # type: ignore[misc]
                "may name a GPU object only <node>-gpu<index> of its own node")


def test_the_mig_manager_cordons_and_deletes_only_on_its_own_node(kube: Kube, agents: dict[str, AgentIdentity],
                                                                   tmp_path: Path) -> None:
    me = agents["mig"].kube
    own = agents["mig"].pod["spec"]["nodeName"]
    other = "conf-h100-b" if own == "conf-h100-a" else "conf-h100-a"
    who = f"the {confinement.MIG_MANAGER_SA} on node {own}"

    _dry_patch(me, own, {"spec": {"unschedulable": True},
                         "metadata": {"labels": {names.MIG_CONFIG_STATE: "pending"},
                                      "annotations": {names.DISRUPTION_REQUIRED: ""}}})
    # Deckhouse's handshake: it asks for a disruption and a drain, but may not approve one nor say a drain
    # is done; it may clear both once the node is given back.
    for key in (names.DISRUPTION_APPROVED, names.DRAINED):
        _denied(lambda key=key: _dry_patch(me, own, {"metadata": {"annotations": {key: ""}}}),  # type: ignore[misc]
                f"may not change node annotation(s) {key}: not annotations its role writes")
    kube.patch("v1", "Node", own, {"metadata": {"annotations": {names.DISRUPTION_APPROVED: "", names.DRAINED: ""}}})
    try:
        _dry_patch(me, own, {"metadata": {"annotations": {names.DISRUPTION_APPROVED: None, names.DRAINED: None}}})
    finally:
        kube.patch("v1", "Node", own, {"metadata": {"annotations": {names.DISRUPTION_APPROVED: None,
                                                                    names.DRAINED: None}}})
    _denied(lambda: _dry_patch(me, own, {"metadata": {"labels": {names.DRIVER_UPGRADE_STATE: "upgrade-done"}}}),
            f"may not change node label(s) {names.DRIVER_UPGRADE_STATE}: not labels its role writes")
    _denied(lambda: _dry_patch(me, other, {"spec": {"unschedulable": True}}),
            f"{who} may only change its own node, not node {other}")

    # Pods: a GPU agent's on each node (a DaemonSet's pod, bound by name as the scheduler binds them; the
    # DaemonSet places nothing itself), deleted only on its own node; and a pod that is no GPU agent's.
    template = {"metadata": {"labels": {"app": "gpu-agent"}},
                "spec": {"nodeSelector": {"example.com/nowhere": "x"},
                         "containers": [{"name": "c", "image": "registry.example.com/agent:1"}]}}
    agents_ds = kube.create({"apiVersion": "apps/v1", "kind": "DaemonSet",
                             "metadata": {"name": "gpu-agent", "namespace": "default"},
                             "spec": {"selector": {"matchLabels": {"app": "gpu-agent"}}, "template": template}})
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-agent", "uid": agents_ds["metadata"]["uid"]}
    pods = {}
    for node in (own, other):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"gpu-job-{node}", "namespace": "default", "ownerReferences": [owner],
                            "labels": {"app.kubernetes.io/name": "device-plugin"}},
               "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "c", "image": "registry.example.com/cuda:12"}]}}
        pods[node] = kube.create(pod)
    system = kube.create({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": f"proxy-{own}", "namespace": "default"},
                          "spec": {"nodeName": own, "tolerations": [{"operator": "Exists"}],
                                   "containers": [{"name": "c", "image": "registry.example.com/proxy:1"}]}})
    try:
        me.delete("v1", "Pod", pods[own]["metadata"]["name"], "default", dryRun="All")
        _denied(lambda: me.delete("v1", "Pod", pods[other]["metadata"]["name"], "default", dryRun="All"),
                f"{who} may only change its own node, not a pod on node {other}")
        # On its own node, not a pod that holds no GPU (the review deleted kube-system's this way).
        _denied(lambda: me.delete("v1", "Pod", system["metadata"]["name"], "default", dryRun="All"),
                f"may delete only GPU agents' pods (a DaemonSet's pod that asks for nvidia.com/ resources, is a "
                f"known GPU agent or waits on a nvidia.com/gpu.deploy label), not default/proxy-{own}")
        # On Deckhouse the manager never evicts (node-manager drains): RBAC refuses it, as no policy could
        # keep an Eviction to its node.
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pods[own]["metadata"]["name"], "namespace": "default"}}
        refused = _refused(lambda: me.request(
            "POST", me.resource("v1", "Pod").path("default", pods[own]["metadata"]["name"]) + "/eviction",
            eviction, query={"dryRun": "All"}))
        assert refused.status == 403 and 'cannot create resource "pods/eviction"' in refused.message, refused
    finally:
        for pod in [*pods.values(), system]:
            kube.delete("v1", "Pod", pod["metadata"]["name"], "default", gracePeriodSeconds="0")
        kube.delete("apps/v1", "DaemonSet", "gpu-agent", "default")
        wait_for(lambda: not [n for n in (f"gpu-job-{own}", f"gpu-job-{other}", f"proxy-{own}")
                              if kube.get_or_none("v1", "Pod", n, "default")],
                 timeout=30, what="the test pods gone")


def test_an_agent_token_without_a_node_is_refused_whatever_it_writes(kube: Kube, agents: dict[str, AgentIdentity],
                                                                      dev_stack: AppliedStack) -> None:
    """A token of the labeller's ServiceAccount not bound to a pod (no node claim) may change no Node."""
    sa = dev_stack.object("DaemonSet", LABELLER[0])["spec"]["template"]["spec"]["serviceAccountName"]
    unbound = service_account_kube(kube, NS, sa)
    own = agents["labeller"].pod["spec"]["nodeName"]
    _denied(lambda: _dry_patch(unbound, own, {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}}),
            f"the {sa} token carries no node name; it must run in a pod on a node")


@pytest.fixture(scope="module")
def node_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentIdentity, str]]:
    """The prod stack applied to a control plane of its own (its cluster-wide objects would meet the dev
    stack's in the session's), two kwok Nodes of its h100-train group, and the setup pod's identity on one."""
    work = tmp_path_factory.mktemp("setup-confinement")
    cp = ControlPlane(directory=work / "cluster", bin_dir=required_bin())
    cp.start()
    try:
        kube = cp.admin()
        # The prod stack's PodMonitors and PrometheusRule: the Prometheus Operator's kinds, as its cluster has.
        install_crds(kube, sorted(crds.CRD_DIR.glob("*.monitoring.coreos.com.yaml")))
        apply_stack(kube, "prod")
        own, other = "conf-p5-a", "conf-p5-b"
        for name in (own, other):
            create_kwok_node(kube, name, SETUP[1])
        setup = identity(kube, SETUP[0], own, work / "id", namespace=PROD_NS)
        _enforced(setup.kube, other, PROD_POLICY)
        yield setup, other
    finally:
        cp.stop(remove=False)


def test_node_setup_marks_only_its_own_node_and_may_neither_cordon_nor_delete(
        node_setup: tuple[AgentIdentity, str]) -> None:
    """The privileged setup agent's token (gpu-setup, prod stack): what setup and teardown write on its own
    node passes, the same write on another node and what it never writes are refused."""
    setup, other = node_setup
    me, own = setup.kube, setup.pod["spec"]["nodeName"]
    who = f"the {AgentRole.NODE_SETUP.value} on node {own}"
    assert setup.service_account == AgentRole.NODE_SETUP.value

    # setup opens the gate; teardown closes it and withdraws the labeller's labels and ownership records.
    _dry_patch(me, own, {"metadata": {"labels": {names.GPU_SETUP_COMPLETE: "", names.GPU_VFIO_READY: "true"}}})
    _dry_patch(me, own, {"metadata": {"labels": {names.GPU_SETUP_COMPLETE: None, "nvidia.com/gpu.count": None},
                                      "annotations": {names.OWNED_NODE_LABELS: None}}})
    _denied(lambda: _dry_patch(me, other, {"metadata": {"labels": {names.GPU_SETUP_COMPLETE: ""}}}),
            f"{who} may only change its own node, not node {other}", PROD_POLICY)
    _denied(lambda: _dry_patch(me, own, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            "may not change node label(s) node-role.kubernetes.io/control-plane", PROD_POLICY)
    _denied(lambda: _dry_patch(me, own, {"spec": {"unschedulable": True}}), "may not cordon or uncordon its node",
            PROD_POLICY)
    # The labeller's labels are setup's to withdraw, never to set; the MIG manager's and the upgrade's state
    # are not its at all.
    for key in ("nvidia.com/gpu.count", names.MIG_CONFIG_STATE, names.DRIVER_UPGRADE_STATE):
        _denied(lambda key=key: _dry_patch(me, own, {"metadata": {"labels": {key: "1"}}}),  # type: ignore[misc]
                f"may not change node label(s) {key}: not labels its role writes", PROD_POLICY)
    # RBAC: no pods, no GPU inventory (only the labeller writes those).
    refused = _refused(lambda: me.delete("v1", "Pod", "any", "default", dryRun="All"))
    assert refused.status == 403 and 'cannot delete resource "pods"' in refused.message, refused
    refused = _refused(lambda: me.request("POST", inventory.collection_path(), {
        "apiVersion": inventory.API_VERSION, "kind": inventory.KIND, "metadata": {"name": f"{own}-gpu0"},
        "spec": {"node": own, "index": 0}}, query={"dryRun": "All"}))
    assert refused.status == 403 and 'cannot create resource "gpus"' in refused.message, refused


def _event(me: Kube, namespace: str, node: str, uid: str = "") -> Any:
    body = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{node}.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
                               **({"namespace": namespace} if namespace != "default" else {})},
            "reason": "GpuLost", "message": "forged", "type": "Warning", "source": {"component": "test"}}
    return me.request("POST", f"/api/v1/namespaces/{namespace}/events", body, query={"dryRun": "All"})


def test_events_only_about_the_agents_own_node_and_only_from_agents_that_record_them(
        kube: Kube, agents: dict[str, AgentIdentity], tmp_path: Path) -> None:
    """The review forged a Warning about another node with the device plugin's token. The device plugin
    records no Events (RBAC: none), and the MIG manager, which does, may record them only about its own
    node, in ``default`` as the kubelet does."""
    me = agents["mig"].kube
    own = agents["mig"].pod["spec"]["nodeName"]
    other = "conf-h100-b" if own == "conf-h100-a" else "conf-h100-a"
    _event(me, "default", own)
    _denied(lambda: _event(me, "default", other),
            f"the {confinement.MIG_MANAGER_SA} on node {own} may only change its own node, not an event about node "
            f"{other}")
    _denied(lambda: _event(me, "kube-system", own), "may record events only in default")
    plugin = identity(kube, "device-plugin-a100-train", agents["labeller"].pod["spec"]["nodeName"], tmp_path)
    refused = _refused(lambda: _event(plugin.kube, "default", plugin.pod["spec"]["nodeName"]))
    assert refused.status == 403 and 'cannot create resource "events"' in refused.message, refused
