"""The stack for real on a real GPU node (issue 35): ``pulumi up`` of a ``nodeSetup: daemonset`` stack (the real
CLI and provider) onto the local control plane with one node running the real kubelet, containerd and runc
(``localcluster.node``, ``--machine dgx-h100``: NVIDIA's go-nvml model of the machine as the driver's NVML),
the agent image built as an air-gapped site builds it and referenced by digest, and no stand-in anywhere:

Four GPU nodes, one per node group: ``gpu1`` (the device plugin), ``gpu2`` (DRA), ``gpu3`` (MIG, cut by the
MIG manager's pod) and ``gpu4`` (DRA over MIG devices), and ``cpu1``, a node without GPUs where the cluster's own
pods run (the eviction guard).

1. the setup pod configures the node's containerd through ``runtime apply`` and the node's ``systemctl``
   (containerd restarts and runs with the ``nvidia`` runtime and CDI: ``crictl info``), checks the node and
   opens the gate, and the other DaemonSets' pods start on it;
2. the device plugin registers with the kubelet, which then offers the machine's eight GPUs;
3. the labeller labels the Node from what NVML and sysfs show its container, as GPU feature discovery would;
4. a workload asking for ``nvidia.com/gpu: 2`` (with and without ``runtimeClassName: nvidia``) runs through the
   NVIDIA runtime, and its probe (``tests/cluster/gpu_probe.c``: libcuda and NVML by soname, the GPUs NVML shows,
   what ``nvidia-smi -L`` lists) sees exactly the two GPUs the kubelet allocated to it, read back from the
   kubelet's own checkpoint; ``kubectl exec`` runs the probe again in the running pod;
5. DRA, the seed article's steps with ``kubectl``: the ResourceSlice and DeviceClass are there, the article's
   claim (selecting ``memory >= 16000`` MiB, with ``ExactCount``) is allocated by the real scheduler, the real
   kubelet's DRA manager has our plugin prepare it, containerd applies the claim's CDI spec, and the probe
   sees exactly the claimed GPU; deleting the pod and claim unprepares it (the spec file goes); NVIDIA's
   quickstart demos run too (a claim per pod from a template, one claim shared by two pods), each probe seeing
   exactly its claim's GPU;
   the exporter on each node attributes the workload's GPUs to its pod through the kubelet's PodResources API;
   on ``gpu4``, cut into MIG devices by the MIG manager's pod, a ``mig.nvidia.com`` claim's probe lists exactly
   its MIG device;
6. MIG: the MIG manager's pod applies the group's layout (``all-1g.10gb``) through the node's NVML, the device
   plugin offers the MIG devices, a workload gets exactly one (its GPU and its two capability nodes), the
   agents that hold CAP_SYS_ADMIN for the monitor capability cannot change MIG with it, and a day-two layout
   change drains a running workload through the Eviction API (a PodDisruptionBudget holds it until removed);
7. faults: kubelet and containerd restarts, a deleted agent pod, an API-server restart under the agents' pods
   (none restarts, the DRA pool is not rewritten), the kubelet SIGKILLed at admission, a reboot of the GPU nodes;
8. ``pulumi destroy`` gives the nodes back.

The time from ``pulumi up`` to the first GPU pod Running is printed (``-s``). Needs root, buildah, debootstrap,
gcc and the Python package index the image build installs from (as ``tests/image``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane, Kube
from localcluster.node import Node, add_node, mock_gpu_uuid, mock_mig_uuid, remove_node, wait_ready
from tests.cluster.pulumi_project import Project
from tests.cluster.realnode import (
    allocated_devices,
    allocation_answer,
    build_images,
    checkpointed,
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
NODE = "gpu1"
DRA_NODE = "gpu2"
MIG_NODE = "gpu3"
DRA_MIG_NODE = "gpu4"
CPU_NODE = "cpu1"
MOCK = "dgxh100"  #: the machine's go-nvml model (``localcluster.node.MACHINES["dgx-h100"]``)
NS = "nvidia-gpu"
POOL = "example.com/gpu-pool"
GATE = "node.deckhouse.io/gpu-setup-complete"


def _config(agent_digest: str) -> dict[str, Any]:
    """A plain cluster's stack (prod-like): node setup by DaemonSet, two H100 groups picked by a label, one
    served by the device plugin and one by DRA."""
    return {"config": {
        "nvidia-gpu:cluster": {
            "kubernetesVersion": "1.34", "namespace": NS, "allocationMode": "devicePlugin",
            "nodeSetup": "daemonset",
            "agentImage": {"repository": "localhost/nvidia-gpu-agent", "digest": agent_digest, "pullPolicy": "Never"},
            "monitoring": {"enabled": True, "exporter": "agent", "scrape": "annotations"}, "kubeContext": "prod",
            "dra": {"driverName": "gpu.nvidia.com"}},
        "nvidia-gpu:nodeGroups": [
            {"name": "h100", "nodeSelector": {"matchLabels": {POOL: "h100"}},
             "gpu": {"model": "H100-80GB", "driverVersion": "550.54.15", "sharing": "Exclusive"}},
            {"name": "h100-dra", "allocationMode": "dra", "nodeSelector": {"matchLabels": {POOL: "dra"}},
             "gpu": {"model": "H100-80GB", "driverVersion": "550.54.15", "sharing": "Exclusive"}},
            {"name": "h100-mig", "nodeSelector": {"matchLabels": {POOL: "mig"}},
             "gpu": {"model": "H100-80GB", "driverVersion": "550.54.15", "sharing": "MIG",
                     "mig": {"partedConfig": "all-1g.10gb", "strategy": "mixed"}}},
            {"name": "h100-dra-mig", "allocationMode": "dra", "nodeSelector": {"matchLabels": {POOL: "dra-mig"}},
             "gpu": {"model": "H100-80GB", "driverVersion": "550.54.15", "sharing": "MIG",
                     "mig": {"partedConfig": "all-1g.10gb"}}}]}}


@dataclass
class Deployed:
    cp: ControlPlane
    kube: Kube
    node: Node
    dra_node: Node
    mig_node: Node
    dra_mig_node: Node
    project: Project
    probe_ref: str
    up_started: float
    timings: dict[str, float] = field(default_factory=dict)


def _pods(kube: Kube) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.list("v1", "Pod", NS)}


def _on(kube: Kube, component: str, node: str) -> dict[str, dict[str, Any]]:
    """The stack's pods of ``component`` (``device-plugin``, ``gpu-setup``...) on ``node``, by name."""
    return {n: p for n, p in _pods(kube).items()
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
            and p["spec"].get("nodeName") == node}


@pytest.fixture(scope="module")
def deployed(real_cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    cp = real_cluster
    assert cp.bin_dir is not None
    kube = cp.admin()
    work = tmp_path_factory.mktemp("real-node-stack")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    images = build_images(work)
    timings["images"] = time.monotonic() - t0
    t0 = time.monotonic()
    node = add_node(cp.directory, NODE, cp.bin_dir, kube, images=images.archives, machine="dgx-h100")
    timings["node Ready"] = time.monotonic() - t0
    project: Project | None = None
    try:
        dra_node = add_node(cp.directory, DRA_NODE, cp.bin_dir, kube, images=images.archives, machine="dgx-h100")
        mig_node = add_node(cp.directory, MIG_NODE, cp.bin_dir, kube, images=images.archives, machine="dgx-h100")
        dra_mig_node = add_node(cp.directory, DRA_MIG_NODE, cp.bin_dir, kube, images=images.archives,
                                machine="dgx-h100")
        add_node(cp.directory, CPU_NODE, cp.bin_dir, kube, images=images.archives[:1])
        for name, pool in ((NODE, "h100"), (DRA_NODE, "dra"), (MIG_NODE, "mig"), (DRA_MIG_NODE, "dra-mig")):
            kube.patch("v1", "Node", name, {"metadata": {"labels": {POOL: pool}}})
        up_started = time.monotonic()
        project = stack_up(cp, work, "prod", _config(images.agent_digest))
        timings["pulumi up"] = time.monotonic() - up_started
        yield Deployed(cp, kube, node, dra_node, mig_node, dra_mig_node, project,
                       images.probe_ref, up_started, timings)
    finally:
        print("\nreal node stack timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        if project is not None:
            project.pulumi("destroy", "--yes", "--skip-preview", timeout=900, check=False)
        for name in (NODE, DRA_NODE, MIG_NODE, DRA_MIG_NODE, CPU_NODE):
            remove_node(cp.directory, name, kube)


def test_setup_configures_the_nodes_containerd_and_opens_the_gate(deployed: Deployed) -> None:
    d = deployed
    pods = wait_until(lambda: (p := _pods(d.kube)) and all(pod_ready(p[n]) for n in p) and len(p) >= 12 and p,
                      "agent pods Running", timeout=240)
    on_node = sorted(n.rsplit("-", 1)[0] for n, p in pods.items() if p["spec"].get("nodeName") == NODE)
    assert {"gpu-setup-h100", "device-plugin-h100", "gpu-labeller-h100"} <= set(on_node), on_node
    on_dra = sorted(n.rsplit("-", 1)[0] for n, p in pods.items() if p["spec"].get("nodeName") == DRA_NODE)
    assert {"gpu-setup-h100-dra", "dra-kubelet-plugin-h100-dra", "gpu-labeller-h100-dra"} <= set(on_dra), on_dra
    # runtime apply restarted containerd through the node's systemctl (the supervisor's second start) ...
    starts = json.loads((d.node.directory / "supervisor.json").read_text())["containerd"]["starts"]
    assert starts >= 2, starts
    # ... and the running containerd loaded the drop-in: the nvidia runtime, default, and CDI.
    config = crictl_info(d.node)["config"]
    runtimes = config["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime", runtimes
    assert config["containerd"]["defaultRuntimeName"] == "nvidia"
    assert config["enableCDI"] is True
    labels = d.kube.get("v1", "Node", NODE)["metadata"]["labels"]
    assert labels[GATE] == "" and labels["gpu.nvidia-gpu.io/check"] == "ok", labels
    # The check's record on the node (its log may miss lines: containerd, which writes container logs,
    # restarted while the setup container ran).
    verdict = (d.node.directory / "root/var/lib/nvidia-gpu-agent/check.verdict").read_text()
    assert verdict == "verdict=ok\nreasons=\ndriver=550.54.15\n", verdict


def test_the_device_plugin_registers_with_the_real_kubelet(deployed: Deployed) -> None:
    d = deployed
    allocatable = wait_until(lambda: d.kube.get("v1", "Node", NODE)["status"]["allocatable"].get("nvidia.com/gpu"),
                             "nvidia.com/gpu allocatable")
    assert allocatable == "8"
    described = kubectl(d.cp, "describe", "node", NODE)
    assert "nvidia.com/gpu:" in described


def test_the_labels_match_the_machine(deployed: Deployed) -> None:
    d = deployed
    labels = wait_until(lambda: (n := d.kube.get("v1", "Node", NODE)["metadata"]["labels"]).get("nvidia.com/gpu.count")
                        and n, "the labeller's GPU labels", timeout=180)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.machine"] == "DGXH100"
    assert labels["nvidia.com/cuda.driver-version.full"] == "550.54.15"
    assert labels["gpu.nvidia-gpu.io/node-group"] == "h100"
    taints = d.kube.get("v1", "Node", NODE)["spec"].get("taints") or []
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints


def _holders(d: Deployed, node: str) -> dict[str, str]:
    """GPU UUID -> the pod the node's exporter says holds it (``nvidia_gpu_device_holder``), read in the
    exporter's own container (the pod network is inside the node)."""
    (exporter,) = [n for n, p in _pods(d.kube).items()
                   if n.startswith("gpu-exporter-") and p["spec"].get("nodeName") == node]
    text = kubectl(d.cp, "-n", NS, "exec", exporter, "--", "python", "-c",
                   "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9400/metrics').read()"
                   ".decode())")
    out = {}
    for line in text.splitlines():
        if line.startswith("nvidia_gpu_device_holder{") and line.endswith(" 1"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.rindex("}")].split('",'))
            out[labels["device_uuid"].strip('"')] = labels["pod"].strip('"')
    return out


@pytest.mark.parametrize("runtime_class", [None, "nvidia"])
def test_a_workload_sees_exactly_its_two_gpus(deployed: Deployed, runtime_class: str | None) -> None:
    d = deployed
    name = f"probe-{runtime_class or 'default'}"
    d.kube.create(probe_pod(name, d.probe_ref, runtime_class, node=NODE))
    try:
        pod = running_pod(d.kube, name)
        d.timings.setdefault("pulumi up -> first GPU pod Running", time.monotonic() - d.up_started)
        # The checkpoint can trail the pod's Running by a moment: wait for the pod's entry.
        allocated = wait_until(lambda: allocated_devices(d.node, pod["metadata"]["uid"]),
                               f"{name} in the kubelet's checkpoint")
        assert len(allocated) == 2, allocated
        logs = wait_until(lambda: kubectl(d.cp, "logs", name, check=False).strip(), "the probe's output")
        seen = json.loads(logs.splitlines()[0])
        assert seen["libcuda"] and seen["libnvidia_ml"] and seen["nvml_init"] == 0, seen
        assert seen["ld_cache_libcuda"] and seen["dev_nvidiactl"], seen
        assert seen["device_count"] == 2, seen
        assert {g["uuid"] for g in seen["gpus"]} == allocated, (seen, allocated)
        # The seed article's check: exec in the running pod lists exactly the allocated GPUs.
        again = json.loads(kubectl(d.cp, "exec", name, "--", "gpu-probe"))
        assert {g["uuid"] for g in again["gpus"]} == allocated
        holders = wait_until(lambda: (h := _holders(d, NODE)) and allocated <= set(h) and h, "the exporter's holders")
        assert {u for u, pod_name in holders.items() if pod_name == name} == allocated, holders
        # The allocation's answer came from our plugin (the volume-mounts device list) through the real
        # kubelet: the checkpoint keeps the AllocateResponse it got.
        answer = allocation_answer(d.node, pod["metadata"]["uid"])
        assert all(f"/var/run/nvidia-container-devices/{uuid}".encode() in answer for uuid in allocated)
    finally:
        d.kube.delete("v1", "Pod", name, "default", gracePeriodSeconds="0")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", name, "default") is None, f"pod {name} gone", timeout=60)


ARTICLE_CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: gpu-16g
  namespace: default
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        allocationMode: ExactCount
        count: 1
        selectors:
        - cel:
            expression: "device.attributes['gpu.nvidia.com'].memory >= 16000"
---
apiVersion: v1
kind: Pod
metadata:
  name: dra-probe
  namespace: default
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  tolerations:
  - key: nvidia.com/gpu
    operator: Exists
  resourceClaims:
  - name: gpu
    resourceClaimName: gpu-16g
  containers:
  - name: probe
    image: PROBE
    imagePullPolicy: Never
    command: ["sh", "-c", "gpu-probe && exec sleep 3600"]
    resources:
      claims:
      - name: gpu
"""


def _apply_article_claim(d: Deployed, tmp_path: Path) -> Path:
    """The article's claim and its pod, applied with ``kubectl apply -f``; answers the manifest's path."""
    manifest = tmp_path / "claim.yaml"
    manifest.write_text(ARTICLE_CLAIM.replace("PROBE", d.probe_ref))
    kubectl(d.cp, "apply", "-f", str(manifest))
    return manifest


def _wait_claim_pod_running(d: Deployed) -> None:
    wait_until(lambda: d.kube.get("v1", "Pod", "dra-probe", "default")["status"].get("phase") == "Running",
               "the claim's pod Running")

def test_dra_the_seed_articles_steps_with_kubectl(deployed: Deployed, tmp_path: Path) -> None:
    d = deployed
    slices = wait_until(lambda: "gpu.nvidia.com" in (out := kubectl(d.cp, "get", "resourceslices")) and out,
                        "our ResourceSlice")
    assert DRA_NODE in slices, slices
    assert "gpu.nvidia.com" in kubectl(d.cp, "describe", "deviceclass", "gpu.nvidia.com")
    manifest = _apply_article_claim(d, tmp_path)
    try:
        _wait_claim_pod_running(d)
        claim = d.kube.get("resource.k8s.io/v1", "ResourceClaim", "gpu-16g", "default")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", DRA_NODE), result
        device = next(dev for s in d.kube.list("resource.k8s.io/v1", "ResourceSlice")
                      if s["spec"]["pool"]["name"] == DRA_NODE for dev in s["spec"]["devices"]
                      if dev["name"] == result["device"])
        assert device["attributes"]["memory"]["int"] >= 16000
        uuid = device["attributes"]["uuid"]["string"]
        seen = json.loads(wait_until(lambda: kubectl(d.cp, "logs", "dra-probe", check=False).strip(),
                                     "the probe's output").splitlines()[0])
        assert seen["device_count"] == 1 and [g["uuid"] for g in seen["gpus"]] == [uuid], (seen, uuid)
        assert [g["uuid"] for g in json.loads(kubectl(d.cp, "exec", "dra-probe", "--", "gpu-probe"))["gpus"]] == [uuid]
        holders = wait_until(lambda: (h := _holders(d, DRA_NODE)) and uuid in h and h,
                             "the DRA node exporter's holders")
        assert {u for u, pod_name in holders.items() if pod_name == "dra-probe"} == {uuid}, holders
        described = kubectl(d.cp, "describe", "resourceclaim", "gpu-16g")
        assert "dra-probe" in described and result["device"] in described, described
        specs = list((d.dra_node.directory / "root/run/cdi").glob("*claim*"))
        assert len(specs) == 1 and claim["metadata"]["uid"] in specs[0].name, specs
    finally:
        kubectl(d.cp, "delete", "-f", str(manifest), "--wait=true", "--timeout=60s", check=False)
    # Unprepared: the claim's CDI spec is gone from the node.
    wait_until(lambda: not list((d.dra_node.directory / "root/run/cdi").glob("*claim*")),
               "the claim's CDI spec removed",
               timeout=60)


#: NVIDIA's DRA quickstart manifests (``tests/nvidia_gpu/components/data``, copied unchanged) run on the DRA node
#: as published but for the image: theirs is ``ubuntu:22.04`` running ``nvidia-smi -L``, which the node cannot pull
#: (no registry) and whose ``nvidia-smi`` (NVIDIA's closed binary) no mock driver carries; the probe lists what it
#: would.
DEMO_DATA = REPO / "tests" / "nvidia_gpu" / "components" / "data"
DEMOS = {"gpu-test1": "nvidia-dra-demo-gpu-test1-claimtemplate.yaml",
         "gpu-test3": "nvidia-dra-demo-gpu-test3-shared-claim.yaml"}


def _demo_manifest(d: Deployed, demo: str, tmp_path: Path) -> Path:
    """NVIDIA's demo ``demo`` with each container's image and ``nvidia-smi -L`` replaced by the probe."""
    objects = [o for o in yaml.safe_load_all((DEMO_DATA / DEMOS[demo]).read_text()) if o]
    for obj in objects:
        if obj["kind"] != "Pod":
            continue
        for container in obj["spec"]["containers"]:
            assert container["image"] == "ubuntu:22.04" and container["args"][0].startswith("nvidia-smi -L;"), container
            container.update(image=d.probe_ref, imagePullPolicy="Never", command=["sh", "-c"],
                             args=[container["args"][0].replace("nvidia-smi -L;", "gpu-probe;", 1)])
    manifest = tmp_path / DEMOS[demo]
    manifest.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return manifest


def _claimed_uuid(d: Deployed, namespace: str, pod: str) -> tuple[str, str]:
    """The one device the pod's claim was allocated (claim UID, GPU UUID from our slice)."""
    status = d.kube.get("v1", "Pod", pod, namespace)
    ref = status["spec"]["resourceClaims"][0]
    name = ref.get("resourceClaimName") or next(
        s["resourceClaimName"] for s in status["status"]["resourceClaimStatuses"] if s["name"] == ref["name"])
    claim = d.kube.get("resource.k8s.io/v1", "ResourceClaim", name, namespace)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", DRA_NODE), result
    device = next(dev for s in d.kube.list("resource.k8s.io/v1", "ResourceSlice")
                  if s["spec"]["pool"]["name"] == DRA_NODE for dev in s["spec"]["devices"]
                  if dev["name"] == result["device"])
    return claim["metadata"]["uid"], device["attributes"]["uuid"]["string"]


def _probe_saw(d: Deployed, namespace: str, pod: str) -> list[str]:
    logs = wait_until(lambda: kubectl(d.cp, "-n", namespace, "logs", pod, check=False).strip(),
                      f"{namespace}/{pod}'s probe")
    return [g["uuid"] for g in json.loads(logs.splitlines()[0])["gpus"]]


def test_nvidias_dra_demos_run_and_see_their_claims(deployed: Deployed, tmp_path: Path) -> None:
    """NVIDIA's quickstart demos on the real DRA node, as the real scheduler and kubelet run them (this was the
    kubelet stand-in's job in ``test_dra_cluster.py``): ``gpu-test1``'s template gives each of its two pods a
    claim of its own and each probe sees exactly its own GPU, two distinct ones; ``gpu-test3``'s one shared
    claim is prepared once and both pods see the same GPU. Deleting the demos unprepares every claim."""
    d = deployed
    manifests = [_demo_manifest(d, demo, tmp_path) for demo in DEMOS]
    try:
        for manifest in manifests:
            kubectl(d.cp, "apply", "-f", str(manifest))
        for ns in DEMOS:
            for pod in ("pod1", "pod2"):
                wait_until(lambda ns=ns, pod=pod: d.kube.get("v1", "Pod", pod, ns)["status"].get("phase") == "Running",
                           f"{ns}/{pod} Running")
        own = {pod: _claimed_uuid(d, "gpu-test1", pod) for pod in ("pod1", "pod2")}
        assert own["pod1"][0] != own["pod2"][0] and own["pod1"][1] != own["pod2"][1], own
        for pod, (_, uuid) in own.items():
            assert _probe_saw(d, "gpu-test1", pod) == [uuid], (pod, uuid)
        shared = {pod: _claimed_uuid(d, "gpu-test3", pod) for pod in ("pod1", "pod2")}
        assert shared["pod1"] == shared["pod2"], shared
        for pod in ("pod1", "pod2"):
            assert _probe_saw(d, "gpu-test3", pod) == [shared["pod1"][1]], pod
        # One CDI spec per claim on the node: two from the template, one for the shared claim.
        specs = {p.name for p in (d.dra_node.directory / "root/run/cdi").glob("*claim*")}
        claims = {own["pod1"][0], own["pod2"][0], shared["pod1"][0]}
        assert len(specs) == 3 and all(any(uid in s for s in specs) for uid in claims), (specs, claims)
    finally:
        for manifest in manifests:
            kubectl(d.cp, "delete", "-f", str(manifest), "--wait=true", "--timeout=90s", check=False)
    wait_until(lambda: not list((d.dra_node.directory / "root/run/cdi").glob("*claim*")),
               "the demos' CDI specs removed",
               timeout=60)


MIG_SELECTOR = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
MIG_CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "mig-1g", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                 "deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": MIG_SELECTOR}}]}}]}}}


def _pool(d: Deployed, node: str) -> dict[str, dict[str, Any]]:
    """The devices of the node's ResourceSlices, by name."""
    return {dev["name"]: dev for s in d.kube.list("resource.k8s.io/v1", "ResourceSlice")
            if s["spec"]["pool"]["name"] == node for dev in s["spec"]["devices"]}


def test_dra_a_mig_claim_gets_exactly_its_mig_device(deployed: Deployed) -> None:
    """A DRA group cut into MIG devices (this was the kubelet stand-in's in ``test_dra_cluster.py``): the MIG
    manager's pod applies ``all-1g.10gb``, the DRA plugin offers the 56 MIG devices and no whole GPU, a claim for
    a ``1g.10gb`` through ``mig.nvidia.com`` is allocated one, and the pod's probe lists that one MIG device under
    its GPU: its CDI spec gives the container the GPU's node and the two capability nodes of its GPU and compute
    instance (``mig-minors``), and nothing else of the GPU's."""
    d = deployed
    offered = wait_until(lambda: (p := _pool(d, DRA_MIG_NODE)) and len(p) == 56 and p, "56 MIG devices offered",
                         timeout=300)
    assert {dev["attributes"]["type"]["string"] for dev in offered.values()} == {"mig"}, offered
    d.kube.create(MIG_CLAIM)
    d.kube.create(claim_probe_pod("dra-mig-probe", d.probe_ref, "mig-1g"))
    try:
        running_pod(d.kube, "dra-mig-probe")
        claim = d.kube.get("resource.k8s.io/v1", "ResourceClaim", "mig-1g", "default")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", DRA_MIG_NODE), result
        attributes = offered[result["device"]]["attributes"]
        uuid, parent = attributes["uuid"]["string"], attributes["parentUUID"]["string"]
        seen = json.loads(kubectl(d.cp, "exec", "dra-mig-probe", "--", "gpu-probe"))
        assert [(g["uuid"], g["mig"]) for g in seen["gpus"]] == [(parent, [uuid])], (seen, uuid)
        uid = claim["metadata"]["uid"]
        spec = json.loads((d.dra_mig_node.directory / f"root/run/cdi/k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
        nodes = [n["path"] for s in spec["devices"] for n in s["containerEdits"]["deviceNodes"]]
        gpu, gi, ci = _mig_device_of(d, uuid, d.dra_mig_node)
        assert mock_gpu_uuid(MOCK, gpu) == parent, (gpu, parent)
        minors = dict(line.rsplit(" ", 1) for line in d.dra_mig_node.mig_minors_file.read_text().splitlines())
        assert nodes == [f"/dev/nvidia{gpu}", f"/dev/nvidia-caps/nvidia-cap{minors[f'gpu{gpu}/gi{gi}/access']}",
                         f"/dev/nvidia-caps/nvidia-cap{minors[f'gpu{gpu}/gi{gi}/ci{ci}/access']}"], nodes
    finally:
        d.kube.delete("v1", "Pod", "dra-mig-probe", "default", gracePeriodSeconds="0")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", "dra-mig-probe", "default") is None, "the pod gone",
                   timeout=60)
        d.kube.delete("resource.k8s.io/v1", "ResourceClaim", "mig-1g", "default")
    wait_until(lambda: not list((d.dra_mig_node.directory / "root/run/cdi").glob("*claim*")),
               "the MIG claim's CDI spec removed", timeout=60)


def _gpu_pod_running(d: Deployed, name: str) -> tuple[dict[str, Any], set[str]]:
    """A long-running probe pod with two GPUs on the device-plugin node, and the GPUs its probe sees."""
    d.kube.create(probe_pod(name, d.probe_ref, None, node=NODE))
    try:
        pod = wait_until(lambda: (p := d.kube.get("v1", "Pod", name, "default"))["status"].get("phase") == "Running"
                         and p, f"pod {name} Running")
    except AssertionError as e:
        raise AssertionError(f"{e}: {d.kube.get('v1', 'Pod', name, 'default')['status']}\n"
                             f"{kubectl(d.cp, 'describe', 'pod', name, check=False)[-3000:]}") from e
    seen = {g["uuid"] for g in json.loads(kubectl(d.cp, "exec", name, "--", "gpu-probe"))["gpus"]}
    allocated = wait_until(lambda: allocated_devices(d.node, pod["metadata"]["uid"]),
                           f"{name} in the kubelet's checkpoint")
    assert seen == allocated and len(seen) == 2, (seen, allocated)
    return pod, seen


def _registered_again(d: Deployed, what: str) -> None:
    """The kubelet offers the eight GPUs again (a restarted kubelet offers none until the plugin registers)."""
    wait_until(lambda: d.kube.get("v1", "Node", NODE)["status"]["allocatable"].get("nvidia.com/gpu") == "8", what)


def _dra_claim_runs(d: Deployed, tmp_path: Path) -> None:
    manifest = _apply_article_claim(d, tmp_path)
    try:
        _wait_claim_pod_running(d)
        assert json.loads(kubectl(d.cp, "exec", "dra-probe", "--", "gpu-probe"))["device_count"] == 1
    finally:
        kubectl(d.cp, "delete", "-f", str(manifest), "--wait=true", "--timeout=60s", check=False)


@pytest.mark.parametrize("unit", ["kubelet", "containerd"])
def test_a_restart_keeps_running_pods_and_their_gpus(deployed: Deployed, unit: str, tmp_path: Path) -> None:
    """Restarting the kubelet or containerd (``systemctl restart``, the supervisor's): a running pod keeps its
    process and its two GPUs, the device plugin registers again with a new kubelet, and a DRA claim is
    prepared after it (the DRA plugin registered again too)."""
    d = deployed
    name = f"keeps-{unit}"
    pod, seen = _gpu_pod_running(d, name)
    try:
        for node in (d.node, d.dra_node):
            node.restart(unit)
        _registered_again(d, f"the device plugin registered after the {unit} restart")
        after = d.kube.get("v1", "Pod", name, "default")
        assert after["metadata"]["uid"] == pod["metadata"]["uid"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
        again = wait_until(lambda: kubectl(d.cp, "exec", name, "--", "gpu-probe", check=False),
                           "exec after the restart")
        assert {g["uuid"] for g in json.loads(again)["gpus"]} == seen
        # New allocations go through the plugins registered with the new kubelet: two GPUs other than the
        # running pod's, and a DRA claim.
        _, fresh = _gpu_pod_running(d, f"new-{unit}")
        assert not fresh & seen, (fresh, seen)
        _dra_claim_runs(d, tmp_path)
    finally:
        for pod_name in (name, f"new-{unit}"):
            d.kube.delete("v1", "Pod", pod_name, "default", gracePeriodSeconds="0")
        wait_until(lambda: not any(d.kube.get_or_none("v1", "Pod", n, "default") for n in (name, f"new-{unit}")),
                   "the test's pods gone", timeout=60)


def test_a_deleted_device_plugin_pod_comes_back_and_registers(deployed: Deployed) -> None:
    d = deployed
    (old,) = _on(d.kube, "device-plugin", NODE)
    d.kube.delete("v1", "Pod", old, NS)
    wait_until(lambda: [n for n, p in _on(d.kube, "device-plugin", NODE).items() if n != old and pod_ready(p)],
               "a new device plugin pod Running")
    _registered_again(d, "the new device plugin registered")
    _gpu_pod_running(d, "after-delete")  # allocated by the new plugin
    d.kube.delete("v1", "Pod", "after-delete", "default", gracePeriodSeconds="0")
    wait_until(lambda: d.kube.get_or_none("v1", "Pod", "after-delete", "default") is None, "pod gone", timeout=60)


#: What each strategy puts in the kubelet's checkpoint of the plugin's AllocateResponse.
STRATEGY_MARKS = {"cdi-cri": b"k8s.device-plugin.nvidia.com/gpu=", "cdi-annotations": b"cdi.k8s.io/",
                  "envvar": b"NVIDIA_VISIBLE_DEVICES"}


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations", "envvar"])
def test_each_device_list_strategy_as_a_day_two_change(deployed: Deployed, strategy: str) -> None:
    """The group's ``deviceListStrategy`` changed by ``pulumi up`` (volume-mounts before): the plugin answers the
    new way and the workload still sees exactly its two GPUs. ``envvar`` also needs the node's toolkit to honour
    the variable for unprivileged pods, which node setup writes: as the README says, existing nodes change when
    their ``gpu-setup`` pod runs again (its DaemonSet is ``OnDelete``), so the operator deletes it."""
    d = deployed
    config = yaml.safe_load(d.project.config_file().read_text())
    config["config"]["nvidia-gpu:nodeGroups"][0]["gpu"]["deviceListStrategy"] = strategy
    d.project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    d.project.pulumi("up", "--yes", "--skip-preview", timeout=900)
    if strategy == "envvar":
        (setup,) = _on(d.kube, "gpu-setup", NODE)
        plugins = set(_on(d.kube, "device-plugin", NODE))
        d.kube.delete("v1", "Pod", setup, NS)  # teardown closes the gate: the plugin goes, then comes back
        wait_until(lambda: any(n not in plugins and pod_ready(p) for n, p in _on(d.kube, "device-plugin",
                   NODE).items()),
                   "a new device plugin Running", timeout=240)
    name = f"strategy-{strategy}"
    deadline = time.monotonic() + 180
    while True:
        # A pod admitted while the plugin re-registers (it restarts its servers for a new config, and comes back
        # after node setup ran again) fails with UnexpectedAdmissionError, as on any node: create another.
        d.kube.create(probe_pod(name, d.probe_ref, None, node=NODE))
        pod = wait_until(lambda: (p := d.kube.get("v1", "Pod", name, "default"))["status"].get("phase")
                         in ("Running", "Failed") and p, f"pod {name} admitted")
        answer = allocation_answer(d.node, pod["metadata"]["uid"])
        allocated = allocated_devices(d.node, pod["metadata"]["uid"])
        seen = set()
        if pod["status"]["phase"] == "Running":
            seen = {g["uuid"] for g in json.loads(kubectl(d.cp, "exec", name, "--", "gpu-probe"))["gpus"]}
        d.kube.delete("v1", "Pod", name, "default", gracePeriodSeconds="0")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", name, "default") is None, f"pod {name} gone", timeout=60)
        if pod["status"]["phase"] == "Running" and STRATEGY_MARKS[strategy] in answer:
            break
        assert time.monotonic() < deadline, f"no allocation the new way: {pod['status']} {answer!r}"
        time.sleep(2)
    assert seen == allocated and len(seen) == 2, (seen, allocated)


MIG_RESOURCE = "nvidia.com/mig-1g.10gb"
#: What the seven-way layout offers: seven 1g.10gb devices on each of the eight GPUs.
MIG_DEVICES = 56


def _mig_settled(d: Deployed, config: str) -> dict[str, Any]:
    """The MIG node once the manager applied ``config`` (the state label ``success``, the node schedulable)."""
    def settled() -> dict[str, Any] | None:
        node = d.kube.get("v1", "Node", MIG_NODE)
        labels = node["metadata"]["labels"]
        ok = (labels.get("nvidia.com/mig.config") == config and labels.get("nvidia.com/mig.config.state") == "success"
              and not node["spec"].get("unschedulable"))
        return node if ok else None
    node: dict[str, Any] = wait_until(settled, f"MIG config {config} applied", timeout=300)
    return node


def _mig_pod(name: str, image: str, resource: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = probe_pod(name, image, None)
    pod["metadata"]["labels"] = labels or {}
    container = pod["spec"]["containers"][0]
    container["resources"] = {"limits": {resource: 1}}
    return pod


def _mig_device_of(d: Deployed, uuid: str, node: Node | None = None) -> tuple[int, int, int]:
    """(GPU index, GPU instance, compute instance) of the MIG device ``uuid``, from the MIG state of ``node`` (the
    MIG node unless said)."""
    node = node or d.mig_node
    state = json.loads(node.mig_state_file.read_text())
    for gpu in state["gpus"]:
        for gi in gpu["gpuInstances"]:
            for ci in gi["computeInstances"]:
                if mock_mig_uuid(MOCK, gpu["index"], gi["id"], ci["id"]) == uuid:
                    return gpu["index"], gi["id"], ci["id"]
    raise AssertionError(f"{uuid} is no MIG device of {node.name}: {state}")


def test_the_mig_manager_applies_the_layout_through_its_pod(deployed: Deployed) -> None:
    """The group's ``all-1g.10gb``: the MIG manager's pod set MIG mode and made seven instances on each GPU
    through the node's NVML (the machine's state, which every container on the node shares), recorded it on the
    Node, and the device plugin offers the MIG devices to the kubelet."""
    d = deployed
    _mig_settled(d, "all-1g.10gb")
    wait_until(lambda: d.kube.get("v1", "Node",
               MIG_NODE)["status"]["allocatable"].get(MIG_RESOURCE) == str(MIG_DEVICES),
               f"{MIG_DEVICES} {MIG_RESOURCE} allocatable", timeout=180)
    assert f"{MIG_RESOURCE}:" in kubectl(d.cp, "describe", "node", MIG_NODE)
    state = json.loads(d.mig_node.mig_state_file.read_text())
    assert [g["migMode"] for g in state["gpus"]] == [1] * 8, state
    assert {len(g["gpuInstances"]) for g in state["gpus"]} == {7}, state
    events = d.kube.list("v1", "Event", "default")
    assert any(e["reason"] == "MigReconfigured" and e["involvedObject"]["name"] == MIG_NODE
               and "all-1g.10gb" in e["message"] for e in events), [e["message"] for e in events]


def test_a_mig_workload_gets_exactly_its_mig_device(deployed: Deployed) -> None:
    """A pod asking for one ``mig-1g.10gb`` gets the MIG device the kubelet's checkpoint records: its GPU, and of
    the MIG capability nodes exactly the two of that GPU and compute instance (``mig-minors``); so NVML lists it
    that GPU with that one MIG device under it, as ``nvidia-smi -L`` in such a pod shows, not the GPU's six
    others."""
    d = deployed
    _mig_settled(d, "all-1g.10gb")
    name = "mig-probe"
    d.kube.create(_mig_pod(name, d.probe_ref, MIG_RESOURCE))
    try:
        pod = running_pod(d.kube, name)
        (uuid,) = wait_until(lambda: allocated_devices(d.mig_node, pod["metadata"]["uid"], MIG_RESOURCE),
                             f"{name} in the kubelet's checkpoint")
        gpu, gi, ci = _mig_device_of(d, uuid)
        seen = json.loads(kubectl(d.cp, "exec", name, "--", "gpu-probe"))
        assert [(g["uuid"], g["mig"]) for g in seen["gpus"]] == [(mock_gpu_uuid(MOCK, gpu), [uuid])], (seen, uuid)
        minors = dict(line.rsplit(" ", 1) for line in d.mig_node.mig_minors_file.read_text().splitlines())
        want = {f"nvidia-cap{minors[key]}" for key in (f"gpu{gpu}/gi{gi}/access", f"gpu{gpu}/gi{gi}/ci{ci}/access")}
        assert set(kubectl(d.cp, "exec", name, "--", "ls", "/dev/nvidia-caps").split()) == want
    finally:
        d.kube.delete("v1", "Pod", name, "default", gracePeriodSeconds="0")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", name, "default") is None, f"pod {name} gone", timeout=60)


SET_MIG_MODE = """
import json, sys, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
codes = []
for change in (lambda: pynvml.nvmlDeviceSetMigMode(h, 0),
               lambda: pynvml.nvmlGpuInstanceDestroy(pynvml.nvmlDeviceGetGpuInstanceById(h, int(sys.argv[1])))):
    try:
        change()
        codes.append(0)
    except pynvml.NVMLError as e:
        codes.append(e.value)
print(json.dumps(codes))
"""


@pytest.mark.parametrize("agent", ["device-plugin", "gpu-labeller", "gpu-exporter"])
def test_an_agent_cannot_change_mig_with_its_own_capabilities(deployed: Deployed, agent: str) -> None:
    """The device plugin, labeller and exporter hold CAP_SYS_ADMIN (the toolkit gives the MIG monitor capability
    only with it), which on a host would be every NVIDIA capability; in their containers the mig-config
    capability's node is absent, so NVML refuses a MIG mode change and destroying an instance
    (NVML_ERROR_NO_PERMISSION), and the node's MIG state is untouched."""
    d = deployed
    _mig_settled(d, "all-1g.10gb")
    before = d.mig_node.mig_state_file.read_text()
    gpu_instance = json.loads(before)["gpus"][0]["gpuInstances"][0]["id"]
    pods = wait_until(lambda: [n for n, p in _on(d.kube, agent, MIG_NODE).items() if pod_ready(p)],
                      f"the {agent} pod on {MIG_NODE} Running", timeout=120)
    pod = pods[0]
    codes = json.loads(kubectl(d.cp, "-n", NS, "exec", pod, "--", "python", "-c", SET_MIG_MODE, str(gpu_instance)))
    assert codes == [4, 4], codes  # NVML_ERROR_NO_PERMISSION, twice
    assert d.mig_node.mig_state_file.read_text() == before


def test_a_mig_change_drains_the_running_workload_through_eviction(deployed: Deployed) -> None:
    """A day-two ``pulumi up`` to ``all-2g.20gb`` with a MIG workload running: the manager cordons the node and
    evicts the workload through the Eviction API (the eviction guard's webhook, on the CPU node, admits it), so a
    PodDisruptionBudget holds the change until it goes; then the new layout is applied and offered."""
    d = deployed
    _mig_settled(d, "all-1g.10gb")
    name, selector = "mig-drained", {"app": "mig-drained"}
    d.kube.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}}})
    d.kube.create(_mig_pod(name, d.probe_ref, MIG_RESOURCE, selector))
    try:
        pod = running_pod(d.kube, name)
        config = yaml.safe_load(d.project.config_file().read_text())
        config["config"]["nvidia-gpu:nodeGroups"][2]["gpu"]["mig"]["partedConfig"] = "all-2g.20gb"
        d.project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
        t0 = time.monotonic()
        d.project.pulumi("up", "--yes", "--skip-preview", timeout=900)
        wait_until(lambda: d.kube.get("v1", "Node", MIG_NODE)["spec"].get("unschedulable"), "the node cordoned",
                   timeout=120)
        time.sleep(10)  # the manager retries the eviction; the budget keeps refusing it
        held = d.kube.get("v1", "Pod", name, "default")
        assert held["metadata"]["uid"] == pod["metadata"]["uid"] and "deletionTimestamp" not in held["metadata"]
        labels = d.kube.get("v1", "Node", MIG_NODE)["metadata"]["labels"]
        assert labels["nvidia.com/mig.config.state"] == "pending", labels
        d.kube.delete("policy/v1", "PodDisruptionBudget", name, "default")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", name, "default") is None, "the workload evicted",
                   timeout=120)
        node = _mig_settled(d, "all-2g.20gb")
        allocatable = wait_until(lambda: (a := d.kube.get("v1", "Node", MIG_NODE)["status"]["allocatable"])
                                 .get("nvidia.com/mig-2g.20gb") == "24" and a, "24 mig-2g.20gb allocatable",
                                      timeout=180)
        d.timings["MIG change (10 s held by the budget) -> new layout offered"] = time.monotonic() - t0
        assert allocatable.get(MIG_RESOURCE, "0") == "0", allocatable
        assert allocatable.get("nvidia.com/gpu", "0") == "0", allocatable  # mixed: every GPU is MIG-enabled
        assert not node["spec"].get("unschedulable")
        state = json.loads(d.mig_node.mig_state_file.read_text())
        assert {len(g["gpuInstances"]) for g in state["gpus"]} == {3}, state
    finally:
        for kind, api in (("Pod", "v1"), ("PodDisruptionBudget", "policy/v1")):
            if d.kube.get_or_none(api, kind, name, "default") is not None:
                d.kube.delete(api, kind, name, "default")


def _mig_offered(d: Deployed) -> dict[str, str]:
    """The MIG devices the MIG node offers, by resource (those with a count)."""
    allocatable = d.kube.get("v1", "Node", MIG_NODE)["status"]["allocatable"]
    return {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/mig-") and v != "0"}


def _mig_layout(d: Deployed) -> list[tuple[int, list[tuple[int, int]]]]:
    """Each GPU's MIG mode and its GPU instances' (profile, placement) from the MIG node's state."""
    state = json.loads(d.mig_node.mig_state_file.read_text())
    return [(g["migMode"], sorted((gi["profileId"], gi["placementStart"]) for gi in g["gpuInstances"]))
            for g in state["gpus"]]


def _all_gpus_free(d: Deployed) -> None:
    """A pod asking for all eight GPUs runs and sees them: no deleted pod still holds one (the kubelet drops a
    gone pod's devices from its checkpoint at the next allocation, not at the deletion)."""
    name = "all-eight"
    pod = probe_pod(name, d.probe_ref, None, node=NODE)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    d.kube.create(pod)
    try:
        wait_until(lambda: d.kube.get("v1", "Pod", name, "default")["status"].get("phase") == "Running",
                   f"pod {name} Running", timeout=120)
        seen = json.loads(kubectl(d.cp, "exec", name, "--", "gpu-probe"))
        assert seen["device_count"] == 8, seen
    finally:
        d.kube.delete("v1", "Pod", name, "default", gracePeriodSeconds="0")
        wait_until(lambda: d.kube.get_or_none("v1", "Pod", name, "default") is None, f"pod {name} gone", timeout=60)


def _slice_generation(d: Deployed) -> tuple[int, set[str]]:
    """The DRA node's pool: its generation and its devices."""
    slices = [s for s in d.kube.list("resource.k8s.io/v1", "ResourceSlice") if s["spec"]["pool"]["name"] == DRA_NODE]
    assert slices, "the DRA node's slices"
    return (max(s["spec"]["pool"]["generation"] for s in slices),
            {dev["name"] for s in slices for dev in s["spec"]["devices"]})


def _agent_restarts(d: Deployed) -> dict[str, int]:
    """Every stack pod's container restarts, by pod name (a pod replaced shows as another name)."""
    return {n: sum(s["restartCount"] for s in p["status"].get("containerStatuses") or [])
            for n, p in _pods(d.kube).items()}


def test_the_agents_ride_out_an_api_server_restart(deployed: Deployed, tmp_path: Path) -> None:
    """The API server stopped and started again (2 s down; the controller manager and scheduler restarted
    after it, as a control-plane node's kubelet would) under the agents' pods on real nodes (this was
    ``test_restart.py``'s DRA plugin on the kubelet stand-in): no agent container restarts or is replaced, the
    DRA pool is not written again (same generation, same devices), a running GPU pod keeps its GPUs, and new
    GPU pods and a DRA claim are served by the same agents afterwards."""
    d = deployed
    wait_until(lambda: all(pod_ready(p) for p in _pods(d.kube).values() if p["status"].get("phase") != "Succeeded"),
               "every stack pod Running and ready")
    restarts = _agent_restarts(d)
    generation = _slice_generation(d)
    pod, seen = _gpu_pod_running(d, "through-api-restart")
    try:
        down = d.cp.restart_apiserver(down_s=2)
        d.timings["API server down"] = down
        for node in (NODE, DRA_NODE, MIG_NODE):
            wait_ready(d.kube, node, timeout=120)
        again = wait_until(lambda: kubectl(d.cp, "exec", "through-api-restart", "--", "gpu-probe", check=False),
                           "exec after the API server restart")
        assert {g["uuid"] for g in json.loads(again)["gpus"]} == seen
        _, fresh = _gpu_pod_running(d, "after-api-restart")
        assert not fresh & seen, (fresh, seen)
        _dra_claim_runs(d, tmp_path)
        assert _slice_generation(d) == generation, "the DRA pool was written again after the restart"
        assert _agent_restarts(d) == restarts, "an agent's container restarted or its pod was replaced"
        assert d.kube.get("v1", "Pod", "through-api-restart", "default")["metadata"]["uid"] == pod["metadata"]["uid"]
    finally:
        for pod_name in ("through-api-restart", "after-api-restart"):
            d.kube.delete("v1", "Pod", pod_name, "default", gracePeriodSeconds="0")
        wait_until(lambda: not any(d.kube.get_or_none("v1", "Pod", n, "default")
                              for n in ("through-api-restart", "after-api-restart")),
              "the test's pods gone", timeout=60)


def test_a_kubelet_killed_mid_allocation_recovers(deployed: Deployed) -> None:
    """SIGKILL to the kubelet as soon as a GPU pod is bound (admission and the plugin's Allocate in flight): the
    node's service manager starts it again (``Restart=always``), the plugin registers again, and the pod either
    runs with two GPUs or, admitted while the plugin was not yet back, fails with UnexpectedAdmissionError (as on
    any node) and its replacement runs. No GPU is ever given to two pods, and once they are deleted all eight
    GPUs go to one pod."""
    d = deployed
    _, neighbour = _gpu_pod_running(d, "alloc-neighbour")
    name = "killed-mid-allocation"
    try:
        for attempt in range(3):
            d.kube.create(probe_pod(name, d.probe_ref, None, node=NODE))
            wait_until(lambda: d.kube.get("v1", "Pod", name, "default")["spec"].get("nodeName"), "the pod bound",
                       timeout=30)
            if attempt == 0:
                d.node.kill("kubelet")
            pod = wait_until(lambda: (p := d.kube.get("v1", "Pod", name, "default"))["status"].get("phase")
                             in ("Running", "Failed") and p, f"pod {name} admitted", timeout=180)
            if pod["status"]["phase"] == "Running":
                break
            assert pod["status"].get("reason") == "UnexpectedAdmissionError", pod["status"]
            d.kube.delete("v1", "Pod", name, "default", gracePeriodSeconds="0")
            wait_until(lambda: d.kube.get_or_none("v1", "Pod", name, "default") is None, f"pod {name} gone", timeout=60)
        assert pod["status"]["phase"] == "Running", pod["status"]
        seen = {g["uuid"] for g in json.loads(kubectl(d.cp, "exec", name, "--", "gpu-probe"))["gpus"]}
        assert seen == allocated_devices(d.node, pod["metadata"]["uid"]) and len(seen) == 2, seen
        assert not seen & neighbour, (seen, neighbour)
        held = checkpointed(d.node)
        assert sum(len(v) for v in held.values()) == len(set().union(*held.values())), held  # none twice
    finally:
        for pod_name in (name, "alloc-neighbour"):
            d.kube.delete("v1", "Pod", pod_name, "default", gracePeriodSeconds="0")
        wait_until(lambda: not any(d.kube.get_or_none("v1", "Pod", n, "default") for n in (name, "alloc-neighbour")),
                   "the test's pods gone", timeout=60)
    _all_gpus_free(d)


def test_a_reboot_brings_the_nodes_back_with_their_gpus(deployed: Deployed, tmp_path: Path) -> None:
    """Three GPU nodes rebooted, gpu1 to gpu3 (``Node.reboot``: every process killed, ``/run`` emptied, no driver
    device node in ``/dev``, the GPUs' MIG instances gone, a new boot ID) with a GPU pod and a DRA claim's pod running:
    each node comes back Ready on its new boot, node setup makes the device nodes again and the plugins offer
    the same GPUs, the MIG manager makes the lost instances again, the pods that ran end Failed (never
    restarted), deleting them and the claim leaves no CDI spec or checkpoint entry behind, and new pods get
    GPUs."""
    d = deployed
    _mig_settled(d, d.kube.get("v1", "Node", MIG_NODE)["metadata"]["labels"]["nvidia.com/mig.config"])
    _, before = _gpu_pod_running(d, "before-reboot")
    manifest = _apply_article_claim(d, tmp_path)
    _wait_claim_pod_running(d)
    layout = _mig_layout(d)
    offered = _mig_offered(d)
    t0 = time.monotonic()
    boots = {node.name: node.reboot() for node in (d.node, d.dra_node, d.mig_node)}
    for name, boot in boots.items():
        wait_ready(d.kube, name, timeout=180, boot_id=boot)
    d.timings["reboot -> 3 nodes Ready"] = time.monotonic() - t0
    _registered_again(d, "the device plugin registered after the reboot")
    d.timings["reboot -> 8 GPUs offered"] = time.monotonic() - t0
    for pod_name in ("before-reboot", "dra-probe"):
        wait_until(lambda n=pod_name: d.kube.get("v1", "Pod", n, "default")["status"].get("phase") == "Failed",
                   f"{pod_name} Failed after the reboot", timeout=180)
    d.kube.delete("v1", "Pod", "before-reboot", "default", gracePeriodSeconds="0")
    kubectl(d.cp, "delete", "-f", str(manifest), "--wait=true", "--timeout=60s")
    wait_until(lambda: not list((d.dra_node.directory / "root/run/cdi").glob("*claim*")),
               "no claim spec on the DRA node",
               timeout=60)
    _all_gpus_free(d)
    # MIG: the same layout again, made by the manager on the new boot.
    wait_until(lambda: _mig_layout(d) == layout and _mig_offered(d) == offered, "the MIG layout made and offered again",
               timeout=300)
    d.timings["reboot -> MIG layout offered again"] = time.monotonic() - t0
    _, after = _gpu_pod_running(d, "after-reboot")
    assert len(after) == 2 and after <= {mock_gpu_uuid(MOCK, i) for i in range(8)}, (before, after)
    d.kube.delete("v1", "Pod", "after-reboot", "default", gracePeriodSeconds="0")
    _dra_claim_runs(d, tmp_path)


def test_destroy_gives_the_node_back(deployed: Deployed) -> None:
    """Last: ``pulumi destroy`` runs the setup pod's teardown on the node, which takes the drop-in and its
    ``imports`` entry out and restarts containerd again, and the Node keeps none of the stack's labels."""
    d = deployed
    before = json.loads((d.node.directory / "supervisor.json").read_text())["containerd"]["starts"]
    d.project.pulumi("destroy", "--yes", "--skip-preview", timeout=900)
    for node in (d.node, d.dra_node):
        config = crictl_info(node)["config"]
        assert "nvidia" not in config["containerd"]["runtimes"], config["containerd"]["runtimes"]
        assert config["containerd"]["defaultRuntimeName"] == "runc"
        labels = d.kube.get("v1", "Node", node.name)["metadata"]["labels"]
        assert GATE not in labels and "nvidia.com/gpu.product" not in labels, labels
    assert json.loads((d.node.directory / "supervisor.json").read_text())["containerd"]["starts"] > before
    assert d.kube.get_or_none("v1", "Namespace", NS) is None

