"""Proof 3 (part): the labeller and the device plugin's Node watch against the real API server, each with
the identity of its own DaemonSet pod on a kwok Node.

The labeller runs as a process (``python -m node_agent ... labels``) on a simulated GPU machine with the
arguments of the dev stack's rendered DaemonSet, through a kubeconfig holding a token bound to its pod,
so RBAC, merge-patch semantics, resourceVersion conflicts and no-op writes are the real server's. The
dev stack is a Deckhouse stack: its labeller carries no ``--node-label``/``--node-taint`` (the NodeGroup
node template sets them), so the group's labels and taints come from the renderer's own
``labeller_args`` for the same group on the daemonset backend, never re-typed here.

The device plugin's watch (``node_agent.deviceplugin.nodewatch``) runs in-process with the plugin pod's
kubeconfig: initial label, live changes within a second or two, watches the server ends and the watch
resumes, and a watch that really expires (``410 Gone``: the API server crashed and came back with a new
watch cache). The ``device-plugin`` command itself runs as a process with ``--kubeconfig`` against a
kubelet stand-in and switches config when an administrator changes the label. Both identities are
checked against the real authorizer: allowed what their ClusterRoles grant, refused (403) the rest.

Every Node here is named ``lab-*`` and belongs to this module; the stack's shared objects are not touched.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ApiError, ControlPlane, Kube
from localcluster.client import MERGE_PATCH
from localcluster.objects import create_kwok_node, service_account_kube, wait_for, write_kubeconfig
from node_agent.cli.context import AgentContext
from node_agent.deviceplugin.nodewatch import NodeLabelWatch, WatchTiming
from node_agent.kube.errors import Conflict, Gone, KubeError
from node_agent.labeller import gfd
from node_agent.labeller import labels as labels_cmd
from node_agent.labeller.nodeconfig import NodePlan, Requested
from node_agent.labeller.nodepatch import KubeNodeApi, apply_plan
from nvgpu import labels as names
from nvgpu.stackconfig import GroupPlan, NodeSetupBackend
from nvidia_gpu.components.manifests.workloads import GroupContext, labeller_args
from nvml_sim import get_machine
from tests.cluster.agents import (
    REPO,
    AgentIdentity,
    agent_command,
    config_map_files,
    identity,
    node_annotations,
    node_labels,
    node_taints,
    one_run,
    read_node,
    run_agent,
    with_config_dir,
)
from tests.cluster.stack import AppliedStack, rendered
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet

NS = "nvidia-gpu"
PREFIX = "lab-"
LABELLER_GROUP = "a100-train"  # Exclusive, with an extra taint: two taints and four labels to manage
LABELLER_NODE_GROUP = "gpu-a100"
MACHINE = "dgx-a100-80gb"
PLUGIN_GROUP = "a30-mps"
PLUGIN_NODE_GROUP = "gpu-a30"
TIMESTAMP = "nvidia.com/gfd.timestamp"
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
#: Put there by an administrator, not by the stack: the labeller must keep them exactly as they are.
FOREIGN_LABEL = ("team", "ml")
FOREIGN_TAINT = {"key": "example.com/maintenance", "value": "planned", "effect": "PreferNoSchedule",
                 "timeAdded": "2024-05-01T10:00:00Z"}


# --- nodes and identities ------------------------------------------------------------------------

def _template(stack: AppliedStack, node_group: str) -> dict[str, Any]:
    return dict(stack.object("NodeGroup", node_group)["spec"]["nodeTemplate"])


def _settled(kube: Kube, name: str) -> dict[str, Any]:
    """The Node once the control plane is done with it: Ready, the node lifecycle controller's
    ``node.kubernetes.io/*`` taints gone and the TTL controller's annotation written, so the only
    writers left are the agent under test and this test."""

    def probe() -> dict[str, Any] | None:
        node: dict[str, Any] = kube.get("v1", "Node", name)
        taints = node["spec"].get("taints") or []
        quiet = not any(t["key"].startswith("node.kubernetes.io/") for t in taints)
        ttl = "node.alpha.kubernetes.io/ttl" in (node["metadata"].get("annotations") or {})
        return node if quiet and ttl else None

    return wait_for(probe, timeout=30, what=f"Node {name} settled")


@pytest.fixture(scope="module")
def lab_nodes(kube: Kube) -> Iterator[list[str]]:
    """The Nodes this module made, deleted at its end (their pods go with them)."""
    made: list[str] = []
    yield made
    for name in made:
        kube.delete("v1", "Node", name)


def _gpu_node(kube: Kube, made: list[str], name: str, node_group: str, template: dict[str, Any] | None = None) -> None:
    """A node of ``node_group`` that finished setup; ``template`` adds the node template as Deckhouse would."""
    template = template or {}
    labels = {names.DECKHOUSE_NODE_GROUP: node_group, names.GPU_SETUP_COMPLETE: "", **template.get("labels", {})}
    made.append(name)
    create_kwok_node(kube, name, labels, template.get("taints", []))


@dataclass
class Labeller:
    """One labeller: its Node, its pod identity, its simulated host and the arguments it runs with."""

    node: str
    agent: AgentIdentity
    host: FakeHost
    args: list[str]  #: the DaemonSet's arguments, as one run (no ``--loop``)
    node_flags: list[str]  #: the group's ``--node-label``/``--node-taint`` flags (daemonset backend)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
        env["NODE_NAME"] = self.agent.pod["spec"]["nodeName"]  # the DaemonSet's fieldRef spec.nodeName
        return env

    def globals(self) -> list[str]:
        """The global options of a run here: the fake host, its simulated GPUs, the pod's token."""
        return ["--host-root", str(self.host.root), "--host-exec", "direct", "--nvml", f"simulated:{MACHINE}",
                "--kubeconfig", str(self.agent.kubeconfig)]

    def run(self, *args: str) -> dict[str, Any]:
        """``python -m node_agent --json ... ARGS`` as the DaemonSet's container would run it."""
        done = run_agent(*self.globals(), "--json", *args, env=self.env())
        assert done.returncode == 0, f"labeller exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc


def _container_args(stack: AppliedStack, daemonset: str) -> list[str]:
    return list(stack.object("DaemonSet", daemonset)["spec"]["template"]["spec"]["containers"][0]["args"])


def _with_configs(stack: AppliedStack, group: str, args: list[str], work: Path) -> list[str]:
    """The labeller's arguments with the group's device-plugin ConfigMap where ``--config-dir`` says."""
    configs = config_map_files(stack.object("ConfigMap", f"device-plugin-config-{group}")["data"], work / "configs")
    return with_config_dir(args, configs)


def _labeller_run(stack: AppliedStack, group: str, ds_args: list[str], work: Path) -> list[str]:
    """The labeller DaemonSet's arguments as one run, its device-plugin ConfigMap in place."""
    return _with_configs(stack, group, one_run(ds_args), work)


def _daemonset_backend_flags(stack: AppliedStack, group_name: str, ds_args: list[str]) -> list[str]:
    """The ``--node-label``/``--node-taint`` flags the renderer gives this group's labeller when the
    cluster has no Deckhouse node templates (``nodeSetup: daemonset``); everything else must be the
    rendered DaemonSet's arguments unchanged."""
    config = rendered(stack.name).config
    assert config is not None
    group = next(g for g in config.node_groups if g.name == group_name)
    cluster = config.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET})
    full = labeller_args(GroupContext(config.cluster.namespace, cluster, group, GroupPlan.of(cluster, group)))
    assert full[:len(ds_args)] == ds_args, "the daemonset backend only appends the node config flags"
    flags = full[len(ds_args):]
    assert flags and set(flags[::2]) == {"--node-label", "--node-taint"}
    return flags


def _flag_values(flags: list[str], flag: str) -> list[str]:
    return [flags[i + 1] for i in range(0, len(flags), 2) if flags[i] == flag]


def _without(flags: list[str], *values: str) -> list[str]:
    pairs = [(flags[i], flags[i + 1]) for i in range(0, len(flags), 2)]
    return [x for flag, value in pairs if value not in values for x in (flag, value)]


def _taint(text: str) -> dict[str, str]:
    """``KEY=VALUE:EFFECT`` as the Node carries it."""
    head, _, effect = text.rpartition(":")
    key, _, value = head.partition("=")
    return {"key": key, "effect": effect, **({"value": value} if value else {})}


_node = read_node
_labels = node_labels
_annotations = node_annotations
_taints = node_taints


@pytest.fixture(scope="module")
def other_node(kube: Kube, lab_nodes: list[str]) -> str:
    """A plain node (no GPU agent runs there) that the node agents must not be able to write. Not in the
    ``worker`` group: other modules schedule ordinary pods onto that group by its label."""
    name = f"{PREFIX}other"
    lab_nodes.append(name)
    create_kwok_node(kube, name, {names.DECKHOUSE_NODE_GROUP: f"{PREFIX}plain"})
    return name


@pytest.fixture(scope="module")
def labeller(kube: Kube, dev_stack: AppliedStack, lab_nodes: list[str],
             tmp_path_factory: pytest.TempPathFactory) -> Labeller:
    """The a100-train labeller on a bare node of its group (group label and setup gate only), on a
    simulated DGX A100; an administrator has put a label and a taint of their own on the Node."""
    name = f"{PREFIX}a100"
    _gpu_node(kube, lab_nodes, name, LABELLER_NODE_GROUP)
    tmp = tmp_path_factory.mktemp("labeller")
    ds = f"gpu-labeller-{LABELLER_GROUP}"
    agent = identity(kube, ds, name, tmp)
    node = _settled(kube, name)
    ds_args = _container_args(dev_stack, ds)
    flags = _daemonset_backend_flags(dev_stack, LABELLER_GROUP, ds_args)
    # The administrator's own label and taint, and one of the group's labels set before the labeller came
    # (node provisioning, say): that one is the administrator's too, so the labeller must not take it over.
    kube.patch("v1", "Node", name, {"metadata": {"labels": {FOREIGN_LABEL[0]: FOREIGN_LABEL[1], names.GPU_NODE: ""}},
                                    "spec": {"taints": [*_taints(node), FOREIGN_TAINT]}})
    return Labeller(name, agent, build_fake_host(tmp / "host", MACHINE),
                    _labeller_run(dev_stack, LABELLER_GROUP, ds_args, tmp), flags)


@pytest.fixture(scope="module")
def labelled(labeller: Labeller) -> dict[str, Any]:
    """The first labelling run with the group's node config: its JSON result."""
    return labeller.run(*labeller.args, *labeller.node_flags)


# --- the labeller ------------------------------------------------------------------------------------

def test_deckhouse_labeller_puts_gfd_labels_and_leaves_the_template_alone(
        kube: Kube, dev_stack: AppliedStack, lab_nodes: list[str], tmp_path: Path) -> None:
    """The dev stack's labeller exactly as rendered, on a node Deckhouse labelled and tainted from the
    NodeGroup's template: the GPU labels land, the template's labels and taints stay as they were and
    the labeller claims none of them (no ownership annotations)."""
    name = f"{PREFIX}a100-deckhouse"
    template = _template(dev_stack, LABELLER_NODE_GROUP)
    _gpu_node(kube, lab_nodes, name, LABELLER_NODE_GROUP, template)
    ds = f"gpu-labeller-{LABELLER_GROUP}"
    lab = Labeller(name, identity(kube, ds, name, tmp_path), build_fake_host(tmp_path / "host", MACHINE),
                   _labeller_run(dev_stack, LABELLER_GROUP, _container_args(dev_stack, ds), tmp_path), [])
    before = _settled(kube, name)
    doc = lab.run(*lab.args)
    after = _node(kube, name)
    labels = _labels(after)
    assert {k: labels.get(k) for k in doc["labels"]} == doc["labels"]
    assert labels["nvidia.com/gpu.product"] == gfd.sanitize(get_machine(MACHINE).product_name)
    assert labels["nvidia.com/gpu.count"] == str(get_machine(MACHINE).gpu_count)
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert {k: labels.get(k) for k in template["labels"]} == template["labels"]
    assert _taints(after) == _taints(before)
    assert names.OWNED_NODE_LABELS not in _annotations(after)
    assert names.OWNED_NODE_TAINTS not in _annotations(after)
    assert doc["nodeTaints"] is None
    assert lab.host.path(FEATURES).read_text() == gfd.feature_file(doc["labels"])


def test_labeller_applies_the_groups_labels_and_taints_and_keeps_foreign_ones(
        kube: Kube, labeller: Labeller, labelled: dict[str, Any]) -> None:
    """Off Deckhouse the labeller is what puts the group's labels and taints on a fresh node: one run
    brings them and the GPU labels, keeps what an administrator set, and records only what it set itself."""
    node = _node(kube, labeller.node)
    labels, taints, notes = _labels(node), _taints(node), _annotations(node)
    # GPU feature discovery, exactly what the run reported.
    assert {k: labels.get(k) for k in labelled["labels"]} == labelled["labels"]
    assert labels["nvidia.com/gpu.product"] == gfd.sanitize(get_machine(MACHINE).product_name)
    # The group's labels and taints.
    wanted_labels = dict(v.split("=", 1) for v in _flag_values(labeller.node_flags, "--node-label"))
    assert {k: labels.get(k) for k in wanted_labels} == wanted_labels
    wanted_taints = [_taint(v) for v in _flag_values(labeller.node_flags, "--node-taint")]
    assert all(t in taints for t in wanted_taints), taints
    # The administrator's label and taint, the taint byte for byte (timeAdded included).
    assert labels[FOREIGN_LABEL[0]] == FOREIGN_LABEL[1]
    assert FOREIGN_TAINT in taints
    assert len(taints) == len(wanted_taints) + 1
    # Ownership: what the labeller set, not the label that was already there with the wanted value.
    assert notes[names.OWNED_NODE_LABELS] == ",".join(sorted(set(wanted_labels) - {names.GPU_NODE}))
    assert notes[names.OWNED_NODE_TAINTS] == ",".join(sorted(f"{t['key']}:{t['effect']}" for t in wanted_taints))
    # With the DaemonSet's arguments (the timestamp on), a rerun writes nothing: the timestamp says when
    # the labels last changed, so a node whose labels are current is not rewritten every interval.
    again = labeller.run(*labeller.args, *labeller.node_flags)
    assert again["nodeChanges"] == {} and again["nodeTaints"] is None
    after = _node(kube, labeller.node)
    assert _labels(after) == labels
    assert (_taints(after), _annotations(after)) == (taints, notes)


def test_labeller_second_run_writes_nothing(kube: Kube, labeller: Labeller, labelled: dict[str, Any]) -> None:
    """Without the timestamp label, a run on a Node that already carries everything sends no patch at all:
    the real server's resourceVersion does not move."""
    labeller.run(*labeller.args, *labeller.node_flags, "--no-timestamp")  # drops the timestamp label
    rv = _node(kube, labeller.node)["metadata"]["resourceVersion"]
    doc = labeller.run(*labeller.args, *labeller.node_flags, "--no-timestamp")
    assert (doc["nodeChanges"], doc["nodeTaints"]) == ({}, None)
    assert _node(kube, labeller.node)["metadata"]["resourceVersion"] == rv


def test_labeller_removes_only_what_the_stack_stopped_asking_for(
        kube: Kube, labeller: Labeller, labelled: dict[str, Any]) -> None:
    """A label and a taint the stack no longer asks for go; a wanted label the labeller never owned, the
    administrator's label and taint and everything still asked for stay; the ownership records shrink."""
    flags = labeller.node_flags
    labels_before = _labels(_node(kube, labeller.node))
    dropped_label = f"{names.MIG_CONFIG}={labels_before[names.MIG_CONFIG]}"
    dropped_taint = next(v for v in _flag_values(flags, "--node-taint") if v.startswith("dedicated="))
    preset = f"{names.GPU_NODE}="  # wanted by the stack, but the administrator's (set before the labeller)
    try:
        labeller.run(*labeller.args, *_without(flags, dropped_label, dropped_taint, preset), "--no-timestamp")
        node = _node(kube, labeller.node)
        labels, taints, notes = _labels(node), _taints(node), _annotations(node)
        assert names.MIG_CONFIG not in labels
        assert _taint(dropped_taint) not in taints
        # Unowned: kept although no longer asked for.
        assert labels[names.GPU_NODE] == "" and labels[FOREIGN_LABEL[0]] == FOREIGN_LABEL[1]
        assert FOREIGN_TAINT in taints
        kept = [v for v in _flag_values(flags, "--node-label") if v not in (dropped_label, preset)]
        assert {k: labels.get(k) for k, _, v in (x.partition("=") for x in kept)} == dict(x.split("=", 1) for x in kept)
        gpu_taint = _taint(next(v for v in _flag_values(flags, "--node-taint") if v != dropped_taint))
        assert sorted(taints, key=lambda t: str(t["key"])) == [FOREIGN_TAINT, gpu_taint]
        assert notes[names.OWNED_NODE_LABELS] == ",".join(sorted(x.partition("=")[0] for x in kept))
        assert notes[names.OWNED_NODE_TAINTS] == f"{gpu_taint['key']}:{gpu_taint['effect']}"
    finally:  # the stack asks again: back to the full set for the tests after this one
        labeller.run(*labeller.args, *flags, "--no-timestamp")
    node = _node(kube, labeller.node)
    assert _labels(node)[names.MIG_CONFIG] == labels_before[names.MIG_CONFIG]
    assert _taint(dropped_taint) in _taints(node)


def _context(lab: Labeller) -> AgentContext:
    return AgentContext.from_args(argparse.Namespace(
        host_root=str(lab.host.root), nvml=f"simulated:{MACHINE}", node_name=lab.node,
        kubeconfig=str(lab.agent.kubeconfig)))


def test_labeller_rereads_after_a_real_conflict(kube: Kube, labeller: Labeller, labelled: dict[str, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An administrator adds a taint between the labeller's read and its patch: the real server refuses
    the labeller's stale resourceVersion with 409, the labeller re-reads and both taints end up on the Node.
    Runs the labeller's own ``patch_node`` in-process (the seam is its Node read), as its ServiceAccount."""
    race = {"key": "example.com/drain", "value": "soon", "effect": "PreferNoSchedule"}
    extra = "dedicated=yes:PreferNoSchedule"  # a dev-stack group's taint key: the labeller may set it
    reads: list[str] = []
    refusals: list[int | None] = []
    read_node, patch_node = KubeNodeApi.read_node, KubeNodeApi.patch_node

    def read_then_race(self: KubeNodeApi, node: str) -> dict[str, Any]:
        obj = read_node(self, node)
        reads.append(obj["metadata"]["resourceVersion"])
        if len(reads) == 1:  # the administrator's own read-modify-write, after the labeller read
            current = _node(kube, node)
            kube.patch("v1", "Node", node, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                                            "spec": {"taints": [*_taints(current), race]}})
        return obj

    def recording_patch(self: KubeNodeApi, node: str, body: Any, what: str = "patch") -> dict[str, Any]:
        try:
            return patch_node(self, node, body, what)
        except KubeError as e:
            refusals.append(e.status)
            raise

    monkeypatch.setattr(KubeNodeApi, "read_node", read_then_race)
    monkeypatch.setattr(KubeNodeApi, "patch_node", recording_patch)
    flags = labeller.node_flags
    want = Requested.from_flags(_flag_values(flags, "--node-label"), [*_flag_values(flags, "--node-taint"), extra])
    try:
        _, new_taints = labels_cmd.patch_node(_context(labeller), want, None)
        assert refusals == [409] and len(reads) == 2
        assert new_taints is not None and _taint(extra) in new_taints
        taints = _taints(_node(kube, labeller.node))
        assert race in taints and _taint(extra) in taints and FOREIGN_TAINT in taints
    finally:
        monkeypatch.undo()
        labels_cmd.patch_node(_context(labeller), Requested.from_flags(
            _flag_values(flags, "--node-label"), _flag_values(flags, "--node-taint")), None)
        current = _node(kube, labeller.node)
        kube.patch("v1", "Node", labeller.node, {"spec": {"taints": [t for t in _taints(current) if t != race]}})
    assert _taint(extra) not in _taints(_node(kube, labeller.node))  # owned, then no longer asked for


def test_stale_resource_version_is_refused_by_the_server(kube: Kube, labeller: Labeller) -> None:
    """``nodepatch.apply_plan`` with a resourceVersion the Node has moved past: 409, and nothing changes."""
    api = KubeNodeApi.connect(labeller.agent.kubeconfig)
    stale = api.read_node(labeller.node)["metadata"]["resourceVersion"]
    kube.patch("v1", "Node", labeller.node, {"metadata": {"annotations": {"lab.example.com/touched": "yes"}}})
    plan = NodePlan({"lab.example.com/stale-write": "yes"}, {}, None)
    with pytest.raises(Conflict) as refused:
        apply_plan(api, labeller.node, plan, stale)
    assert refused.value.status == 409
    assert "lab.example.com/stale-write" not in _labels(_node(kube, labeller.node))


# --- what the labeller's identity may and may not do -----------------------------------------------

@pytest.fixture(scope="module")
def secret(kube: Kube, dev_stack: AppliedStack) -> Iterator[str]:
    name = f"{PREFIX}secret"
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                 "stringData": {"password": "not-for-agents"}})
    yield name
    kube.delete("v1", "Secret", name, NS)


def _dry(method: str, path: str, body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
    """A request that would change something, sent with ``dryRun=All``: a wrongly allowed one changes nothing."""
    return {"method": method, "path": path, "body": body, "content_type": content_type, "query": {"dryRun": "All"}}


Denial = tuple[dict[str, Any], dict[str, str]]  #: a request and its SelfSubjectAccessReview attributes


def _denials(agent: AgentIdentity, node: str, other: str, secret: str) -> dict[str, Denial]:
    """Requests an agent with only node access must be refused: request -> SelfSubjectAccessReview attributes."""
    pod = agent.pod["metadata"]["name"]
    label = {"metadata": {"labels": {"lab.example.com/probe": "x"}}}
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{PREFIX}probe"},
              "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "resourceSliceCount": 1,
                                                                              "generation": 1}, "devices": []}}
    return {
        "list secrets": ({"method": "GET", "path": "/api/v1/secrets"}, {"verb": "list", "resource": "secrets"}),
        "list secrets in nvidia-gpu": ({"method": "GET", "path": f"/api/v1/namespaces/{NS}/secrets"},
                                       {"verb": "list", "resource": "secrets", "namespace": NS}),
        "read a secret in nvidia-gpu": ({"method": "GET", "path": f"/api/v1/namespaces/{NS}/secrets/{secret}"},
                                        {"verb": "get", "resource": "secrets", "namespace": NS, "name": secret}),
        "delete its own pod": (_dry("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}"),
                               {"verb": "delete", "resource": "pods", "namespace": NS, "name": pod}),
        "create a ResourceSlice": (_dry("POST", "/apis/resource.k8s.io/v1/resourceslices", slice_),
                                   {"verb": "create", "resource": "resourceslices", "group": "resource.k8s.io"}),
        "patch its Node's status": (_dry("PATCH", f"/api/v1/nodes/{node}/status", label, MERGE_PATCH),
                                    {"verb": "patch", "resource": "nodes", "name": node, "subresource": "status"}),
        "delete a Node": (_dry("DELETE", f"/api/v1/nodes/{other}"), {"verb": "delete", "resource": "nodes",
                                                                     "name": other}),
        "list Nodes": ({"method": "GET", "path": "/api/v1/nodes"}, {"verb": "list", "resource": "nodes"}),
    }


# --- the way out: the setup gate and the labeller's withdrawal ----------------------------------------

def _retiring_daemonset(kube: Kube, name: str) -> None:
    """A DaemonSet in the stack's namespace that runs nowhere, for the labeller to name as its owner: the
    stack's own labeller DaemonSets belong to the session's applied stack and must stay."""
    kube.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": NS},
                 "spec": {"selector": {"matchLabels": {"lab": name}},
                          "template": {"metadata": {"labels": {"lab": name}}, "spec": {
                              "nodeSelector": {"lab.example.com/nowhere": "true"},
                              "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}})


def _owned_by(args: list[str], daemonset: str) -> list[str]:
    i = args.index("--daemonset")
    assert args[i + 1] == f"{NS}/gpu-labeller-{LABELLER_GROUP}", "the rendered labeller names its own DaemonSet"
    return [*args[:i + 1], f"{NS}/{daemonset}", *args[i + 2:]]


def test_labeller_writes_nothing_behind_a_closed_setup_gate(
        kube: Kube, dev_stack: AppliedStack, lab_nodes: list[str], tmp_path: Path) -> None:
    """With ``--daemonset`` (as rendered) the labeller labels only while the Node carries
    ``gpu-setup-complete``: a node whose setup was undone is left exactly as it is.

    Closing the gate makes the DaemonSet controller delete the labeller's pod; a kubelet keeps the pod,
    and so its bound token, through the grace period in which this last run happens, but kwok removes it
    at once. So this run holds a token of the labeller's ServiceAccount that is not bound to the pod."""
    name = f"{PREFIX}a100-gate"
    _gpu_node(kube, lab_nodes, name, LABELLER_NODE_GROUP)
    ds = f"gpu-labeller-{LABELLER_GROUP}"
    pod = identity(kube, ds, name, tmp_path).pod
    sa = service_account_kube(kube, NS, pod["spec"]["serviceAccountName"])
    unbound = AgentIdentity(pod, sa, write_kubeconfig(sa, tmp_path / "unbound.kubeconfig", user="gpu-labeller"))
    host = build_fake_host(tmp_path / "host", MACHINE)
    lab = Labeller(name, unbound, host, _labeller_run(dev_stack, LABELLER_GROUP, _container_args(dev_stack, ds),
                                                      tmp_path), [])
    _settled(kube, name)
    kube.patch("v1", "Node", name, {"metadata": {"labels": {names.GPU_SETUP_COMPLETE: None}}})
    rv = _node(kube, name)["metadata"]["resourceVersion"]
    doc = lab.run(*lab.args)
    assert (doc["nodeChanges"], doc["nodeTaints"]) == ({}, None)
    assert _node(kube, name)["metadata"]["resourceVersion"] == rv


def _loop(lab: Labeller, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The labeller as its DaemonSet runs it (the loop), in the background, logging at info."""
    with log.open("ab") as out:
        return subprocess.Popen(agent_command(*lab.globals(), "--log-level", "info", *args), cwd=REPO, env=lab.env(),
                                stdout=out, stderr=subprocess.STDOUT)


def _terminate(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()


def test_labeller_withdraws_its_labels_only_when_its_daemonset_goes(
        kube: Kube, dev_stack: AppliedStack, lab_nodes: list[str], tmp_path: Path) -> None:
    """The labeller in its loop, stopped by SIGTERM. While its DaemonSet is there (a restart for a new
    image) everything stays; once the DaemonSet is being deleted in the foreground, as the provider
    deletes it when a group is removed or the stack destroyed, the labeller takes off its GPU labels,
    the group's labels and taints it owns, their ownership annotations and the feature file, and
    leaves the administrator's label and taint as they were."""
    name = f"{PREFIX}a100-retire"
    _gpu_node(kube, lab_nodes, name, LABELLER_NODE_GROUP)
    ds = f"gpu-labeller-{LABELLER_GROUP}"
    lab = Labeller(name, identity(kube, ds, name, tmp_path), build_fake_host(tmp_path / "host", MACHINE), [], [])
    node = _settled(kube, name)
    kube.patch("v1", "Node", name, {"metadata": {"labels": {FOREIGN_LABEL[0]: FOREIGN_LABEL[1]}},
                                    "spec": {"taints": [*_taints(node), FOREIGN_TAINT]}})
    owner = f"{PREFIX}retiring-labeller"
    _retiring_daemonset(kube, owner)
    ds_args = _container_args(dev_stack, ds)
    args = [*_with_configs(dev_stack, LABELLER_GROUP, _owned_by(ds_args, owner), tmp_path),
            *_daemonset_backend_flags(dev_stack, LABELLER_GROUP, ds_args)]
    log = tmp_path / "labeller.log"

    def labelled() -> dict[str, Any] | None:
        n = _node(kube, name)
        return n if names.OWNED_NODE_TAINTS in _annotations(n) and "nvidia.com/gpu.product" in _labels(n) else None

    proc = _loop(lab, args, log)
    on = wait_for(labelled, timeout=30, what="the labeller's first run")
    _terminate(proc, log)
    restarted = _node(kube, name)
    assert _labels(restarted) == _labels(on) and _taints(restarted) == _taints(on), "a restart withdraws nothing"
    assert lab.host.path(FEATURES).exists()

    passes = log.read_text().count("labelled ")
    proc = _loop(lab, args, log)
    # Stopped only once it is in its loop (its SIGTERM handler set), as a kubelet would find it.
    wait_for(lambda: log.read_text().count("labelled ") > passes, timeout=30, what="the restarted labeller's run")
    # The provider's delete, in the foreground: the DaemonSet stays, marked, until its pods are gone. This
    # one has no pods, so a finalizer stands for the labeller's own pod still terminating.
    kube.patch("apps/v1", "DaemonSet", owner, {"metadata": {"finalizers": ["lab.example.com/hold"]}}, NS)
    try:
        kube.delete("apps/v1", "DaemonSet", owner, NS, propagationPolicy="Foreground")
        _terminate(proc, log)
    finally:
        kube.patch("apps/v1", "DaemonSet", owner, {"metadata": {"finalizers": None}}, NS)
    off = _node(kube, name)
    assert not [k for k in _labels(off) if gfd.owned(k)], _labels(off)
    flags = _daemonset_backend_flags(dev_stack, LABELLER_GROUP, ds_args)
    for label in _flag_values(flags, "--node-label"):
        assert label.split("=", 1)[0] not in _labels(off)
    group_taints = [_taint(v) for v in _flag_values(flags, "--node-taint")]
    assert _taints(off) == [t for t in _taints(node) if t not in group_taints] + [FOREIGN_TAINT]
    assert _labels(off)[FOREIGN_LABEL[0]] == FOREIGN_LABEL[1]
    assert names.OWNED_NODE_LABELS not in _annotations(off) and names.OWNED_NODE_TAINTS not in _annotations(off)
    assert not lab.host.path(FEATURES).exists()
    assert "labels withdrawn" in log.read_text()
    # What that took: reading DaemonSets in the stack's namespace (a Role), nowhere else, nothing more.
    me = lab.agent.kube
    assert me.can_i("get", "daemonsets", group="apps", namespace=NS)
    assert not me.can_i("get", "daemonsets", group="apps", namespace="kube-system")
    assert not me.can_i("list", "daemonsets", group="apps", namespace=NS)


LABELLER_DENIED = ["list secrets", "list secrets in nvidia-gpu", "read a secret in nvidia-gpu", "delete its own pod",
                   "create a ResourceSlice", "patch its Node's status", "delete a Node", "list Nodes"]


def _refused(agent: AgentIdentity, request: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        agent.kube.request(**request)
    return refused.value


def test_labeller_identity_reads_and_patches_its_own_node(kube: Kube, labeller: Labeller) -> None:
    me = labeller.agent
    assert me.kube.get("v1", "Node", labeller.node)["metadata"]["name"] == labeller.node
    path = f"/api/v1/nodes/{labeller.node}"
    me.kube.request("PATCH", path, {"metadata": {"labels": {"nvidia.com/probe": "x"}}},
                    content_type=MERGE_PATCH, query={"dryRun": "All"})
    # Outside the GPU label domains the node-confinement policy refuses, on its own node too.
    with pytest.raises(ApiError) as caught:
        me.kube.request("PATCH", path, {"metadata": {"labels": {"lab.example.com/probe": "x"}}},
                        content_type=MERGE_PATCH, query={"dryRun": "All"})
    assert caught.value.status == 403 and "may not change node label(s) lab.example.com/probe" in caught.value.message
    assert me.kube.can_i("get", "nodes", name=labeller.node) and me.kube.can_i("patch", "nodes", name=labeller.node)
    # It watches its own Node (so it reads it from memory at rest) but may not list Nodes.
    assert me.kube.can_i("watch", "nodes") and not me.kube.can_i("list", "nodes")
    watched = me.kube.request("GET", "/api/v1/nodes", query={
        "watch": "true", "fieldSelector": f"metadata.name={labeller.node}", "timeoutSeconds": "1"})
    assert labeller.node in str(watched)
    # The token is the pod's: bound to it and carrying its node, as the kubelet would mount it.
    review = me.kube.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                             {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NS}:gpu-labeller"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [labeller.node]
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == [me.pod["metadata"]["name"]]


@pytest.mark.parametrize("what", LABELLER_DENIED)
def test_labeller_identity_is_denied(labeller: Labeller, other_node: str, secret: str, what: str) -> None:
    request, attributes = _denials(labeller.agent, labeller.node, other_node, secret)[what]
    error = _refused(labeller.agent, request)
    assert error.status == 403 and error.reason == "Forbidden", error
    assert "system:serviceaccount:nvidia-gpu:gpu-labeller" in error.message
    assert not labeller.agent.kube.can_i(**attributes)


def test_labeller_cannot_patch_other_nodes(kube: Kube, labeller: Labeller, other_node: str) -> None:
    """RBAC's ``patch nodes`` has no "own node"; the node-confinement policy does, from the token's node claim."""
    with pytest.raises(ApiError) as caught:
        labeller.agent.kube.patch("v1", "Node", other_node, {"metadata": {"labels": {"nvidia.com/gpu.count": "0"}}})
    assert (caught.value.status, caught.value.reason) == (403, "Forbidden"), caught.value
    assert (f"the gpu-labeller on node {labeller.node} may only change its own node, not node {other_node}"
            in caught.value.message)
    assert _labels(_node(kube, other_node)).get("nvidia.com/gpu.count") != "0"


# --- the device plugin's Node watch ------------------------------------------------------------------

@dataclass
class Plugin:
    node: str
    agent: AgentIdentity
    config_label: str  #: ``--config-label`` of the rendered DaemonSet
    initial: str  #: the config the node template names


@pytest.fixture(scope="module")
def plugin(kube: Kube, dev_stack: AppliedStack, lab_nodes: list[str],
           tmp_path_factory: pytest.TempPathFactory) -> Plugin:
    name = f"{PREFIX}a30"
    template = _template(dev_stack, PLUGIN_NODE_GROUP)
    _gpu_node(kube, lab_nodes, name, PLUGIN_NODE_GROUP, template)
    ds = f"device-plugin-{PLUGIN_GROUP}"
    agent = identity(kube, ds, name, tmp_path_factory.mktemp("plugin"))
    _settled(kube, name)
    args = _container_args(dev_stack, ds)
    key = args[args.index("--config-label") + 1]
    return Plugin(name, agent, key, template["labels"][key])


#: Fast recovery for tests; the watch itself is long enough that only an event can deliver a change.
TIMING = WatchTiming(request_timeout_s=5, watch_timeout_s=60, read_slack_s=5, backoff_initial_s=0.05,
                     backoff_max_s=0.5)
#: The server ends each watch after a second: the watch must resume from its version, not list again.
SHORT = WatchTiming(request_timeout_s=5, watch_timeout_s=1, read_slack_s=5, backoff_initial_s=0.05,
                    backoff_max_s=0.5)


def _set_label(kube: Kube, node: str, key: str, value: str | None) -> None:
    kube.patch("v1", "Node", node, {"metadata": {"labels": {key: value}}})


def _stop(watch: NodeLabelWatch) -> float:
    """Stop the watch; answers how long that took (the open TLS stream must be cut, not waited out)."""
    t0 = time.monotonic()
    watch.stop()
    assert watch.thread is not None and not watch.thread.is_alive()
    return time.monotonic() - t0


def _wait_label(watch: NodeLabelWatch, value: str | None, timeout: float = 5.0) -> None:
    wait_for(lambda: watch.label() == value, timeout=timeout, interval=0.02, what=f"the watch delivering {value!r}")


def _wait_watches(watch: NodeLabelWatch, count: int, what: str) -> None:
    wait_for(lambda: watch.watches >= count, timeout=10, interval=0.02, what=what)


def test_device_plugin_watch_follows_its_config_label(kube: Kube, plugin: Plugin, labeller: Labeller) -> None:
    """With the plugin pod's kubeconfig (``--kubeconfig`` honoured): the template's config first, then
    each change an administrator makes, over the watch within two seconds, other Nodes' changes ignored;
    the server ends every watch after a second and the next resumes from the last version, listing nothing."""
    w = NodeLabelWatch(plugin.node, plugin.config_label, kubeconfig=plugin.agent.kubeconfig, timing=SHORT)
    seen: list[str | None] = []
    w.subscribe(lambda: seen.append(w.label()))
    assert w.label() == plugin.initial
    w.start()
    try:
        _wait_watches(w, 1, "the watch opened")
        lists = w.lists
        _set_label(kube, labeller.node, plugin.config_label, "Exclusive")  # another node: not ours
        for value in ("TimeSlicing", None):
            t0 = time.monotonic()
            _set_label(kube, plugin.node, plugin.config_label, value)
            _wait_label(w, value)
            assert time.monotonic() - t0 < 2.0
            _wait_watches(w, w.watches + 2, "two watches ended by the server and resumed")
        assert seen == ["TimeSlicing", None]
        assert w.lists == lists  # over the watch, resumed from its version: never listed again
    finally:
        assert _stop(w) < 2.0
        _set_label(kube, plugin.node, plugin.config_label, plugin.initial)


def test_device_plugin_watch_reads_kubeconfig_variants(plugin: Plugin, tmp_path: Path) -> None:
    """The agent's kubeconfig reader (``node_agent.kube.credentials``, which avoids the kubernetes client's
    loader): inline CA data and a token file relative to the kubeconfig verify and authenticate against the
    real server; an exec plugin is handed to the official loader, and its token authenticates too."""
    kubeconfig = yaml.safe_load(plugin.agent.kubeconfig.read_text())
    cluster, user = kubeconfig["clusters"][0]["cluster"], kubeconfig["users"][0]["user"]
    ca = Path(cluster.pop("certificate-authority"))
    cluster["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    (tmp_path / "token").write_text(user.pop("token") + "\n")
    user["tokenFile"] = "token"
    inline = tmp_path / "inline.kubeconfig"
    inline.write_text(yaml.safe_dump(kubeconfig))
    w = NodeLabelWatch(plugin.node, plugin.config_label, kubeconfig=inline, timing=TIMING)
    assert w.label() == plugin.initial
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": (tmp_path / "token").read_text().strip()}}
    (tmp_path / "credential.json").write_text(json.dumps(credential))
    kubeconfig["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "cat",
                                               "args": [str(tmp_path / "credential.json")],
                                               "interactiveMode": "Never"}}
    inline.write_text(yaml.safe_dump(kubeconfig))
    assert NodeLabelWatch(plugin.node, plugin.config_label, kubeconfig=inline).label() == plugin.initial


@pytest.mark.parametrize("what", ["patch its own Node", "patch another Node", "read a secret in nvidia-gpu",
                                  "list secrets", "delete its own pod", "create a ResourceSlice"])
def test_device_plugin_identity_is_denied(plugin: Plugin, other_node: str, secret: str, what: str) -> None:
    """The rendered ClusterRole ``nvidia-gpu-device-plugin`` grants nodes get/list/watch and events only."""
    label = {"metadata": {"labels": {"lab.example.com/probe": "x"}}}
    denials = _denials(plugin.agent, plugin.node, other_node, secret)
    denials["patch its own Node"] = (_dry("PATCH", f"/api/v1/nodes/{plugin.node}", label, MERGE_PATCH),
                                     {"verb": "patch", "resource": "nodes", "name": plugin.node})
    denials["patch another Node"] = (_dry("PATCH", f"/api/v1/nodes/{other_node}", label, MERGE_PATCH),
                                     {"verb": "patch", "resource": "nodes", "name": other_node})
    request, attributes = denials[what]
    error = _refused(plugin.agent, request)
    assert error.status == 403 and error.reason == "Forbidden", error
    assert "system:serviceaccount:nvidia-gpu:device-plugin" in error.message
    assert not plugin.agent.kube.can_i(**attributes)


def test_device_plugin_identity_may_watch_nodes(plugin: Plugin, dev_stack: AppliedStack) -> None:
    rules = dev_stack.object("ClusterRole", "nvidia-gpu-device-plugin")["rules"]
    node_verbs = next(r["verbs"] for r in rules if "nodes" in r["resources"])
    assert sorted(node_verbs) == ["get", "list", "watch"]
    me = plugin.agent.kube
    assert all(me.can_i(v, "nodes") for v in node_verbs)
    assert me.list("v1", "Node", fieldSelector=f"metadata.name={plugin.node}")[0]["metadata"]["name"] == plugin.node


PLUGIN_MACHINE = "a30x4"


def _plugin_args(stack: AppliedStack, configs: Path, sockets: Path) -> list[str]:
    """The rendered DaemonSet's arguments with the container paths moved into the test's directories."""
    args = _container_args(stack, f"device-plugin-{PLUGIN_GROUP}")
    moved = {"--config-dir": str(configs), "--metrics-port": "0"}
    out = [moved.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
    assert all(k in args for k in moved)
    # File polling slowed to a minute: only the label watch can switch the config within the test.
    return [*out, "--socket-dir", str(sockets), "--config-poll-interval", "60"]


def test_device_plugin_process_switches_config_with_its_pod_identity(
        kube: Kube, dev_stack: AppliedStack, plugin: Plugin, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``python -m node_agent --kubeconfig ... device-plugin`` with the rendered arguments and the group's
    rendered named configs: the Node's label picks the config, and an administrator's change of it
    re-registers the plugin with the new config (4 GPUs whole, then time-sliced 4 ways) within seconds."""
    tmp = tmp_path_factory.mktemp("dp")
    configs = tmp / "configs"
    configs.mkdir()
    for name, text in dev_stack.object("ConfigMap", f"device-plugin-config-{PLUGIN_GROUP}")["data"].items():
        (configs / name).write_text(text)
    sockets = tmp_path_factory.mktemp("k")  # unix socket paths are limited to 107 bytes
    host = build_fake_host(tmp / "host", PLUGIN_MACHINE)
    gpus = get_machine(PLUGIN_MACHINE).gpu_count
    _set_label(kube, plugin.node, plugin.config_label, "Exclusive")
    kubelet = DevicePluginKubelet(sockets)
    kubelet.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
    env["NODE_NAME"] = plugin.agent.pod["spec"]["nodeName"]
    proc = subprocess.Popen(
        agent_command("--host-root", str(host.root), "--host-exec", "direct", "--nvml", f"simulated:{PLUGIN_MACHINE}",
                      "--kubeconfig", str(plugin.agent.kubeconfig), "--log-level", "info",
                      *_plugin_args(dev_stack, configs, sockets)),
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = ""
    try:
        kubelet.wait_registered({"nvidia.com/gpu"}, timeout=30)
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == gpus, timeout=10)
        t0 = time.monotonic()
        _set_label(kube, plugin.node, plugin.config_label, "TimeSlicing")
        kubelet.wait_registered({"nvidia.com/gpu"}, timeout=10, after=t0)
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4 * gpus, timeout=10)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0, output
    except AssertionError as e:
        if proc.poll() is None:
            proc.kill()
        output = output or proc.communicate(timeout=5)[0]
        raise AssertionError(f"{e}\n--- device plugin output ---\n{output}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        kubelet.stop()
        _set_label(kube, plugin.node, plugin.config_label, plugin.initial)
    assert "node-label-unavailable" not in output and "node-watch-failed" not in output, output


class _HeldVersion(NodeLabelWatch):
    """A watch that resumes from a resourceVersion it held before the API server restarted: its first
    "list" answers the (value, version) a real list gave then; every later list is a real one."""

    def __init__(self, held: tuple[str | None, str], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: tuple[str | None, str] | None = held

    def list(self) -> str:
        if self._held is None:
            return super().list()
        (value, version), self._held = self._held, None
        self.lists += 1
        self._listed([{"metadata": {"name": self.node_name, "labels": {self.key: value} if value else {}}}])
        return version


def test_device_plugin_watch_relists_after_its_version_expired(
        kube: Kube, control_plane: ControlPlane, plugin: Plugin, caplog: pytest.LogCaptureFixture) -> None:
    """After an API server restart the watch cache starts afresh, so a version from before is "too old"
    (410 Gone, sent by the real server as an ``ERROR`` event): the watch lists again, catches up with the
    change made meanwhile and keeps delivering changes over the new watch."""
    probe = NodeLabelWatch(plugin.node, plugin.config_label, kubeconfig=plugin.agent.kubeconfig, timing=TIMING)
    version = probe.list()
    held = (probe.label(), version)
    assert held[0] == plugin.initial
    kube.patch("v1", "Node", plugin.node, {"metadata": {"annotations": {"lab.example.com/bump": "1"}}})
    # A crash of the API server (SIGKILL: kube-apiserver 1.34 takes longer than the harness's 15 s grace to
    # exit on SIGTERM), then the harness starts it again on the same port and waits until it is ready.
    os.kill(control_plane.pids["kube-apiserver"], signal.SIGKILL)
    control_plane.restart_apiserver()
    with pytest.raises(Gone, match="too old resource version"):
        probe.watch(held[1])
    _set_label(kube, plugin.node, plugin.config_label, "TimeSlicing")  # while the held version was stale
    w = _HeldVersion(held, plugin.node, plugin.config_label, kubeconfig=plugin.agent.kubeconfig, timing=TIMING)
    seen: list[str | None] = []
    w.subscribe(lambda: seen.append(w.label()))
    caplog.set_level(logging.INFO, logger="node_agent.kube.watch")
    w.start()
    try:
        _wait_label(w, "TimeSlicing", timeout=10)
        assert w.lists == 2  # the held version, then one real list after the 410
        assert any("event=node-watch-expired" in r.getMessage() for r in caplog.records)
        _wait_watches(w, 2, "the new watch opened")
        _set_label(kube, plugin.node, plugin.config_label, "MPS")
        _wait_label(w, "MPS")
        assert seen == ["TimeSlicing", "MPS"] and w.lists == 2
    finally:
        _stop(w)
        _set_label(kube, plugin.node, plugin.config_label, plugin.initial)
