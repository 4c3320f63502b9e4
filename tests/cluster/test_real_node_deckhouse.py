"""The Deckhouse backend on real GPU nodes (issue 35, step 6): what ``test_dev_node_containers.py`` and
``test_pulumi_engine.py`` show with the kubelet stand-in, on the real kubelet, containerd and runc.

``pulumi up`` (the real CLI and provider) of a ``nodeSetup: deckhouse`` stack with two node groups on Deckhouse
NodeGroups, one served by the device plugin and one by DRA, onto the local control plane with a real GPU node in
each NodeGroup (``localcluster.node``, ``--machine dgx-h100``). Deckhouse itself does not run here, so this module
plays its two node-side parts, and nothing else:

- **bashible**: it runs the NodeGroupConfiguration scripts of the node's NodeGroup, in weight order, as root on
  the node (here: inside the node's namespaces, :meth:`Node.nsenter`), with the node's kubelet credentials in
  ``/etc/kubernetes/kubelet.conf``, and Deckhouse's containerd layout: ``/etc/containerd/deckhouse.toml``
  beside ``config.toml`` and the ``conf2.d`` drop-in directory, merged into the running configuration, and
  containerd restarted when a drop-in changed. Deckhouse merges ``conf2.d`` with its own TOML merge; this node
  lets containerd's ``imports`` do it, which yields the same runtime tables for the one drop-in written here.
- **the node manager**: it puts each NodeGroup's ``nodeTemplate`` (the labels and taints the stack patched in)
  on the group's Nodes.

Then, without any stand-in: the scripts open the setup gate with the node's own credentials (the Node authorizer
and NodeRestriction judge them), the running containerd has the ``nvidia`` runtime and CDI, the stack's
DaemonSets start on the nodes, the device plugin registers with the kubelet and a workload's probe sees exactly
its two GPUs, the labeller labels the Node, and the DRA plugin prepares a claim the scheduler allocated, whose
CDI spec containerd applies (the driver's libraries from the node's driver root) and whose probe sees exactly
the claimed GPU.

The one kernel setting the scripts change, ``net.core.bpf_jit_harden``, is this machine's (it is not
namespaced); the fixture puts back the value it found. Needs root, buildah, debootstrap and gcc (as
``test_real_node_stack.py``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localcluster import ControlPlane, Kube
from localcluster.dryrun import install_crds
from localcluster.node import Node, add_node, remove_node
from nvgpu import labels
from tests.cluster.pulumi_project import Project
from tests.cluster.realnode import (
    allocated_devices,
    build_images,
    claim_probe_pod,
    crictl_info,
    kubectl,
    pod_ready,
    probe_pod,
    running_pod,
    stack_up,
    wait_until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.image, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
NS = "nvidia-gpu"
GATE = labels.GPU_SETUP_COMPLETE
NODE_GROUP_LABEL = "node.deckhouse.io/group"
DRIVER = "gpu.nvidia.com"
VERSION = "550.54.15"  #: the driver version go-nvml's DGX H100 reports
#: node -> its Deckhouse NodeGroup.
NODES = {"dkp-h100": "gpu-h100", "dkp-dra": "gpu-h200"}
DP_NODE, DRA_NODE = NODES
#: The one sysctl node setup sets (nvgpu.nodescripts.facts.SYSCTLS): global, so this machine's.
BPF_JIT_HARDEN = Path("/proc/sys/net/core/bpf_jit_harden")


def _config(agent_digest: str) -> dict[str, Any]:
    """A Deckhouse user's stack, the dev stack's shape: node setup as NodeGroupConfiguration scripts, one device
    plugin group and one DRA group."""
    gpu = {"model": "H100-80GB", "driverVersion": VERSION, "sharing": "Exclusive"}
    return {"config": {
        "nvidia-gpu:cluster": {
            "kubernetesVersion": "1.34", "namespace": NS, "allocationMode": "devicePlugin", "nodeSetup": "deckhouse",
            "agentImage": {"repository": "localhost/nvidia-gpu-agent", "digest": agent_digest, "pullPolicy": "Never"},
            "monitoring": {"enabled": False}, "kubeContext": "dev", "dra": {"driverName": DRIVER}},
        "nvidia-gpu:nodeGroups": [
            {"name": "h100", "nodeGroup": NODES[DP_NODE], "gpu": gpu},
            {"name": "h100-dra", "nodeGroup": NODES[DRA_NODE], "allocationMode": "dra", "gpu": gpu}]}}


@dataclass
class Deckhouse:
    cp: ControlPlane
    kube: Kube
    nodes: dict[str, Node]
    project: Project
    probe_ref: str
    timings: dict[str, float] = field(default_factory=dict)


def _in_node(node: Node, script: str, *, env: dict[str, str] | None = None,
             stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``bash -c script`` as root on the node (its mount, network and UTS namespaces)."""
    assignments = [f"{k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(node.nsenter([*assignments, "bash", "-c", script]), input=stdin, capture_output=True,
                          text=True, timeout=180, check=False)


def _deckhouse_layout(node: Node) -> None:
    """What a Deckhouse node has before bashible runs a module's scripts: the kubelet's kubeconfig at the path
    bashible's ``kubectl`` uses, and containerd's Deckhouse layout (the base config and ``conf2.d``, imported)."""
    kubeconfig = (node.directory / "kubelet.kubeconfig").read_text()
    done = _in_node(node, 'mkdir -p /etc/kubernetes && cat >/etc/kubernetes/kubelet.conf && '
                          'chmod 600 /etc/kubernetes/kubelet.conf', stdin=kubeconfig)
    assert done.returncode == 0, done.stderr
    done = _in_node(node, """set -e
cd /etc/containerd
mkdir -p conf2.d
cp config.toml deckhouse.toml
sed -i 's|^imports = \\[\\(.*\\)\\]$|imports = [\\1, "/etc/containerd/conf2.d/*.toml"]|' config.toml
grep -q 'conf2.d' config.toml""")
    assert done.returncode == 0, done.stderr
    node.restart("containerd")


def _node_manager(kube: Kube, node: str) -> None:
    """Deckhouse's node manager: the NodeGroup's node template (labels and taints) on the Node."""
    template = kube.get("deckhouse.io/v1", "NodeGroup", NODES[node])["spec"].get("nodeTemplate") or {}
    current = kube.get("v1", "Node", node)
    taints = [t for t in current["spec"].get("taints") or []
              if (t["key"], t["effect"]) not in {(n["key"], n["effect"]) for n in template.get("taints") or []}]
    kube.patch("v1", "Node", node, {"metadata": {"labels": template.get("labels") or {}},
                                    "spec": {"taints": taints + list(template.get("taints") or [])}})


@pytest.fixture(scope="module")
def deckhouse(real_cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deckhouse]:
    cp = real_cluster
    assert cp.bin_dir is not None
    kube = cp.admin()
    work = tmp_path_factory.mktemp("real-node-deckhouse")
    bpf_jit_harden = BPF_JIT_HARDEN.read_text()
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    images = build_images(work)
    timings["images"] = time.monotonic() - t0
    install_crds(kube, sorted((REPO / "nvidia_gpu" / "preview" / "crds").glob("*.yaml")))
    project: Project | None = None
    nodes: dict[str, Node] = {}
    try:
        for name, node_group in NODES.items():
            kube.create({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": node_group},
                         "spec": {"nodeType": "Static"}})
            nodes[name] = add_node(cp.directory, name, cp.bin_dir, kube,
                                   images=images.archives, machine="dgx-h100")
            kube.patch("v1", "Node", name, {"metadata": {"labels": {NODE_GROUP_LABEL: node_group}}})
            _deckhouse_layout(nodes[name])
        t0 = time.monotonic()
        project = stack_up(cp, work, "dev", _config(images.agent_digest))
        timings["pulumi up"] = time.monotonic() - t0
        for name in NODES:
            _node_manager(kube, name)
        yield Deckhouse(cp, kube, nodes, project, images.probe_ref, timings)
    finally:
        print("\nDeckhouse real node timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        if project is not None:
            project.pulumi("destroy", "--yes", "--skip-preview", timeout=900, check=False)
        for name in nodes:
            remove_node(cp.directory, name, kube)
        BPF_JIT_HARDEN.write_text(bpf_jit_harden)


def _scripts(kube: Kube, node_group: str) -> list[tuple[int, str, str]]:
    """The NodeGroupConfiguration scripts bashible runs on the NodeGroup's nodes, in its order."""
    return sorted((o["spec"]["weight"], o["metadata"]["name"], o["spec"]["content"])
                  for o in kube.list("deckhouse.io/v1alpha1", "NodeGroupConfiguration")
                  if node_group in o["spec"]["nodeGroups"] or "*" in o["spec"]["nodeGroups"])


def _bashible(d: Deckhouse, name: str) -> list[str]:
    """One bashible run on the node: every script of its NodeGroup (each must succeed, as bashible stops at the
    first that fails), then its containerd step: containerd restarted when a ``conf2.d`` drop-in changed."""
    node = d.nodes[name]
    before = _in_node(node, "cat /etc/containerd/conf2.d/*.toml 2>/dev/null || true").stdout
    ran = []
    for _, script, content in _scripts(d.kube, NODES[name]):
        done = _in_node(node, content, env={"NODE_NAME": name})
        assert done.returncode == 0, f"{script} on {name}: {done.stdout}\n{done.stderr}"
        ran.append(script)
    if _in_node(node, "cat /etc/containerd/conf2.d/*.toml 2>/dev/null || true").stdout != before:
        node.restart("containerd")
    return ran


def _pods_on(kube: Kube, node: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.list("v1", "Pod", NS) if p["spec"].get("nodeName") == node}


def test_bashible_runs_the_scripts_and_the_gate_opens(deckhouse: Deckhouse) -> None:
    """The group's scripts pass on a real node; the drop-in they write is in the running containerd's
    configuration; the gate label is the scripts' own, set with the node's credentials; and then the stack's
    DaemonSets start their pods there."""
    d = deckhouse
    for name in NODES:
        assert GATE not in d.kube.get("v1", "Node", name)["metadata"]["labels"]
        t0 = time.monotonic()
        ran = _bashible(d, name)
        d.timings[f"bashible on {name}"] = time.monotonic() - t0
        assert any("gpu-check" in s for s in ran) and any("gpu-runtime" in s for s in ran), ran
        node = d.nodes[name]
        dropin = _in_node(node, "head -n1 /etc/containerd/conf2.d/nvidia-gpu.toml").stdout
        assert dropin.startswith("# Managed by nvidia-gpu"), dropin
        config = crictl_info(node)["config"]
        runtimes = config["containerd"]["runtimes"]
        assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime", runtimes
        assert config["containerd"]["defaultRuntimeName"] == "nvidia" and config["enableCDI"] is True
        assert d.kube.get("v1", "Node", name)["metadata"]["labels"].get(GATE) == "", name
    for name, want in ((DP_NODE, {"device-plugin-h100", "gpu-labeller-h100"}),
                       (DRA_NODE, {"dra-kubelet-plugin-h100-dra", "gpu-labeller-h100-dra"})):
        pods = wait_until(lambda n=name, w=want: (p := _pods_on(d.kube, n))
                          and w <= {k.rsplit("-", 1)[0] for k, v in p.items() if pod_ready(v)} and p,
                          f"the stack's pods Running on {name}", timeout=240)
        assert not any(k.startswith("gpu-setup") for k in pods), sorted(pods)  # setup is bashible's here


def test_the_device_plugin_serves_a_workload_its_two_gpus(deckhouse: Deckhouse) -> None:
    d = deckhouse
    wait_until(lambda: d.kube.get("v1", "Node", DP_NODE)["status"]["allocatable"].get("nvidia.com/gpu") == "8",
               "8 nvidia.com/gpu allocatable")
    pod = probe_pod("dkp-probe", d.probe_ref, None)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": DP_NODE}
    d.kube.create(pod)
    try:
        running = running_pod(d.kube, "dkp-probe")
        allocated = wait_until(lambda: allocated_devices(d.nodes[DP_NODE], running["metadata"]["uid"]),
                               "the pod in the kubelet's checkpoint")
        seen = json.loads(kubectl(d.cp, "exec", "dkp-probe", "--", "gpu-probe"))
        assert {g["uuid"] for g in seen["gpus"]} == allocated and len(allocated) == 2, (seen, allocated)
        labels = wait_until(lambda: (n := d.kube.get("v1", "Node", DP_NODE)["metadata"]["labels"])
                            .get("nvidia.com/gpu.count") and n, "the labeller's labels", timeout=180)
        assert labels["nvidia.com/gpu.count"] == "8" and labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    finally:
        d.kube.delete("v1", "Pod", "dkp-probe", "default", gracePeriodSeconds="0")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", "dkp-probe", "default") is None, "the pod gone", timeout=60)


def test_dra_prepares_a_claim_whose_cdi_spec_containerd_applies(deckhouse: Deckhouse) -> None:
    """The scheduler allocates a claim from the DRA node's slices, the kubelet has our plugin prepare it, and the
    claim's CDI spec names the driver's files under the node's driver root and the toolkit's hook; the probe
    sees exactly the claimed GPU."""
    d = deckhouse
    wait_until(lambda: any(s["spec"]["pool"]["name"] == DRA_NODE for s in d.kube.list("resource.k8s.io/v1",
                                                                                       "ResourceSlice")),
               "the DRA node's slices")
    d.kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "dkp-gpu", "namespace": "default"},
                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
    d.kube.create(claim_probe_pod("dkp-claim", d.probe_ref, "dkp-gpu"))
    try:
        running_pod(d.kube, "dkp-claim")
        claim = d.kube.get("resource.k8s.io/v1", "ResourceClaim", "dkp-gpu", "default")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (DRIVER, DRA_NODE), result
        device = next(dev for s in d.kube.list("resource.k8s.io/v1", "ResourceSlice")
                      if s["spec"]["pool"]["name"] == DRA_NODE for dev in s["spec"]["devices"]
                      if dev["name"] == result["device"])
        seen = json.loads(kubectl(d.cp, "exec", "dkp-claim", "--", "gpu-probe"))
        assert [g["uuid"] for g in seen["gpus"]] == [device["attributes"]["uuid"]["string"]], seen
        uid = claim["metadata"]["uid"]
        spec = json.loads((d.nodes[DRA_NODE].directory / f"root/run/cdi/k8s.{DRIVER}-claim_{uid}.json").read_text())
        edits = spec["containerEdits"]
        mounted = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        lib = "/usr/lib/x86_64-linux-gnu"
        for library in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so"):
            assert mounted[f"{lib}/{library}.{VERSION}"] == f"{lib}/{library}.{VERSION}", sorted(mounted)
        assert mounted["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
        # The GSP firmware where the node has it (its /lib is /usr/lib, merged as on current distributions).
        assert f"/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in mounted, sorted(mounted)
        hooks = edits["hooks"]
        assert {h["path"] for h in hooks} == {"/usr/bin/nvidia-cdi-hook"}, hooks  # cluster.cdiHookPath
        assert [h["args"][1] for h in hooks] == ["create-symlinks", "update-ldcache"], hooks
        assert {n["path"] for n in edits["deviceNodes"]} >= {"/dev/nvidiactl"}, edits["deviceNodes"]
    finally:
        d.kube.delete("v1", "Pod", "dkp-claim", "default", gracePeriodSeconds="0")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", "dkp-claim", "default") is None, "the pod gone",
                   timeout=60)
        d.kube.delete("resource.k8s.io/v1", "ResourceClaim", "dkp-gpu", "default")
    wait_until(lambda: not list((d.nodes[DRA_NODE].directory / "root/run/cdi").glob("*claim*")),
               "the claim's CDI spec removed", timeout=60)


def test_destroy_withdraws_the_dra_pool_before_the_plugin_goes(deckhouse: Deckhouse) -> None:
    """Last: ``pulumi destroy`` with the DRA plugin's pod publishing its node's pool (this was
    ``test_pulumi_engine.py``'s plugin process on a kwok node): the uninstall marker goes first, the plugin
    withdraws the pool and releases the marker, and only then its RBAC and DaemonSet go; nothing of the stack is
    left, and no ResourceSlice."""
    d = deckhouse
    assert any(s["spec"]["pool"]["name"] == DRA_NODE for s in d.kube.list("resource.k8s.io/v1", "ResourceSlice"))
    d.project.pulumi("destroy", "--yes", "--skip-preview", timeout=900)
    wait_until(lambda: d.kube.get_or_none("v1", "Namespace", NS) is None, "the stack's namespace gone", timeout=120)
    assert not d.kube.list("resource.k8s.io/v1", "ResourceSlice")
    assert not d.kube.list("deckhouse.io/v1alpha1", "NodeGroupConfiguration")
