"""A real node (issue 35): containerd and the kubelet from the tools cache joined to the loopback control plane
(``localcluster.node``), a pod scheduled onto it from an image imported with ``ctr`` and referenced by digest,
``kubectl logs`` and ``kubectl exec`` through the API server (egress selector -> netproxy -> the node's
netns), and a removal that leaves no process, mount, cgroup or file behind.

Needs root (namespaces, mounts, cgroups) and gcc (the pause image is compiled here); skipped without root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import ControlPlane, Kube
from localcluster.images import rootfs_archive
from localcluster.node import CGROUP_V1, Node, add_node, remove_node
from tests.tools import missing, required_bin

pytestmark = pytest.mark.cluster

NODE = "rn1"
#: A sleep no other process on the machine runs, to find the workload's process (or its absence).
SLEEP = "31337"
NODE_TOOLS = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "crictl", "runc", "kubectl", "cni")


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own: the session's holds the dev stack, whose DaemonSets would
    schedule onto a real node."""
    if os.geteuid() != 0:
        pytest.skip("a real node needs root (network/mount/UTS namespaces, mounts, cgroups)")
    bin_dir = required_bin(*NODE_TOOLS)
    if shutil.which("gcc") is None:
        missing("gcc is needed to build the pause image")
    cp = ControlPlane(directory=tmp_path_factory.mktemp("real-node"), bin_dir=bin_dir,
                      components=("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop(remove=False)  # removes any node a failed test left


def _kubectl(cp: ControlPlane, *args: str) -> str:
    assert cp.bin_dir is not None
    done = subprocess.run([str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _wait_running(kube: Kube, name: str, timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = kube.get("v1", "Pod", name, "default")
        if pod.get("status", {}).get("phase") == "Running":
            return pod
        time.sleep(0.5)
    raise AssertionError(f"pod {name} not Running after {timeout:.0f} s: {pod.get('status')}")


def _leftovers(node_dir: Path, cgroup_root: str) -> list[str]:
    """Whatever of the node the host still has: mounts, cgroups, processes, files."""
    left = [f"mount: {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(node_dir) in line]
    left += [f"cgroup: {h / cgroup_root}" for h in CGROUP_V1.iterdir() if (h / cgroup_root).exists()]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(node_dir) in cmdline or f"sleep {SLEEP}" in cmdline:
                left.append(f"process {proc.name}: {cmdline}")
    if node_dir.exists():
        left.append(f"directory: {node_dir}")
    return left


def test_real_node_runs_a_pod_and_leaves_nothing(real_cluster: ControlPlane) -> None:
    cp = real_cluster
    kube = cp.admin()
    assert cp.bin_dir is not None
    images = cp.directory / "images"
    tiny = images / "tiny.tar"
    rootfs_archive(tiny, "localhost/nvidia-gpu-test/tiny:1", ["sh", "cat", "sleep"])

    t0 = time.monotonic()
    node = add_node(cp.directory, NODE, cp.bin_dir, kube, images=[tiny])
    ready_s = time.monotonic() - t0
    print(f"\nnode {NODE} Ready {ready_s:.1f} s after add")
    assert node.directory == cp.directory / "nodes" / NODE
    info = kube.get("v1", "Node", NODE)["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://2."), info
    assert info["kubeletVersion"] == server_version_of(kube), info
    assert {a["address"] for a in kube.get("v1", "Node", NODE)["status"]["addresses"]} == {node.ip, NODE}

    # The import tagged the image REPO@DIGEST: the pod names it by digest, and nothing is ever pulled.
    refs = node.import_image(tiny)
    assert refs and refs[0].startswith("localhost/nvidia-gpu-test/tiny@sha256:"), refs
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tiny", "namespace": "default"},
                 "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "terminationGracePeriodSeconds": 1,
                          "containers": [{"name": "main", "image": refs[0], "imagePullPolicy": "Never",
                                          "command": ["sh", "-c", f"echo hello from $(cat /etc/hostname); "
                                                                  f"exec sleep {SLEEP}"]}]}})
    pod = _wait_running(kube, "tiny")
    assert pod["spec"]["nodeName"] == NODE
    assert pod["status"]["podIP"].startswith(node.pod_cidr.rsplit(".", 1)[0] + "."), pod["status"]
    assert pod["status"]["containerStatuses"][0]["imageID"].endswith(refs[0].split("@", 1)[1])

    # logs and exec: API server -> egress selector -> netproxy -> the kubelet inside the node's netns.
    deadline = time.monotonic() + 30
    while "hello from tiny" not in (logs := _kubectl(cp, "logs", "tiny")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "hello from tiny" in logs
    out = _kubectl(cp, "exec", "tiny", "--", "sh", "-c", "echo exec-ok; cat /proc/1/cmdline")
    assert out.startswith("exec-ok\n") and f"sleep\0{SLEEP}" in out, out

    # The workload runs under the node's own cgroup tree (kubepods below /nvgpu-NAME).
    assert any(f"sleep {SLEEP}" in line for line in _processes_under(node.cgroup_root)), "workload not in node cgroup"

    assert remove_node(cp.directory, NODE, kube)
    assert kube.get_or_none("v1", "Node", NODE) is None
    assert _leftovers(node.directory, node.cgroup_root) == []
    assert Node.all(cp.directory) == []
    kube.delete("v1", "Pod", "tiny", "default", gracePeriodSeconds="0")


def server_version_of(kube: Kube) -> str:
    return str(kube.request("GET", "/version")["gitVersion"])


def _processes_under(cgroup_root: str) -> list[str]:
    found = []
    pids = CGROUP_V1 / "pids" / cgroup_root
    for procs in pids.rglob("cgroup.procs") if pids.is_dir() else []:
        for pid in procs.read_text().split():
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return found
