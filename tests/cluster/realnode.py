"""What the real-node tests share (``localcluster.node``; the ``real_cluster`` fixture is in conftest)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import ControlPlane, Kube
from localcluster.images import agent_archive, local_ca_dir, probe_archive
from localcluster.node import Node
from tests.cluster.pulumi_project import Project, make_project
from tests.kit.tools import missing

REPO = Path(__file__).resolve().parents[2]
#: What a real node runs, from the tools cache.
NODE_TOOLS = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "crictl", "runc", "kubectl", "cni")


def kubectl(cp: ControlPlane, *args: str, check: bool = True) -> str:
    """``kubectl`` as a user runs it against ``cp``; its output (``""`` on failure when not ``check``)."""
    assert cp.bin_dir is not None
    done = subprocess.run([str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout if done.returncode == 0 else ""


def wait_until(predicate: Any, what: str, timeout: float = 120.0) -> Any:
    """``predicate()``'s first true answer, polled every half second; an AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout:.0f} s")
        time.sleep(0.5)


def running_pod(kube: Kube, name: str, namespace: str = "default", timeout: float = 120.0) -> dict[str, Any]:
    """The pod once it is Running."""
    pod: dict[str, Any] = wait_until(
        lambda: (p := kube.get("v1", "Pod", name, namespace))["status"].get("phase") == "Running" and p,
        f"pod {namespace}/{name} Running", timeout)
    return pod


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running, with every container ready."""
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return pod.get("status", {}).get("phase") == "Running" and bool(statuses) and all(s["ready"] for s in statuses)


def checkpoint_entries(node: Node) -> list[dict[str, Any]]:
    """The kubelet's device-manager checkpoint: one entry per pod, container and resource."""
    path = node.directory / "root/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    entries: list[dict[str, Any]] = json.loads(path.read_text())["Data"]["PodDeviceEntries"] or []
    return entries


def checkpointed(node: Node, resource: str = "nvidia.com/gpu") -> dict[str, set[str]]:
    """Pod UID -> the devices of ``resource`` the kubelet's checkpoint records for it."""
    out: dict[str, set[str]] = {}
    for e in checkpoint_entries(node):
        if e["ResourceName"] == resource:
            out.setdefault(e["PodUID"], set()).update(i for ids in e["DeviceIDs"].values() for i in ids)
    return out


def allocated_devices(node: Node, pod_uid: str, resource: str = "nvidia.com/gpu") -> set[str]:
    """The devices the kubelet allocated to the pod, from its own checkpoint."""
    return checkpointed(node, resource).get(pod_uid, set())


def allocation_answer(node: Node, pod_uid: str) -> bytes:
    """The plugins' AllocateResponses for the pod, as the kubelet's checkpoint keeps them."""
    return b"".join(base64.b64decode(e["AllocResp"]) for e in checkpoint_entries(node) if e["PodUID"] == pod_uid)


def probe_pod(name: str, image: str, runtime_class: str | None, node: str | None = None) -> dict[str, Any]:
    """A pod asking for two GPUs whose probe (``tests/cluster/gpu_probe.c``) prints what it sees, then sleeps;
    ``node``: pinned to that node (a test that reads one node's checkpoint must not let the scheduler pick
    another node offering ``nvidia.com/gpu``)."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{"name": "probe", "image": image, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "gpu-probe && exec sleep 3600"],
                        "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}



def claim_probe_pod(name: str, image: str, claim: str) -> dict[str, Any]:
    """The probe's pod with the ResourceClaim ``claim`` instead of device-plugin GPUs."""
    pod = probe_pod(name, image, None)
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod

@dataclass(frozen=True)
class Images:
    """The images a real node's tests import (no registry): the agent's, referenced by digest as a stack does,
    and the workload probe's."""

    archives: tuple[Path, ...]
    agent_digest: str
    probe_ref: str


def build_images(work: Path) -> Images:
    """The agent image built as an air-gapped site builds it (buildah from a debootstrap base) and the probe's
    image, as archives under ``work``. Needs buildah, debootstrap and gcc."""
    for tool in ("cc", "buildah", "debootstrap", "ldconfig"):
        if shutil.which(tool) is None:
            missing(f"{tool} is needed to build the node's images: apt-get install buildah debootstrap gcc")
    agent_digest = agent_archive(work / "agent.tar", "localhost/nvidia-gpu-agent:node-test",
                                 buildah_root=work / "buildah", ca_dir=local_ca_dir())
    probe_digest = probe_archive(work / "probe.tar", "localhost/nvidia-gpu-test/gpu-probe:1",
                                 REPO / "tests" / "cluster" / "gpu_probe.c")
    return Images((work / "agent.tar", work / "probe.tar"), agent_digest,
                  f"localhost/nvidia-gpu-test/gpu-probe@{probe_digest}")


def crictl_info(node: Node) -> dict[str, Any]:
    """``crictl info`` of the node's containerd once it answers (it may be restarting); its log's end if it
    never does."""

    def info() -> str:
        done = subprocess.run([*node.crictl(), "info"], capture_output=True, text=True, timeout=60, check=False)
        return done.stdout if done.returncode == 0 else ""

    try:
        answer: dict[str, Any] = json.loads(wait_until(info, f"containerd on {node.name} answering", timeout=60))
    except AssertionError as e:
        log = (node.directory / "logs" / "containerd.log").read_text(errors="replace")
        raise AssertionError(f"{e}\n{log[-3000:]}") from None
    return answer


def stack_up(cp: ControlPlane, work: Path, stack: str, config: dict[str, Any]) -> Project:
    """The project under ``work`` with ``config`` as stack ``stack``'s, initialised and brought up by the real CLI
    (``make_project``: the stack's committed ``kubeContext`` names the context that reaches ``cp``)."""
    project = make_project(cp, work, stack=stack)
    project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    project.pulumi("stack", "init", stack)
    project.pulumi("up", "--yes", "--skip-preview", timeout=900)
    return project
