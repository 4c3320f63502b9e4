"""A real node (issue 35): containerd and the kubelet from the tools cache joined to the loopback control plane
(``localcluster.node``), a pod scheduled onto it from an image imported with ``ctr`` and referenced by digest,
``kubectl logs`` and ``kubectl exec`` through the API server (egress selector -> netproxy -> the node's
netns), and a removal that leaves no process, mount, cgroup or file behind.

Needs root (namespaces, mounts, cgroups) and gcc (the pause image is compiled here); skipped without root.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from localcluster import ControlPlane, Kube
from localcluster.images import rootfs_archive
from localcluster.node import CGROUP_V1, Node, add_node, remove_node
from tests.cluster.realnode import kubectl

pytestmark = pytest.mark.cluster

NODE = "rn1"
#: A sleep no other process on the machine runs, to find the workload's process (or its absence).
SLEEP = "31337"


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
    while "hello from tiny" not in (logs := kubectl(cp, "logs", "tiny")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "hello from tiny" in logs
    out = kubectl(cp, "exec", "tiny", "--", "sh", "-c", "echo exec-ok; cat /proc/1/cmdline")
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


def _in_node(node: Node, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(node.nsenter(["sh", "-c", script]), capture_output=True, text=True, timeout=120,
                          check=False)


def _wait(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout:.0f} s")
        time.sleep(0.2)


def test_gpu_node_has_its_devices_a_systemctl_and_a_supervisor(real_cluster: ControlPlane) -> None:
    """A GPU node's driver and device nodes exist only in its own view; its ``systemctl`` restarts containerd
    through the supervisor while a pod keeps running; a killed kubelet comes back (``Restart=always``)."""
    cp = real_cluster
    kube = cp.admin()
    assert cp.bin_dir is not None
    tiny = cp.directory / "images" / "tiny.tar"
    rootfs_archive(tiny, "localhost/nvidia-gpu-test/tiny:1", ["sh", "cat", "sleep"])
    node = add_node(cp.directory, "gpu1", cp.bin_dir, kube, images=[tiny], machine="dgx-h100")
    try:
        view = _in_node(node, "ls /dev | grep ^nvidia; stat -c '%F %t %T' /dev/nvidia3 /dev/nvidiactl; "
                              "ldconfig -p | grep -c 'libnvidia-ml.so.1 '; "
                              "ls /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15 /usr/bin/nvidia-ctk")
        assert view.returncode == 0, view.stderr
        lines = view.stdout.splitlines()
        assert {f"nvidia{i}" for i in range(8)} | {"nvidiactl", "nvidia-uvm"} <= set(lines), lines
        assert "character special file c3 3" in lines and "character special file c3 ff" in lines, lines
        assert not list(Path("/dev").glob("nvidia*")), "the host's /dev must stay untouched"
        # NVML through the node's driver: the machine's eight GPUs, each visible through its device node.
        smi = _in_node(node, "nvidia-smi -L")
        assert smi.returncode == 0 and smi.stdout.count("NVIDIA H100") == 8, smi.stdout + smi.stderr

        refs = node.import_image(tiny)
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "keeps", "namespace": "default"},
                     "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu1"}, "terminationGracePeriodSeconds": 1,
                              "containers": [{"name": "main", "image": refs[0], "imagePullPolicy": "Never",
                                              "command": ["sleep", SLEEP]}]}})
        _wait_running(kube, "keeps")
        before = node.unit_pid("containerd")
        restart = _in_node(node, "systemctl restart containerd && systemctl is-active containerd")
        assert restart.returncode == 0 and restart.stdout.strip() == "", restart.stdout + restart.stderr
        after = node.unit_pid("containerd")
        assert before and after and before != after
        assert any(f"sleep {SLEEP}" in line for line in _processes_under(node.cgroup_root)), "pod died with containerd"
        bad = _in_node(node, "systemctl daemon-reload")
        assert bad.returncode == 1 and "'daemon-reload' is not supported" in bad.stderr, bad.stderr

        kubelet = node.unit_pid("kubelet")
        node.kill("kubelet")
        _wait(lambda: node.unit_pid("kubelet") not in (None, kubelet), "the kubelet not restarted")
        # The new kubelet answers "pod does not exist" until it has synced its pods again.
        _wait(lambda: kubectl(cp, "exec", "keeps", "--", "cat", "/proc/1/cmdline", check=False).startswith("sleep"),
              "exec after the kubelet's restart")

        # A reboot, by the CLI: a new boot ID on the Node, the pod's container started again in a new sandbox,
        # none of the driver's device nodes (nothing made them since), and no mount of the old sandboxes left.
        old_boot = kube.get("v1", "Node", "gpu1")["status"]["nodeInfo"]["bootID"]
        reboot = subprocess.run([sys.executable, "-m", "localcluster", "node", "reboot", "gpu1", "--dir",
                                 str(cp.directory)], capture_output=True, text=True, timeout=300, check=False)
        assert reboot.returncode == 0, reboot.stdout + reboot.stderr
        assert kube.get("v1", "Node", "gpu1")["status"]["nodeInfo"]["bootID"] not in ("", old_boot)
        assert node.boot_id_file.read_text().strip() == kube.get("v1", "Node", "gpu1")["status"]["nodeInfo"]["bootID"]
        _wait(lambda: kube.get("v1", "Pod", "keeps", "default")["status"].get("containerStatuses", [{}])[0]
              .get("restartCount", 0) >= 1 and _wait_running(kube, "keeps"), "the pod's container started again",
              timeout=180)
        seen = kubectl(cp, "exec", "keeps", "--", "cat", "/proc/sys/kernel/random/boot_id").strip()
        assert seen == node.boot_id_file.read_text().strip(), "a container sees the node's boot ID"
        view = _in_node(node, "ls /dev | grep ^nvidia; ls /run/netns | wc -l")
        assert not [line for line in view.stdout.splitlines() if line.startswith("nvidia")], view.stdout
        assert view.stdout.split()[-1] == "1", view.stdout  # the new sandbox's network namespace alone
    finally:
        kube.delete("v1", "Pod", "keeps", "default", gracePeriodSeconds="0")
        assert remove_node(cp.directory, "gpu1", kube)
    assert _leftovers(node.directory, node.cgroup_root) == []
