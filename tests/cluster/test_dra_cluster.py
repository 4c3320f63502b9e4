"""Proofs 3 (DRA) and 4: the DRA kubelet plugin against a real control plane, and DRA end to end.

Proof 3: the plugin runs as a process with the rendered DaemonSet's args and env, for a simulated HGX
H200 and a simulated DGX H100 node (both kwok Nodes of the gpu-h200 NodeGroup, so the DaemonSet puts its
pod there), with a token bound to *that pod*, which carries ``authentication.kubernetes.io/node-name``
for the stack's ValidatingAdmissionPolicy. The real API server accepts its ResourceSlices; a lost GPU,
a MIG layout, a kubelet's wipe and a plugin restart change (or keep) them as they must; the server
refuses what the plugin must never do (another node's or driver's slices, Secrets, Nodes, pods,
DeviceClasses); and the uninstall path (the marker ConfigMap's deletion) withdraws every slice.

Proof 4: NVIDIA's demo claims, and claims by memory capacity, product name, MIG profile and for the
passthrough GPU, are allocated by the real kube-scheduler (DynamicResources plugin) to devices our
slices offer, on the node the pod is bound to; impossible claims leave their pod Pending with the
scheduler's reason. The kubelet stand-in then prepares the passthrough claim (which no real node offers yet;
NVIDIA's demos, plain GPU and MIG claims run on the real kubelet in ``test_real_node_stack.py``), read
back from the API server, over the plugin's real gRPC socket: the CDI spec names exactly the allocated devices.

The demo manifests (``tests/nvidia_gpu/components/data/nvidia-dra-demo-*.yaml``: NVIDIA's quickstart files
copied unchanged, provenance in ``tests/nvidia_gpu/components/data/SOURCES.md``) keep their namespaces, names,
DeviceClasses and tolerations; the one change is a required node affinity for this module's two nodes
(:func:`_pin_to_our_nodes`), because the suite's control plane is shared with other modules' Nodes.

What kwok does not do, this module does: kwok plays the kubelet for pod status but never calls
NodePrepareResources, so :class:`~tests.kit.kubelet.dra.DraKubelet` does; and kwok does not
wipe a node's slices when its plugin is gone (the real kubelet does, 30 s later), so SIGTERM is asserted
to *keep* the slices and only the uninstall path to withdraw them; the fixture wipes them at the end.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ApiError, Kube
from localcluster.objects import create_kwok_node, service_account_kube, wait_for
from node_agent.dra.api import KubeDraApi
from node_agent.dra.claims import ClaimRef
from node_agent.dra.cleanup import FINALIZER, GRACE_SECONDS
from node_agent.dra.devices import quantity_value
from node_agent.dra.driver import DraDriver, DriverSettings
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.host.root import HostRoot
from node_agent.kube.transport import Kube as AgentKube
from node_agent.nvml.session import NvmlBackend
from nvgpu import catalogue
from tests.cluster.agents import REPO, AgentIdentity, agent_command, container_env, identity, run_agent
from tests.cluster.stack import AppliedStack
from tests.kit import metrics
from tests.kit.dra_builders import RecordingSharing
from tests.kit.fakehost import GPU_CLASS, NVIDIA_VENDOR, build_fake_host, pci_device, sim_state_file
from tests.kit.kubelet.dra import DraKubelet

NS = "nvidia-gpu"
DAEMONSET = "dra-kubelet-plugin-h200-dra"
NODE_GROUP = "gpu-h200"
DRIVER = "gpu.nvidia.com"
RESOURCE = "resource.k8s.io/v1"
POLICY = "nvidia-gpu-dra-slices-own-node"
MARKER = "dra-uninstall-marker"
SETUP = "node.deckhouse.io/gpu-setup-complete"
DATA = REPO / "tests" / "nvidia_gpu" / "components" / "data"
H200, H100 = "dra-hgx-h200", "dra-dgx-h100"
#: node -> simulated machine the plugin on it sees through ``--nvml simulated:<machine>``.
MACHINES = {H200: "hgx-h200", H100: "dgx-h100"}
MODELS = {H200: catalogue.H200_141GB, H100: catalogue.H100_80GB}
PRODUCTS = {H200: "NVIDIA H200", H100: "NVIDIA H100 80GB HBM3"}
#: A node with one 16 GB T4 (15360 MiB, under the 16000 MiB the article's claim asks for), started only by
#: :func:`test_the_articles_memory_attribute_claim_allocates_only_where_memory_suffices`.
T4 = "dra-t4"
#: Every node a plugin of this module may run for, with its simulated machine.
PLUGIN_MACHINES = {**MACHINES, T4: "t4x1"}
GPUS = 8


# --- the plugin processes ---------------------------------------------------------------------------


@dataclass
class Plugin:
    """One ``dra-driver`` process, the fake host root it owns and the identity it runs with."""

    node: str
    machine: str
    root: Path
    agent: AgentIdentity
    proc: subprocess.Popen[bytes]
    log: Path
    kubelet: DraKubelet

    def sim(self, *args: str) -> None:
        """Fault injection on this node's simulated machine (the state file under the same host root)."""
        done = run_agent("--host-root", str(self.root), "--nvml", f"simulated:{self.machine}", "sim", *args)
        assert done.returncode == 0, done.stderr

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


#: A ninth H200 on the H200 node's PCI bus, bound to vfio-pci for passthrough (the dev stack's h200-dra
#: group has ``passthrough: true``). NVML never sees a vfio-bound GPU, so the simulated NVML (which has
#: the machine's eight) needs no change; the plugin finds it in sysfs.
VFIO_GPU = "0000:e1:00.0"
VFIO_GROUP = 40


def _fake_host(root: Path, machine: str, *, vfio: bool) -> None:
    """A host root shaped like the node (sysfs, /proc, /dev of the simulated machine, from the repo's
    fake-host builder) plus the boot ID the plugin's checkpoint records."""
    build_fake_host(root, machine, containerd=None)
    boot = root / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True, exist_ok=True)
    boot.write_text("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n")
    if not vfio:
        return
    pci_device(root, VFIO_GPU, vendor=NVIDIA_VENDOR, device=0x2335, pci_class=GPU_CLASS, driver="vfio-pci",
               numa_node=1, iommu_group=VFIO_GROUP)
    for dev in ("vfio/vfio", f"vfio/{VFIO_GROUP}"):
        (root / "dev" / dev).parent.mkdir(parents=True, exist_ok=True)
        (root / "dev" / dev).touch()


def _daemonset_command(stack: AppliedStack, node: str) -> tuple[list[str], dict[str, str]]:
    """The rendered DaemonSet's container args and env, with ``fieldRef: spec.nodeName`` resolved as the
    kubelet would for a pod on ``node``."""
    container = stack.object("DaemonSet", DAEMONSET)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "node_agent"]
    return list(container["args"]), container_env(container, node)


def _start_plugin(kube: Kube, stack: AppliedStack, node: str, work: Path, *, root: Path | None = None) -> Plugin:
    """Start the plugin for ``node``; ``root`` restarts it on the host root of an earlier run."""
    agent = identity(kube, DAEMONSET, node, work / "identities")
    if root is None:
        # Unix socket paths are limited to 107 bytes: the host root must be short, so not under tmp_path.
        root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
        _fake_host(root, PLUGIN_MACHINES[node], vfio=node == H200)
    args, env = _daemonset_command(stack, node)
    args = metrics.with_port(args, metrics.free_port())  # each plugin pod has 9402 to itself; here they share
    log = work / f"{node}.log"
    # The DaemonSet mounts the host's directories at their own paths; here they live under --host-root.
    # --kubeconfig stands for the pod's mounted ServiceAccount token (the same token, bound to the pod).
    cmd = agent_command("--host-root", str(root), "--nvml", f"simulated:{PLUGIN_MACHINES[node]}",
                        "--kubeconfig", str(agent.kubeconfig), *args)
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env})
    kubelet = DraKubelet(root)
    return Plugin(node, PLUGIN_MACHINES[node], root, agent, proc, log, kubelet)


def _stop(plugin: Plugin) -> None:
    plugin.kubelet.close()
    if plugin.proc.poll() is None:
        plugin.proc.send_signal(signal.SIGTERM)
        try:
            plugin.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            plugin.proc.kill()
            plugin.proc.wait(timeout=5)
    shutil.rmtree(plugin.root, ignore_errors=True)


def _release_marker(kube: Kube, stack: AppliedStack) -> None:
    """Give the stack's uninstall marker back as the stack made it: our plugins added their finalizer
    (and the uninstall test deletes it), and no plugin of this module is left to remove it."""
    marker = kube.get_or_none("v1", "ConfigMap", MARKER, NS)
    if marker is None:
        kube.apply(stack.object("ConfigMap", MARKER))  # as the stack made it, under the harness's manager
        return
    finalizers = marker["metadata"].get("finalizers") or []
    if FINALIZER in finalizers:
        kube.patch("v1", "ConfigMap", MARKER, {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}},
                   NS)


@pytest.fixture(scope="module")
def plugins(kube: Kube, dev_stack: AppliedStack,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Plugin]]:
    """A kwok node of the gpu-h200 NodeGroup per simulated machine, each with its plugin running."""
    template = dev_stack.object("NodeGroup", NODE_GROUP)["spec"]["nodeTemplate"]
    labels = {"node.deckhouse.io/group": NODE_GROUP, **template.get("labels", {}), SETUP: ""}
    for node in MACHINES:
        create_kwok_node(kube, node, labels, template.get("taints", []))
    work = tmp_path_factory.mktemp("dra")
    started: dict[str, Plugin] = {}
    try:
        for node in MACHINES:
            started[node] = _start_plugin(kube, dev_stack, node, work)
        for p in started.values():
            # The registration socket appears once the pool is published and the DRA socket serves.
            p.kubelet.register(timeout=60)
            assert p.proc.poll() is None, p.logs()
        yield started
    finally:
        for p in started.values():
            _stop(p)
        # What the kubelet does 30 s after a plugin is gone (kwok does not): wipe the node's slices, so
        # no later module meets slices without a plugin behind them (the uninstall test already did).
        for node in MACHINES:
            for s in _slices(kube, node):
                kube.delete(RESOURCE, "ResourceSlice", s["metadata"]["name"])
        _release_marker(kube, dev_stack)


def _slices(kube: Kube, node: str) -> list[dict[str, Any]]:
    return [s for s in kube.list(RESOURCE, "ResourceSlice", fieldSelector=f"spec.nodeName={node}")
            if s["spec"]["driver"] == DRIVER]


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def _generation(slices: list[dict[str, Any]]) -> int:
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    assert len(gens) == 1, f"one pool generation across the pool's slices: {gens}"
    return int(gens.pop())


def _published(kube: Kube, node: str, names: set[str], *, after: int = 0) -> list[dict[str, Any]]:
    """The node's slices once they offer exactly ``names`` at a generation above ``after``."""

    def probe() -> list[dict[str, Any]] | None:
        slices = _slices(kube, node)
        if not slices or set(_devices(slices)) != names:
            return None
        gens = {s["spec"]["pool"]["generation"] for s in slices}
        return slices if len(gens) == 1 and min(gens) > after else None

    return wait_for(probe, timeout=30, interval=0.2, what=f"{node}'s slices offering {sorted(names)}")


def _withdrawn(kube: Kube, node: str) -> bool:
    return not _slices(kube, node)


def _events(kube: Kube, namespace: str, involved: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1", "Event", namespace, fieldSelector=f"involvedObject.name={involved}")
            if e["reason"] == reason]


GPU_NAMES = {f"gpu-{i}" for i in range(GPUS)}
#: What each node offers at first: its eight GPUs, and on the H200 node the passthrough GPU as well.
OFFERED = {H200: GPU_NAMES | {"gpu-vfio-0"}, H100: GPU_NAMES}


# --- proof 3: the plugin with its real identity -------------------------------------------------------


def test_plugin_publishes_its_gpus_with_nvidia_attributes(kube: Kube, plugins: dict[str, Plugin]) -> None:
    """The real server accepts each plugin's pool, written with its own pod's token (so through the
    stack's admission policy): driver ``gpu.nvidia.com``, pool and nodeName = its node, NVIDIA's
    attribute names and types (strings, semver versions, and for VFIO an int and a bool) and ``memory``
    capacity, as the server stores them, plus our ``memory`` int attribute (MiB) beside the capacity."""
    for node, plugin in plugins.items():
        slices = _published(kube, node, OFFERED[node])
        node_uid = kube.get("v1", "Node", node)["metadata"]["uid"]
        for s in slices:
            spec = s["spec"]
            assert spec["driver"] == DRIVER and spec["nodeName"] == node
            assert spec["pool"]["name"] == node and spec["pool"]["resourceSliceCount"] == len(slices)
            # Owned by the Node: deleting the node garbage-collects its slices.
            assert [(o["kind"], o["uid"]) for o in s["metadata"]["ownerReferences"]] == [("Node", node_uid)]
        model = MODELS[node]
        devices = _devices(slices)
        for name in GPU_NAMES:
            attrs = devices[name]["attributes"]
            assert attrs["type"] == {"string": "gpu"}, name
            assert attrs["productName"] == {"string": PRODUCTS[node]}
            assert attrs["brand"] == {"string": "Nvidia"} and attrs["architecture"] == {"string": "Hopper"}
            assert attrs["uuid"]["string"].startswith("GPU-")
            assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
            assert set(attrs["driverVersion"]) == {"version"} and set(attrs["cudaDriverVersion"]) == {"version"}
            assert attrs["resource.kubernetes.io/pciBusID"]["string"].startswith("0000:")
            assert quantity_value(devices[name]["capacity"]["memory"]["value"]) == model.memory_mib * 2**20
            assert attrs["memory"] == {"int": model.memory_mib}  # ours: the capacity again, in MiB
        if node == H200:  # the passthrough GPU, with the int and bool attributes only VFIO devices carry
            vfio = devices["gpu-vfio-0"]
            assert vfio["attributes"] == {
                "type": {"string": "vfio"}, "uuid": {"string": f"PCI-{VFIO_GPU}"}, "deviceID": {"string": "0x2335"},
                "vendorID": {"string": "0x10de"}, "numa": {"int": 1}, "productName": {"string": PRODUCTS[H200]},
                "iommuFDEnabled": {"bool": False}, "resource.kubernetes.io/pciBusID": {"string": VFIO_GPU}}
            assert quantity_value(vfio["capacity"]["addressableMemory"]["value"]) == model.memory_mib * 2**20
        # The registration made the plugin compare the server's copy of its pool (defaults, canonical
        # quantities) with what it builds: equal, so the first generation holds.
        _assert_generation_holds(kube, node, 1)
        assert plugin.proc.poll() is None, plugin.logs()


def _assert_generation_holds(kube: Kube, node: str, generation: int, polls: int = 4) -> None:
    """Across several of the plugin's poll intervals (0.5 s), the pool is not republished."""
    try:
        changed = wait_for(lambda: _generation(_slices(kube, node)) != generation, timeout=polls * 0.5,
                           interval=0.25, what="a republication")
    except TimeoutError:
        return
    pytest.fail(f"{node}'s pool was republished without an inventory change ({changed}): "
                f"{json.dumps(_slices(kube, node))[:2000]}")


def test_slices_wiped_by_a_restarting_kubelet_are_published_again(kube: Kube, plugins: dict[str, Plugin]) -> None:
    """A starting kubelet deletes every ResourceSlice of its node, then registers the plugins again: the
    plugin republishes its pool right after the registration, not only at its 30 s resync."""
    plugin = plugins[H100]
    names = {s["metadata"]["name"] for s in _published(kube, H100, OFFERED[H100])}
    for name in names:
        kube.delete(RESOURCE, "ResourceSlice", name)
    wait_for(lambda: not _slices(kube, H100), timeout=10, interval=0.1, what="the wipe")
    plugin.kubelet.close()
    plugin.kubelet.register(timeout=10)
    back = wait_for(lambda: _slices(kube, H100), timeout=10, interval=0.1, what="the pool published again")
    assert set(_devices(back)) == OFFERED[H100] and {s["metadata"]["name"] for s in back} == names


MIG_LAYOUT = """\
version: v1
mig-configs:
  gpu7-mixed:
  - devices: [0, 1, 2, 3, 4, 5, 6]
    mig-enabled: false
  - devices: [7]
    mig-enabled: true
    mig-devices: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
"""


def test_inventory_changes_republish_the_pool(kube: Kube, plugins: dict[str, Plugin]) -> None:
    """Changes on the node reach the server as a new pool generation (one generation across the pool's
    slices): a GPU that falls off the bus is withdrawn (and, after XID 79, stays withdrawn until it has
    been quiet for the plugin's XID quiet period, longer than this test), and a MIG layout replaces a whole
    GPU by its MIG devices, whose attributes and capacities the real server accepts."""
    h200 = plugins[H200]
    before = _devices(_published(kube, H200, OFFERED[H200]))
    h200.sim("lose", "7")
    lost = _published(kube, H200, OFFERED[H200] - {"gpu-7"}, after=1)
    assert all(_devices(lost)[n] == before[n] for n in OFFERED[H200] - {"gpu-7"}), "the others are unchanged"

    h100 = plugins[H100]
    whole = _devices(_slices(kube, H100))["gpu-7"]
    layout = h100.root / "mig.yaml"
    layout.write_text(MIG_LAYOUT)
    done = run_agent("--host-root", str(h100.root), "--nvml", f"simulated:{h100.machine}", "mig", "apply",
                     "--config", str(layout), "--name", "gpu7-mixed")
    assert done.returncode == 0, done.stdout + done.stderr

    def mig_published() -> list[dict[str, Any]] | None:
        slices = _slices(kube, H100)
        names = set(_devices(slices))
        return slices if "gpu-7" not in names and sum(n.startswith("gpu-7-mig-") for n in names) == 4 else None

    slices = wait_for(mig_published, timeout=30, interval=0.2, what="gpu-7's MIG devices published")
    assert _generation(slices) >= 2
    migs = {n: d for n, d in _devices(slices).items() if n.startswith("gpu-7-mig-")}
    assert sorted(d["attributes"]["profile"]["string"] for d in migs.values()) == \
        ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    for name, dev in migs.items():
        attrs, capacity = dev["attributes"], dev["capacity"]
        assert attrs["type"] == {"string": "mig"} and attrs["uuid"]["string"].startswith("MIG-"), name
        assert attrs["parentUUID"] == whole["attributes"]["uuid"]
        assert attrs["productName"] == {"string": PRODUCTS[H100]}
        profile = MODELS[H100].mig.profile(attrs["profile"]["string"])  # type: ignore[union-attr]
        assert profile is not None
        assert quantity_value(capacity["memory"]["value"]) == profile.memory_mib * 2**20
        assert attrs["memory"] == {"int": profile.memory_mib}
        assert int(capacity["multiprocessors"]["value"]) == profile.multiprocessors
        assert sum(k.startswith("memorySlice") for k in capacity) == profile.memory_slices
    _assert_generation_holds(kube, H100, _generation(slices))
    assert _generation(_slices(kube, H200)) == _generation(lost), "the other node's pool is its own"


def test_a_restarted_plugin_keeps_its_pool_and_reports_a_corrupted_checkpoint(kube: Kube,
                                                                               plugins: dict[str, Plugin],
                                                                               dev_stack: AppliedStack) -> None:
    """SIGTERM leaves the slices; the restarted plugin finds them equal to its inventory (MIG devices
    included) and does not bump the generation. A checkpoint it cannot read is rebuilt and reported as
    a Warning Event on its Node, which its RBAC lets it create."""
    plugin = plugins[H100]
    before = _slices(kube, H100)
    plugin.kubelet.close()
    plugin.proc.send_signal(signal.SIGTERM)
    assert plugin.proc.wait(timeout=15) == 0, plugin.logs()
    (plugin.root / "var/lib/nvidia-gpu-agent/dra/checkpoint.json").write_text("{not json")
    restarted = _start_plugin(kube, dev_stack, H100, plugin.log.parent, root=plugin.root)
    plugin.proc, plugin.kubelet = restarted.proc, restarted.kubelet
    plugin.kubelet.register(timeout=60)

    # Events about cluster-scoped objects live in the default namespace.
    [event] = wait_for(functools.partial(_events, kube, "default", H100, "DRACheckpointCorrupted"), timeout=15,
                       interval=0.2, what="the checkpoint event on the Node")
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["uid"] == kube.get("v1", "Node", H100)["metadata"]["uid"]
    assert "checkpoint unreadable" in event["message"]
    _assert_generation_holds(kube, H100, _generation(before))
    assert [(s["metadata"]["uid"], s["spec"]) for s in _slices(kube, H100)] == \
        [(s["metadata"]["uid"], s["spec"]) for s in before]


def _slice_body(node: str, *, driver: str = DRIVER, name: str = "") -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE, "kind": "ResourceSlice",
        "metadata": {"name": name or f"dra-forged-{node}-{driver}".replace(".", "-")},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-99", "attributes": {"type": {"string": "gpu"}}}]},
    }


def _refused(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def test_admission_policy_pins_the_plugin_to_its_node_and_driver(kube: Kube, plugins: dict[str, Plugin],
                                                                 dev_stack: AppliedStack) -> None:
    """With the plugin's own pod-bound token, the stack's ValidatingAdmissionPolicy refuses slices of
    another node (create, update and delete) and of another driver, with the policy's own messages."""
    me = plugins[H200].agent.kube
    denied_by = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request"
    # Control: the same token may write a slice of its own node and driver (dry run: the plugin's pool
    # stays as it published it); admission runs on dry-run requests too.
    me.create(_slice_body(H200), dry_run=True)

    other_node = _refused(lambda: me.create(_slice_body(H100)))
    assert (other_node.status, other_node.reason) == (403, "Forbidden")  # who writes, not what: not 422
    assert denied_by in other_node.message
    assert f"the DRA plugin on node {H200} may not write ResourceSlices of node {H100}" in other_node.message
    theirs = _slices(kube, H100)[0]["metadata"]["name"]
    for call in (lambda: me.patch(RESOURCE, "ResourceSlice", theirs, {"metadata": {"labels": {"x": "y"}}}),
                 lambda: me.delete(RESOURCE, "ResourceSlice", theirs)):
        refused = _refused(call)
        assert refused.status == 403 and denied_by in refused.message
        assert f"may not write ResourceSlices of node {H100}" in refused.message
    assert _slices(kube, H100)[0]["metadata"]["name"] == theirs  # still there, unchanged

    other_driver = _refused(lambda: me.create(_slice_body(H200, driver="gpu.example.com")))
    assert other_driver.status == 403 and denied_by in other_driver.message
    assert f"the DRA plugin may only write ResourceSlices of driver {DRIVER}" in other_driver.message

    # A token of the same ServiceAccount not bound to a pod has no node: refused whatever it writes.
    sa = dev_stack.object("DaemonSet", DAEMONSET)["spec"]["template"]["spec"]["serviceAccountName"]
    unbound = service_account_kube(kube, NS, sa)
    nameless = _refused(lambda: unbound.create(_slice_body(H200), dry_run=True))
    assert nameless.status == 403 and "the DRA plugin's token carries no node name" in nameless.message


def test_rbac_denies_what_the_plugin_never_needs(kube: Kube, plugins: dict[str, Plugin]) -> None:
    """The stack's RBAC for the plugin, judged by the real authorizer for the plugin's own token: what it
    calls is allowed, and Secrets, patching Nodes, deleting pods (even its own) and DeviceClasses are not."""
    plugin = plugins[H200]
    me = plugin.agent.kube
    pod = plugin.agent.pod["metadata"]["name"]
    # What it needs, the authorizer allows.
    assert me.can_i("create", "resourceslices", group="resource.k8s.io")
    assert me.can_i("get", "resourceclaims", group="resource.k8s.io", namespace="gpu-test1")
    assert me.can_i("get", "nodes", name=H200)
    # What it never needs, the authorizer refuses, and so do the real requests.
    assert not me.can_i("get", "secrets", namespace=NS)
    assert not me.can_i("list", "secrets")
    assert not me.can_i("patch", "nodes", name=H200)
    assert not me.can_i("delete", "pods", namespace=NS, name=pod)
    assert not me.can_i("create", "deviceclasses", group="resource.k8s.io")
    calls = {
        "list secrets": lambda: me.list("v1", "Secret", NS),
        "patch its node": lambda: me.patch("v1", "Node", H200, {"metadata": {"labels": {"x": "y"}}}),
        "delete its own pod": lambda: me.delete("v1", "Pod", pod, NS),
        "create a DeviceClass": lambda: me.create({
            "apiVersion": RESOURCE, "kind": "DeviceClass", "metadata": {"name": "dra-forged"},
            "spec": {"selectors": [{"cel": {"expression": "true"}}]}}),
    }
    for what, call in calls.items():
        refused = _refused(call)
        assert refused.status == 403 and "is forbidden: User \"system:serviceaccount:nvidia-gpu:dra-kubelet-plugin\"" \
            in refused.message, what
    assert kube.get_or_none("v1", "Pod", pod, NS) is not None
    assert "x" not in kube.get("v1", "Node", H200)["metadata"].get("labels", {})


# --- proof 4: DRA end to end with the real kube-scheduler ---------------------------------------------

DEMOS = ("nvidia-dra-demo-gpu-test1-claimtemplate.yaml", "nvidia-dra-demo-gpu-test3-shared-claim.yaml",
         "nvidia-dra-demo-gpu-test-mps.yaml")
OURS = "dra-claims"
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
#: Claims of our own, by what they select: name -> (device class, CEL selector or None, count).
SELECTING: dict[str, tuple[str, str | None, int]] = {
    "big-memory": ("gpu.nvidia.com", "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('100Gi')) >= 0", 1),
    "h100-by-name": ("gpu.nvidia.com", f"device.attributes['gpu.nvidia.com'].productName == '{PRODUCTS[H100]}'", 1),
    "mig-1g": ("mig.nvidia.com", "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'", 1),
    "passthrough": ("vfio.gpu.nvidia.com", None, 1),
}
IMPOSSIBLE: dict[str, tuple[str, str | None, int]] = {
    "one-tebibyte": ("gpu.nvidia.com", "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('1Ti')) >= 0", 1),
    "nine-gpus": ("gpu.nvidia.com", None, GPUS + 1),
}


def _pin_to_our_nodes(pod: dict[str, Any], nodes: tuple[str, ...] = tuple(MACHINES)) -> dict[str, Any]:
    """The one change to NVIDIA's demo pods: a required node affinity for this module's nodes. The
    control plane is shared by the whole cluster suite, and other modules' kwok Nodes must get none of
    these pods (only our plugins publish slices, but other modules may add some). Demo tolerations of
    ``nvidia.com/gpu`` already match the stack's GPU taint, and the DeviceClass names are the stack's."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(nodes)}]}
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}
    return pod


def _claim(name: str, device_class: str, selector: str | None, count: int) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if count != 1:
        exactly["count"] = count
    return {"apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": OURS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def _claim_pod(name: str, nodes: tuple[str, ...] = tuple(MACHINES)) -> dict[str, Any]:
    return _pin_to_our_nodes({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": OURS},
        "spec": {"containers": [{"name": "ctr", "image": "ubuntu:22.04", "command": ["sleep", "infinity"],
                                 "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}], "tolerations": TOLERATE_GPU},
    }, nodes)


def _create_all(kube: Kube, objects: list[dict[str, Any]]) -> None:
    """Namespaces first (and their default ServiceAccount, which pod admission needs), then the rest."""
    for ns in (o for o in objects if o["kind"] == "Namespace"):
        kube.create(ns)
    for ns in (o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"):
        wait_for(functools.partial(kube.get_or_none, "v1", "ServiceAccount", "default", ns), timeout=30,
                 what=f"the default ServiceAccount of {ns}")
    for obj in (o for o in objects if o["kind"] != "Namespace"):
        kube.create(obj)


@dataclass(frozen=True)
class Workloads:
    """Every pod this module asked the scheduler to place: (namespace, name)."""

    demo_pods: tuple[tuple[str, str], ...]
    selecting: tuple[tuple[str, str], ...]
    impossible: tuple[tuple[str, str], ...]


@pytest.fixture(scope="module")
def workloads(kube: Kube, plugins: dict[str, Plugin]) -> Iterator[Workloads]:
    """NVIDIA's demo manifests and our own claims, created once the inventory tests have run (gpu-7 of
    the H200 lost, gpu-7 of the H100 split into MIG devices)."""
    for node in MACHINES:  # both pools as the inventory test left them
        wait_for(functools.partial(_slices, kube, node), timeout=30, what=f"{node}'s slices")
    objects: list[dict[str, Any]] = []
    demo_pods = []
    for demo in DEMOS:
        for obj in yaml.safe_load_all((DATA / demo).read_text()):
            if not obj:
                continue
            if obj["kind"] == "Pod":
                _pin_to_our_nodes(obj)
                demo_pods.append((obj["metadata"]["namespace"], obj["metadata"]["name"]))
            objects.append(obj)
    objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OURS}})
    for name, spec in {**SELECTING, **IMPOSSIBLE}.items():
        objects += [_claim(name, *spec), _claim_pod(name)]
    _create_all(kube, objects)
    yield Workloads(tuple(demo_pods), tuple((OURS, n) for n in SELECTING), tuple((OURS, n) for n in IMPOSSIBLE))
    # Leave the shared control plane without our pods and claims (the namespace controller finishes it).
    for ns in (o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"):
        kube.delete("v1", "Namespace", ns)


def _scheduled(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return wait_for(lambda: (p := kube.get("v1", "Pod", name, namespace))["spec"].get("nodeName") and p,
                    timeout=30, interval=0.2, what=f"pod {namespace}/{name} scheduled")


def _pod_claims(kube: Kube, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's ResourceClaims by the pod's claim name, as the server holds them (templates resolved)."""
    ns = pod["metadata"]["namespace"]
    generated = {s["name"]: s.get("resourceClaimName") for s in pod.get("status", {}).get("resourceClaimStatuses", [])}
    out = {}
    for ref in pod["spec"].get("resourceClaims", []):
        name = ref.get("resourceClaimName") or generated[ref["name"]]
        out[ref["name"]] = kube.get(RESOURCE, "ResourceClaim", name, ns)
    return out


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(claim["status"]["allocation"]["devices"]["results"])


def _assert_allocated_from_our_slices(kube: Kube, pod: dict[str, Any], claim: dict[str, Any]) -> None:
    node = pod["spec"]["nodeName"]
    offered = _devices(_slices(kube, node))
    results = _results(claim)
    assert results, claim
    for r in results:
        assert (r["driver"], r["pool"]) == (DRIVER, node), r
        assert r["device"] in offered, f"{r['device']} is not in {node}'s slices: {sorted(offered)}"
    # The allocation pins the claim to the node the pod landed on.
    [term] = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [node]}]
    assert any(r.get("uid") == pod["metadata"]["uid"] for r in claim["status"].get("reservedFor", []))


def test_nvidia_demo_claims_are_allocated_by_the_scheduler(kube: Kube, workloads: Workloads) -> None:
    """NVIDIA's quickstart claims (a template, a shared claim, an MPS config), applied as published, get
    allocated by kube-scheduler to devices our slices offer on the node each pod is bound to, with the
    stack's DeviceClasses selecting our devices."""
    pods = {ref: _scheduled(kube, *ref) for ref in workloads.demo_pods}
    claims = {ref: _pod_claims(kube, pod) for ref, pod in pods.items()}
    for ref, pod in pods.items():
        for claim in claims[ref].values():
            _assert_allocated_from_our_slices(kube, pod, claim)
    # gpu-test1: one claim per pod from the template, each a distinct GPU.
    test1 = [claims[("gpu-test1", p)]["gpu"] for p in ("pod1", "pod2")]
    assert test1[0]["metadata"]["uid"] != test1[1]["metadata"]["uid"]
    assert all(c["metadata"]["ownerReferences"][0]["kind"] == "Pod" for c in test1)
    devices = [(_results(c)[0]["pool"], _results(c)[0]["device"]) for c in test1]
    assert devices[0] != devices[1], f"two pods, two distinct GPUs: {devices}"
    # gpu-test3: one shared claim; both pods are reserved on it and land on its node.
    shared = [claims[("gpu-test3", p)]["shared-gpu"] for p in ("pod1", "pod2")]
    assert shared[0]["metadata"]["uid"] == shared[1]["metadata"]["uid"]
    holders = kube.get(RESOURCE, "ResourceClaim", "single-gpu", "gpu-test3")["status"]["reservedFor"]
    assert {r["name"] for r in holders} == {"pod1", "pod2"}
    assert pods[("gpu-test3", "pod1")]["spec"]["nodeName"] == pods[("gpu-test3", "pod2")]["spec"]["nodeName"]
    # gpu-test-mps: the claim's MPS config travels in the allocation, for the driver to apply.
    mps = claims[("gpu-test-mps", "test-pod")]["shared-gpu"]
    [config] = mps["status"]["allocation"]["devices"]["config"]
    assert config["source"] == "FromClaim" and config["requests"] == ["mps-gpu"]
    assert config["opaque"]["driver"] == DRIVER
    assert config["opaque"]["parameters"]["sharing"]["strategy"] == "MPS"


def test_claims_by_capacity_attribute_and_mig_profile_land_where_they_must(kube: Kube,
                                                                           workloads: Workloads) -> None:
    """CEL over our capacity and attributes selects the right devices: >= 100Gi of memory only an H200
    has, the H100 by ``productName``, a 1g.10gb MIG device by ``profile`` (mig.nvidia.com), the
    passthrough GPU through vfio.gpu.nvidia.com."""
    want_node = {"big-memory": H200, "h100-by-name": H100, "mig-1g": H100, "passthrough": H200}
    for ns, name in workloads.selecting:
        pod = _scheduled(kube, ns, name)
        assert pod["spec"]["nodeName"] == want_node[name], name
        claim = _pod_claims(kube, pod)["gpu"]
        _assert_allocated_from_our_slices(kube, pod, claim)
        device = _devices(_slices(kube, want_node[name]))[_results(claim)[0]["device"]]
        if name == "big-memory":
            assert quantity_value(device["capacity"]["memory"]["value"]) >= 100 * 2**30
        elif name == "h100-by-name":
            assert device["attributes"]["productName"] == {"string": PRODUCTS[H100]}
        elif name == "passthrough":
            assert _results(claim)[0]["device"] == "gpu-vfio-0"
        else:
            assert device["attributes"]["type"] == {"string": "mig"}
            assert device["attributes"]["profile"] == {"string": "1g.10gb"}


def test_impossible_claims_stay_pending_with_the_schedulers_reason(kube: Kube, workloads: Workloads) -> None:
    """A claim no device can satisfy (1Ti of memory) or more GPUs than any node has stays unallocated, and
    its pod Pending with the DynamicResources plugin's reason in PodScheduled and in an Event."""
    for ns, name in workloads.impossible:
        message = wait_for(functools.partial(_unschedulable, kube, ns, name), timeout=30, interval=0.2,
                           what=f"the scheduler's refusal of {name}")
        # The DynamicResources plugin found no allocation on either node the pod may use (other modules'
        # nodes, when the suite shares the control plane, fail the node affinity instead).
        assert re.search(rf"0/\d+ nodes are available: .*\b{len(MACHINES)} cannot allocate all claims", message), \
            message
        pod = kube.get("v1", "Pod", name, ns)
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
        assert not kube.get(RESOURCE, "ResourceClaim", name, ns).get("status", {}).get("allocation")
        events = wait_for(functools.partial(_events, kube, ns, name, "FailedScheduling"), timeout=15,
                          what=f"a FailedScheduling event for {name}")
        assert "cannot allocate all claims" in events[-1]["message"]


def _unschedulable(kube: Kube, namespace: str, name: str) -> str | None:
    """The PodScheduled condition's message once the scheduler has found the pod Unschedulable."""
    pod = kube.get("v1", "Pod", name, namespace)
    cond = next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"), None)
    if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
        return str(cond.get("message", ""))
    return None


#: The seed article's selector: a GPU with at least 16000 MiB, by attribute. NVIDIA's driver publishes memory
#: only as capacity, so there it selects nothing; ours publishes ``memory`` (MiB) as an attribute too.
ARTICLE_SELECTOR = "device.attributes['gpu.nvidia.com'].memory >= 16000"


def _article_claim(name: str, allocation_mode: str = "ExactCount") -> dict[str, Any]:
    """The article's claim (one ``gpu.nvidia.com`` device by ``ARTICLE_SELECTOR``) with its allocation mode
    spelt ``ExactCount``, the API's name: the article's ``Count`` the server refuses."""
    claim = _claim(name, "gpu.nvidia.com", ARTICLE_SELECTOR, 1)
    claim["spec"]["devices"]["requests"][0]["exactly"] |= {"allocationMode": allocation_mode, "count": 1}
    return claim


def test_the_articles_memory_attribute_claim_allocates_only_where_memory_suffices(
        kube: Kube, dev_stack: AppliedStack, plugins: dict[str, Plugin], workloads: Workloads,
        tmp_path: Path) -> None:
    """The seed article's claim, ``device.attributes['gpu.nvidia.com'].memory >= 16000``, against our
    plugins' slices and the real kube-scheduler: with a node of 80 GB H100s and a node of one 16 GB T4
    (15360 MiB) both allowed, it is allocated an H100; held to the T4 node it stays Pending with the
    DynamicResources plugin's reason, while a claim without the selector gets that T4 (so only the memory
    attribute kept it off). The article's ``allocationMode: Count`` is refused by the server."""
    refused = _refused(lambda: kube.create(_article_claim("article-count", "Count"), dry_run=True))
    assert refused.status == 422 and "allocationMode" in refused.message and "ExactCount" in refused.message, \
        refused.message
    template = dev_stack.object("NodeGroup", NODE_GROUP)["spec"]["nodeTemplate"]
    create_kwok_node(kube, T4, {"node.deckhouse.io/group": NODE_GROUP, **template.get("labels", {}), SETUP: ""},
                     template.get("taints", []))
    both, t4_only = (H100, T4), (T4,)
    pods = {"article-16000mib": both, "article-16000mib-t4": t4_only, "any-gpu-t4": t4_only}
    plugin: Plugin | None = None
    try:
        plugin = _start_plugin(kube, dev_stack, T4, tmp_path)
        plugin.kubelet.register(timeout=60)
        [t4] = _devices(_published(kube, T4, {"gpu-0"})).values()
        assert t4["attributes"]["memory"] == {"int": catalogue.T4.memory_mib} and catalogue.T4.memory_mib < 16000
        claims = {name: _article_claim(name) for name in pods if name.startswith("article-")}
        claims["any-gpu-t4"] = _claim("any-gpu-t4", "gpu.nvidia.com", None, 1)
        for name, nodes in pods.items():
            kube.create(claims[name])
            kube.create(_claim_pod(name, nodes))

        pod = _scheduled(kube, OURS, "article-16000mib")
        claim = _pod_claims(kube, pod)["gpu"]
        assert pod["spec"]["nodeName"] == H100, pod["spec"]["nodeName"]
        _assert_allocated_from_our_slices(kube, pod, claim)
        device = _devices(_slices(kube, H100))[_results(claim)[0]["device"]]
        assert device["attributes"]["type"] == {"string": "gpu"}
        assert device["attributes"]["memory"] == {"int": catalogue.H100_80GB.memory_mib}
        assert quantity_value(device["capacity"]["memory"]["value"]) == catalogue.H100_80GB.memory_mib * 2**20

        # The T4 alone: the selector keeps its slice out, and nothing else does.
        anyone = _scheduled(kube, OURS, "any-gpu-t4")
        assert anyone["spec"]["nodeName"] == T4
        assert [r["device"] for r in _results(_pod_claims(kube, anyone)["gpu"])] == ["gpu-0"]
        message = wait_for(functools.partial(_unschedulable, kube, OURS, "article-16000mib-t4"), timeout=30,
                           interval=0.2, what="the scheduler's refusal of the article's claim on the T4 node")
        assert re.search(r"0/\d+ nodes are available: .*\b1 cannot allocate all claims", message), message
        assert not kube.get(RESOURCE, "ResourceClaim", "article-16000mib-t4", OURS).get("status", {}).get("allocation")
    finally:
        for name in pods:
            kube.delete("v1", "Pod", name, OURS)
            kube.delete(RESOURCE, "ResourceClaim", name, OURS)
        if plugin is not None:
            _stop(plugin)
        # What the kubelet of a node whose plugin is gone does (kwok does not): wipe its slices; the Node
        # goes too, so no later test (the uninstall one counts the driver's slices) meets either.
        for s in _slices(kube, T4):
            kube.delete(RESOURCE, "ResourceSlice", s["metadata"]["name"])
        kube.delete("v1", "Node", T4)


def test_claim_quota_counts_devices_of_the_stacks_classes(kube: Kube, dev_stack: AppliedStack) -> None:
    """The stack's per-namespace claim quota uses resource names the quota system really counts: a claim
    for more ``gpu.nvidia.com`` devices than ``research`` may have is refused at admission (dry run: the
    shared namespace keeps no object and the quota no usage)."""
    quota = dev_stack.object("ResourceQuota", "nvidia-gpu-dra-claims")
    ns = quota["metadata"]["namespace"]
    key = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    limit = int(quota["spec"]["hard"][key])

    def counted() -> dict[str, str] | None:
        status = kube.get("v1", "ResourceQuota", "nvidia-gpu-dra-claims", ns).get("status", {})
        return status.get("used") if status.get("hard") else None

    used = int(wait_for(counted, timeout=30, what="the quota controller's first count").get(key, "0"))
    free = limit - used
    assert free > 0, f"{ns} already uses {used} of {limit} devices"

    def claim(count: int) -> dict[str, Any]:
        body = _claim(f"dra-quota-{count}", "gpu.nvidia.com", None, count)
        body["metadata"]["namespace"] = ns
        return body

    kube.create(claim(free), dry_run=True)
    refused = _refused(lambda: kube.create(claim(free + 1), dry_run=True))
    assert refused.status == 403
    assert f"exceeded quota: nvidia-gpu-dra-claims, requested: {key}={free + 1}" in refused.message
    assert f"limited: {key}={limit}" in refused.message


def _allocated_claims(kube: Kube, workloads: Workloads) -> dict[str, list[dict[str, Any]]]:
    """node -> the allocated claims of every scheduled pod there, each once, read from the server."""
    out: dict[str, dict[str, dict[str, Any]]] = {node: {} for node in MACHINES}
    for ns, name in (*workloads.demo_pods, *workloads.selecting):
        pod = _scheduled(kube, ns, name)
        for claim in _pod_claims(kube, pod).values():
            out[pod["spec"]["nodeName"]][claim["metadata"]["uid"]] = claim
    return {node: list(claims.values()) for node, claims in out.items()}


def _has_sharing(claim: dict[str, Any]) -> bool:
    return bool(claim["status"]["allocation"]["devices"].get("config"))


def _ref(claim: dict[str, Any]) -> tuple[str, str, str]:
    meta = claim["metadata"]
    return meta["namespace"], meta["name"], meta["uid"]


#: The claim the kubelet stand-in still prepares: a passthrough GPU, which no real node offers yet (its GPUs are
#: bound to ``nvidia``, never to ``vfio-pci``). NVIDIA's demos, plain GPU claims and a MIG device's claim run on
#: the real kubelet in ``test_real_node_stack.py``.
STAND_IN_ONLY = {"passthrough"}


def test_kubelet_prepare_writes_cdi_for_exactly_the_allocated_devices(kube: Kube, plugins: dict[str, Plugin],
                                                                      workloads: Workloads) -> None:
    """What the kubelet would do once a pod is bound, for the claims of :data:`STAND_IN_ONLY`:
    NodePrepareResources for the pod's claims (name, namespace, uid as the server holds them) on the plugin of
    the pod's node. The plugin reads each claim back from the server with its own token and writes one CDI spec
    per claim naming exactly the claim's allocated devices; NodeUnprepareResources removes it. The MPS claim is
    prepared in :func:`test_mps_claim_from_the_server_is_set_up_as_allocated` (the MPS tools are not on this
    host)."""
    by_node = {node: [c for c in claims
                      if c["metadata"]["namespace"] == OURS and c["metadata"]["name"] in STAND_IN_ONLY]
               for node, claims in _allocated_claims(kube, workloads).items()}
    assert {c["metadata"]["name"] for claims in by_node.values() for c in claims} == STAND_IN_ONLY, by_node
    for node, allocated_here in by_node.items():
        plugin = plugins[node]
        claims = [c for c in allocated_here if not _has_sharing(c)]
        offered = _devices(_slices(kube, node))
        response = plugin.kubelet.prepare(DRIVER, [_ref(c) for c in claims])
        assert set(response.claims) == {c["metadata"]["uid"] for c in claims}
        for claim in claims:
            uid = claim["metadata"]["uid"]
            answer = response.claims[uid]
            assert answer.error == "", f"{_ref(claim)}: {answer.error}\n{plugin.logs()}"
            allocated = {(r["pool"], r["device"], r["request"]) for r in _results(claim)}
            assert {(d.pool_name, d.device_name, *d.request_names) for d in answer.devices} == allocated
            for d in answer.devices:
                assert list(d.cdi_device_ids) == [f"k8s.{DRIVER}/claim={uid}-{d.device_name}"]
            spec = json.loads((plugin.root / f"var/run/cdi/k8s.{DRIVER}-claim_{uid}.json").read_text())
            assert spec["kind"] == f"k8s.{DRIVER}/claim"
            assert {d["name"] for d in spec["devices"]} == {f"{uid}-{device}" for _, device, _ in allocated}
            for cdi_device in spec["devices"]:
                device = cdi_device["name"].removeprefix(f"{uid}-")
                # The container gets the GPU the slice offered under that name, and only that one.
                edits = cdi_device["containerEdits"]
                nodes = [n["path"] for n in edits["deviceNodes"]]
                if offered[device]["attributes"]["type"] == {"string": "vfio"}:
                    assert nodes == ["/dev/vfio/vfio", f"/dev/vfio/{VFIO_GROUP}"] and "env" not in edits
                    continue
                uuid = offered[device]["attributes"]["uuid"]["string"]
                assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in edits["env"]
                parent = f"/dev/nvidia{device.split('-mig-')[0].removeprefix('gpu-')}"
                if "-mig-" not in device:
                    assert nodes == [parent]
                    continue
                # A MIG device also needs its GPU instance's and compute instance's access capabilities,
                # as NVIDIA's CDI specs list them (the host has them: node setup and the MIG manager make them).
                assert nodes[0] == parent and len(nodes) == 3, nodes
                assert all(n.startswith("/dev/nvidia-caps/nvidia-cap") for n in nodes[1:]), nodes
        specs = sorted(p.name for p in (plugin.root / "var/run/cdi").glob("*.json"))
        assert specs == sorted(f"k8s.{DRIVER}-claim_{c['metadata']['uid']}.json" for c in claims)
        # Idempotent, as the kubelet may repeat the call after a restart.
        again = plugin.kubelet.prepare(DRIVER, [_ref(c) for c in claims])
        assert all(again.claims[c["metadata"]["uid"]].error == "" for c in claims)
        done = plugin.kubelet.unprepare(DRIVER, [_ref(c) for c in claims])
        assert all(done.claims[c["metadata"]["uid"]].error == "" for c in claims)
        assert not list((plugin.root / "var/run/cdi").glob("*.json")), "every claim's CDI spec removed"


def test_prepare_refuses_claims_that_are_not_this_nodes(kube: Kube, plugins: dict[str, Plugin],
                                                        workloads: Workloads) -> None:
    """The claim fetch is real: a replaced claim (UID differs), a claim allocated on the other node and a
    claim that does not exist are refused per claim, and nothing is written."""
    by_node = _allocated_claims(kube, workloads)
    plugin = plugins[H200]
    mine = next(c for c in by_node[H200] if not _has_sharing(c))
    theirs = next(c for c in by_node[H100] if not _has_sharing(c))
    ns, name, _ = _ref(mine)
    response = plugin.kubelet.prepare(DRIVER, [(ns, name, "00000000-0000-0000-0000-000000000000"), _ref(theirs),
                                               (OURS, "no-such-claim", "11111111-1111-1111-1111-111111111111")])
    replaced = response.claims["00000000-0000-0000-0000-000000000000"].error
    assert f"UID is {mine['metadata']['uid']}" in replaced and "(the claim was replaced)" in replaced
    other = response.claims[theirs["metadata"]["uid"]].error
    assert f"is in pool {H100}, not this node's pool {H200}" in other
    assert response.claims["11111111-1111-1111-1111-111111111111"].error == f"claim {OURS}/no-such-claim: not found"
    assert not list((plugin.root / "var/run/cdi").glob("*.json"))


def test_mps_claim_from_the_server_is_set_up_as_allocated(kube: Kube, plugins: dict[str, Plugin],
                                                          workloads: Workloads) -> None:
    """NVIDIA's MPS demo claim, as the scheduler allocated it (its GpuConfig in the allocation's config),
    prepared by a driver reading it from the server with the plugin's token. The driver runs in this
    process with a recording sharing backend, because ``nvidia-smi`` and ``nvidia-cuda-mps-control`` are
    not on a test host; it sees the same simulated GPUs (the plugin's NVML state file) but has its own
    host root and checkpoint, and never publishes (the plugin process owns the pool)."""
    pod = _scheduled(kube, "gpu-test-mps", "test-pod")
    node = pod["spec"]["nodeName"]
    claim = _pod_claims(kube, pod)["shared-gpu"]
    ns, name, uid = _ref(claim)
    [result] = _results(claim)
    uuid = _devices(_slices(kube, node))[result["device"]]["attributes"]["uuid"]["string"]
    plugin = plugins[node]
    root = Path(tempfile.mkdtemp(prefix="dra-mps-", dir="/tmp"))
    _fake_host(root, plugin.machine, vfio=False)
    state = sim_state_file(plugin.root, plugin.machine)
    source = NvmlInventorySource(NvmlBackend("simulated", plugin.machine, state), HostRoot(root))
    sharing = RecordingSharing()
    driver = DraDriver(DriverSettings(driver=DRIVER, node=node),
                       api=KubeDraApi(AgentKube.connect(plugin.agent.kubeconfig)), source=source,
                       host=HostRoot(root), backend=sharing)
    try:
        driver.withdrawn.set()  # prepare only: publishing stays with the plugin process
        assert driver.start() is None
        outcome = driver.prepare([ClaimRef(ns, name, uid)])[uid]
        assert outcome.error == ""
        assert [(d.pool, d.device, d.requests) for d in outcome.devices] == [(node, result["device"], ("mps-gpu",))]
        # The demo's mpsConfig: 50 % active threads, 10Gi pinned device memory.
        assert sharing.calls == [("compute-mode", uuid, "EXCLUSIVE_PROCESS"),
                                 ("start-mps", uid, (uuid,), 50, {0: 10240})]
        spec = json.loads((root / f"var/run/cdi/k8s.{DRIVER}-claim_{uid}.json").read_text())
        [device] = spec["devices"]
        env = device["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in env
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in env
        assert driver.unprepare([ClaimRef(ns, name, uid)]) == {uid: ""}
        assert sharing.calls[2:] == [("stop-mps", uid), ("compute-mode", uuid, "DEFAULT")]
        assert not list((root / "var/run/cdi").glob("*.json"))
    finally:
        driver.close()
        source.close()
        shutil.rmtree(root, ignore_errors=True)


def test_uninstall_marker_deletion_withdraws_every_slice(kube: Kube, plugins: dict[str, Plugin]) -> None:
    """Last in the module: the uninstall path. Pulumi deletes the marker ConfigMap first; each plugin
    (which put its finalizer on the marker) withdraws its node's slices, and the finalizer goes once no
    slice of the driver is left, so the marker's deletion completes. The fixture restores the marker."""

    def armed() -> bool:
        return FINALIZER in (kube.get("v1", "ConfigMap", MARKER, NS)["metadata"].get("finalizers") or [])

    wait_for(armed, timeout=15, interval=0.2, what="the plugins' finalizer on the uninstall marker")
    kube.delete("v1", "ConfigMap", MARKER, NS)
    for node in MACHINES:
        wait_for(functools.partial(_withdrawn, kube, node), timeout=20, interval=0.2,
                 what=f"{node}'s slices withdrawn")
    # Other modules' slices of the driver (none are expected) could hold the finalizer for the grace period.
    wait_for(lambda: kube.get_or_none("v1", "ConfigMap", MARKER, NS) is None, timeout=GRACE_SECONDS + 15,
             interval=0.2, what="the marker's finalizer released")
    for plugin in plugins.values():
        assert plugin.proc.poll() is None, plugin.logs()
    # Withdrawn for good: the inventory loop (every 0.5 s) does not publish the pool again.
    with pytest.raises(TimeoutError):
        wait_for(lambda: any(_slices(kube, n) for n in MACHINES), timeout=1.5, interval=0.25, what="republication")
