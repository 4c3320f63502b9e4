"""The dev stack's agents on a GPU node laid out like a real one, each in a real container (the issue's
"done when"): the rendered DaemonSet's command, args, env, securityContext and volume mounts, run by the
pinned runc on a fake node whose driver is installed as the NVIDIA installer lays it out (real ELF
libraries with their sonames, ``ldconfig``'s links and cache, tools, GSP firmware) and whose NVML is
NVIDIA's mock library (go-nvml's DGX models) in the driver's own library directory. Nothing is put on
any library path: every container loads NVML from the driver root the DaemonSet mounts.

1. **Setup**: the group's NodeGroupConfiguration scripts, as Deckhouse's bashible runs them, against the
   node's root; the setup-complete label they ask ``kubectl`` for is then put on the Node (kwok's nodes
   have no kubelet credentials).
2. **Labels**: the labeller container patches its own Node through the API server with its pod's
   ServiceAccount token (RBAC and the stack's admission policies judge it).
3. **Device plugin** (the H100 node): registers with the kubelet stand-in on the node's device-plugins
   socket and answers Allocate.
4. **DRA** (the DRA group's node): publishes its pool, the real scheduler allocates a claim, the kubelet
   stand-in prepares it, and the CDI spec lists the driver's libraries and binaries under the node's
   driver root and the toolkit's hooks, and loads in the CDI library runtimes use.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster import Kube
from localcluster.objects import create_kwok_node, wait_for
from tests.cluster.agents import REPO, container_env, identity, node_labels, read_node
from tests.cluster.stack import AppliedStack
from tests.kit.driverinstall import install_driver
from tests.kit.fakehost import FakeHost
from tests.kit.kubelet.common import make_kubelet_dirs
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet
from tests.kit.kubelet.dra import DraKubelet
from tests.kit.mockhost import mock_host, probe_mock
from tests.oci import PodContainer, Runtime, ServiceAccountFiles
from tests.tools import MOCK_NVML, required_bin

NS = "nvidia-gpu"
VERSION = "550.54.15"  # the driver version go-nvml's mock machines report
SETUP = "node.deckhouse.io/gpu-setup-complete"
DRIVER = "gpu.nvidia.com"


@dataclass
class Node:
    name: str
    group: str  #: the stack's node group
    node_group: str  #: the Deckhouse NodeGroup
    mock: str  #: go-nvml mock machine
    root: Path
    gpus: int


#: key -> (Node, the stack's node group, its Deckhouse NodeGroup, go-nvml mock machine). The mock's H100 is
#: the one whose product name is a real model (its A100 is "Mock NVIDIA A100-SXM4-40GB", which the check
#: knows by its PCI device ID; its H200, "NVIDIA H200 141GB HBM3e" with an invented ID, it rightly refuses),
#: so the DRA group's node runs on it too, and only the H100 group's node goes through the setup scripts.
NODES = {"h100": ("e2e-h100", "h100-mig", "gpu-h100", "dgxh100"), "dra": ("e2e-dra", "h200-dra", "gpu-h200",
                                                                        "dgxh100")}


def _device_nodes(root: Path) -> None:
    """The node's /dev as character devices: the usual ones, and the GPUs' nodes the fake host laid out as
    plain files (numbers of /dev/null: nothing here opens them, runc only copies them)."""
    import os

    dev = root / "dev"
    wanted = {"null": (1, 3), "zero": (1, 5), "random": (1, 8), "urandom": (1, 9)}
    wanted |= {p.name: (1, 3) for p in dev.glob("nvidia*") if p.is_file()}
    for name, (major, minor) in wanted.items():
        (dev / name).unlink(missing_ok=True)
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(major, minor))


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    return Runtime.pinned(tmp_path_factory.mktemp("runc-state"))


@pytest.fixture(scope="module")
def nodes(kube: Kube, dev_stack: AppliedStack, runtime: Runtime,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Node]]:
    mock_bin = required_bin(MOCK_NVML)
    made: dict[str, Node] = {}
    try:
        for key, (name, group, node_group, mock) in NODES.items():
            # Unix socket paths are limited to 107 bytes: the node's root must be short, so not under tmp_path.
            root = Path(tempfile.mkdtemp(prefix=f"e2e-{key}-", dir="/tmp"))
            probe = probe_mock(mock_bin, mock, tmp_path_factory.mktemp(f"probe-{key}"))
            mock_host(root, probe)
            _device_nodes(root)
            make_kubelet_dirs(root)
            install_driver(root, VERSION, nvml_library=(mock_bin / MOCK_NVML).resolve())
            shutil.copy(runtime.hook, root / "usr/bin/nvidia-cdi-hook")  # the node's NVIDIA Container Toolkit
            template = dev_stack.object("NodeGroup", node_group)["spec"]["nodeTemplate"]
            create_kwok_node(kube, name, {"node.deckhouse.io/group": node_group, **template.get("labels", {})},
                             template.get("taints", []))
            made[key] = Node(name, group, node_group, mock, root, len(probe["gpus"]))
        yield made
    finally:
        for n in made.values():
            kube.delete("v1", "Node", n.name)
            shutil.rmtree(n.root, ignore_errors=True)


def _pod_spec(stack: AppliedStack, daemonset: str) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = stack.object("DaemonSet", daemonset)["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1 and not pod.get("initContainers"), daemonset
    return pod, pod["containers"][0]


def _config_maps(stack: AppliedStack) -> dict[str, dict[str, str]]:
    return {c["metadata"]["name"]: dict(c.get("data") or {}) for c in stack.of_kind("ConfigMap")}


def _container(kube: Kube, stack: AppliedStack, runtime: Runtime, node: Node, daemonset: str, *,
               work: Path) -> PodContainer:
    """The DaemonSet's container on ``node``, with the identity of the DaemonSet's pod there."""
    agent = identity(kube, daemonset, node.name, work / "identities")
    account = ServiceAccountFiles.from_kubeconfig(agent.kubeconfig, work / f"sa-{daemonset}", NS)
    pod, container = _pod_spec(stack, daemonset)
    env = container_env(container, node.name) | {"MOCK_NVML_MACHINE": node.mock}
    return PodContainer(runtime, work, node.root, pod, container, env=env, config_maps=_config_maps(stack),
                        service_account=account, repo=REPO)


def _while_running(container: PodContainer, probe: Any, what: str, timeout: float = 90.0) -> Any:
    """``wait_for(probe)``, failing at once (with the container's output) if the container exits."""

    def check() -> Any:
        if container.proc is not None and container.proc.poll() is not None:
            raise AssertionError(f"{container.name} exited {container.proc.returncode}:\n{container.output()}")
        return probe()

    try:
        return wait_for(check, timeout=timeout, interval=0.5, what=what)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{container.name}:\n{container.output()[-4000:]}") from None


def _node_scripts(stack: AppliedStack, node_group: str) -> list[tuple[int, str, str]]:
    scripts = [(o["spec"]["weight"], o["metadata"]["name"], o["spec"]["content"])
               for o in stack.of_kind("NodeGroupConfiguration") if node_group in o["spec"]["nodeGroups"]]
    return sorted(scripts)


def test_1_setup_scripts_pass_on_the_real_driver_layout(kube: Kube, dev_stack: AppliedStack,
                                                        nodes: dict[str, Node]) -> None:
    kube.patch("v1", "Node", nodes["dra"].name, {"metadata": {"labels": {SETUP: ""}}})  # see NODES
    for node in (nodes["h100"],):
        host = FakeHost(node.root)
        ran = []
        for _, name, content in _node_scripts(dev_stack, node.node_group):
            if "vfio" in name or "iommu" in name:
                continue  # passthrough binds GPUs away from NVML: not part of this node's GPU path
            done = subprocess.run(["bash", "-c", content], env=host.env(NODE_NAME=node.name,
                                                                         MOCK_NVML_MACHINE=node.mock),
                                  capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 0, f"{name} on {node.name}: {done.stdout}\n{done.stderr}"
            ran.append(name)
        assert any("gpu-check" in n for n in ran) and any("gpu-runtime" in n for n in ran), ran
        asked = [line for line in host.log("kubectl") if SETUP in line]
        assert asked and f"label node {node.name} --overwrite {SETUP}=" in asked[-1], host.log("kubectl")
        kube.patch("v1", "Node", node.name, {"metadata": {"labels": {SETUP: ""}}})  # what that kubectl does


def test_2_labeller_container_labels_its_node(kube: Kube, dev_stack: AppliedStack, runtime: Runtime,
                                              nodes: dict[str, Node], tmp_path: Path) -> None:
    node = nodes["h100"]
    labeller = _container(kube, dev_stack, runtime, node, f"gpu-labeller-{node.group}", work=tmp_path).start()
    try:
        labels = _while_running(labeller, lambda: (ls := node_labels(read_node(kube, node.name)))
                                .get("nvidia.com/gpu.count") and ls, what="the labeller's labels")
    finally:
        labeller.stop()
    output = labeller.output()
    assert labels["nvidia.com/gpu.count"] == str(node.gpus), output
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3", labels
    assert labels["nvidia.com/cuda.driver.major"] == "550", labels
    assert "Traceback" not in output, output


def test_3_device_plugin_container_registers_and_allocates(kube: Kube, dev_stack: AppliedStack, runtime: Runtime,
                                                           nodes: dict[str, Node], tmp_path: Path) -> None:
    node = nodes["h100"]
    kubelet = DevicePluginKubelet(node.root / "var/lib/kubelet/device-plugins")
    kubelet.start()
    plugin = _container(kube, dev_stack, runtime, node, f"device-plugin-{node.group}", work=tmp_path).start()
    try:
        _while_running(plugin, lambda: "nvidia.com/gpu" in kubelet.endpoints, what="the plugin's registration")
        ep = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == node.gpus, timeout=30)
        device = sorted(ep.devices)[0]
        answer = kubelet.allocate("nvidia.com/gpu", [device])
    finally:
        plugin.stop()
        kubelet.stop()
    # The dev stack's default device list: /dev/null mounts the toolkit reads (nvgpu.devicelist).
    response = answer.container_responses[0]
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices", plugin.output()
    assert [(m.container_path, m.host_path) for m in response.mounts] == [
        (f"/var/run/nvidia-container-devices/{device}", "/dev/null")], plugin.output()
    assert "Traceback" not in plugin.output(), plugin.output()


def test_4_dra_container_prepares_a_claim_with_a_complete_cdi_spec(kube: Kube, dev_stack: AppliedStack,
                                                                    runtime: Runtime, nodes: dict[str, Node],
                                                                    tmp_path: Path) -> None:
    node = nodes["dra"]
    plugin = _container(kube, dev_stack, runtime, node, f"dra-kubelet-plugin-{node.group}", work=tmp_path).start()
    kubelet = DraKubelet(node.root)
    ns = "e2e-dra"
    try:
        kubelet.register(timeout=90)
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        wait_for(lambda: kube.get_or_none("v1", "ServiceAccount", "default", ns), timeout=30, what="default SA")
        kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": "one-gpu", "namespace": ns},
                     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cuda", "namespace": ns},
                     "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name},
                              "tolerations": [{"operator": "Exists"}],
                              "containers": [{"name": "ctr", "image": "ubuntu:22.04", "command": ["sleep", "inf"],
                                              "resources": {"claims": [{"name": "gpu"}]}}],
                              "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}]}})
        claim = wait_for(lambda: (c := kube.get("resource.k8s.io/v1", "ResourceClaim", "one-gpu", ns))
                         .get("status", {}).get("allocation") and c, timeout=60, interval=0.3, what="allocation")
        uid = claim["metadata"]["uid"]
        answer = kubelet.prepare(DRIVER, [(ns, "one-gpu", uid)])
        result = answer.claims[uid]
        assert not result.error, f"{result.error}\n{plugin.output()}"
        spec_path = node.root / f"var/run/cdi/k8s.{DRIVER}-claim_{uid}.json"
        spec = json.loads(spec_path.read_text())
        listed = runtime.list_devices([node.root / "var/run/cdi"])
    finally:
        kubelet.close()
        plugin.stop()
        kube.delete("v1", "Namespace", ns)
        for s in kube.list("resource.k8s.io/v1", "ResourceSlice", fieldSelector=f"spec.nodeName={node.name}"):
            kube.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
    assert result.devices[0].cdi_device_ids[0] in listed
    edits = spec["containerEdits"]
    mounted = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu"
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so"):
        assert mounted[f"{lib}/{name}.{VERSION}"] == f"{lib}/{name}.{VERSION}", sorted(mounted)  # driverRoot /
    assert mounted["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in mounted
    hooks = edits["hooks"]
    assert {h["path"] for h in hooks} == {"/usr/bin/nvidia-cdi-hook"}  # cluster.cdiHookPath, seen in its mount
    assert [h["args"][1] for h in hooks] == ["create-symlinks", "update-ldcache"]
    assert {n["path"] for n in edits["deviceNodes"]} >= {"/dev/nvidiactl"}
    assert "Traceback" not in plugin.output(), plugin.output()
