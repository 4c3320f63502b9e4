"""Images without a registry on a real node (issue 35): the node agent image as an air-gapped site builds it
(``node_agent/image/build.sh``, buildah) exported as an OCI archive, and the workload probe image
(``tests/cluster/gpu_probe.c`` with its loader, ``ldconfig`` and the Debian library layout the NVIDIA CDI hook
expects), both imported with ``ctr`` into a real node's containerd and run by digest in pods.

The agent pod runs the image's own entrypoint and command (``python -m node_agent --help``, as the image's
user 65532); the probe pod rebuilds its linker cache with the image's ``ldconfig`` (what the CDI hook's
``update-ldcache`` does) and runs the probe, which on this GPU-less machine must say that neither
``libcuda.so.1`` nor ``libnvidia-ml.so.1`` loads and exit 1. Build, export and import times are printed (``-s``).

Needs root (the node; buildah's chroot isolation), buildah and debootstrap, gcc, and the Python package index
the image build installs from (``PIP_INDEX_URL``, as ``tests/image``); skipped without root.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from localcluster import ControlPlane, Kube
from localcluster.images import build_agent_image, buildah_archive, local_ca_dir, probe_archive
from localcluster.node import Node, add_node, remove_node
from tests.cluster.realnode import kubectl
from tests.kit.tools import missing

pytestmark = [pytest.mark.cluster, pytest.mark.image]

REPO = Path(__file__).resolve().parents[2]
NODE = "img1"
AGENT = "localhost/nvidia-gpu-agent:node-test"
PROBE = "localhost/nvidia-gpu-test/gpu-probe:1"
#: What the probe prints where no driver is mounted: nothing loads, NVML never initialises.
NO_DRIVER = {"libcuda": False, "libnvidia_ml": False, "nvml_init": -1, "device_count_rc": -1, "device_count": 0,
             "dev_nvidia0": False, "dev_nvidiactl": False, "nvidia_smi": False, "ld_cache_libcuda": False,
             "libcuda_dev_link": False, "gpus": []}


def _run_pod(kube: Kube, name: str, image: str, command: list[str] | None = None) -> None:
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never"}
    if command:
        container["command"] = command
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                 "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "restartPolicy": "Never",
                          "terminationGracePeriodSeconds": 1, "containers": [container]}})


def _wait_done(kube: Kube, name: str, timeout: float = 90.0) -> dict[str, Any]:
    """The pod once it has run to completion (Succeeded or Failed)."""
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = kube.get("v1", "Pod", name, "default")
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return pod
        time.sleep(0.5)
    raise AssertionError(f"pod {name} did not finish in {timeout:.0f} s: {pod.get('status')}")


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = pod["status"]["containerStatuses"][0]
    terminated: dict[str, Any] = status["state"]["terminated"]
    return {**terminated, "imageID": status["imageID"]}


@pytest.mark.timeout(1200)
def test_agent_and_probe_images_run_on_a_real_node(real_cluster: ControlPlane, tmp_path: Path) -> None:
    for tool in ("cc", "buildah", "debootstrap", "ldconfig"):
        if shutil.which(tool) is None:
            missing(f"{tool} is needed to build the node's images: apt-get install buildah debootstrap gcc")
    cp = real_cluster
    kube = cp.admin()
    assert cp.bin_dir is not None
    images = cp.directory / "images"
    buildah_root = tmp_path / "buildah"  # a new storage: the cold build (the debootstrap base stays cached)
    try:
        t0 = time.monotonic()
        build_agent_image(AGENT, buildah_root=buildah_root, ca_dir=local_ca_dir())
        t1 = time.monotonic()
        agent_digest = buildah_archive(AGENT, images / "agent.tar", buildah_root=buildah_root)
        t2 = time.monotonic()
    finally:
        shutil.rmtree(buildah_root, ignore_errors=True)
    probe_digest = probe_archive(images / "probe.tar", PROBE, REPO / "tests" / "cluster" / "gpu_probe.c")
    t3 = time.monotonic()
    print(f"\nagent image: build {t1 - t0:.1f} s, export {t2 - t1:.1f} s "
          f"({(images / 'agent.tar').stat().st_size / 1e6:.0f} MB); probe image {t3 - t2:.1f} s "
          f"({(images / 'probe.tar').stat().st_size / 1e6:.1f} MB)")

    node = add_node(cp.directory, NODE, cp.bin_dir, kube)
    t4 = time.monotonic()
    agent_refs = node.import_image(images / "agent.tar")
    t5 = time.monotonic()
    probe_refs = node.import_image(images / "probe.tar")
    t6 = time.monotonic()
    print(f"node {NODE} up in {t4 - t3:.1f} s; import: agent {t5 - t4:.1f} s, probe {t6 - t5:.1f} s")
    # The archives name their images for ctr; the node tags them by digest, which the pods reference.
    assert agent_refs == [f"localhost/nvidia-gpu-agent@{agent_digest}"], agent_refs
    assert probe_refs == [f"localhost/nvidia-gpu-test/gpu-probe@{probe_digest}"], probe_refs

    # (a) The agent image's entrypoint and default command (`python -m node_agent --help`).
    _run_pod(kube, "agent", agent_refs[0])
    # (b) The probe: the image's ldconfig rebuilds the cache from its ld.so.conf (the CDI hook's
    # update-ldcache does this once the driver's libraries are mounted), then the probe loads by soname.
    _run_pod(kube, "probe", probe_refs[0], ["sh", "-c", "ldconfig && ldconfig -p && exec gpu-probe"])

    agent = _wait_done(kube, "agent")
    assert agent["status"]["phase"] == "Succeeded", agent["status"]
    assert _terminated(agent)["exitCode"] == 0
    assert _terminated(agent)["imageID"].endswith(agent_digest), _terminated(agent)
    usage = kubectl(cp, "logs", "agent")
    assert usage.startswith("usage: python -m node_agent"), usage[:500]
    for command in ("device-plugin", "check", "labels"):
        assert command in usage, usage

    probe = _wait_done(kube, "probe")
    assert probe["status"]["phase"] == "Failed", probe["status"]
    assert _terminated(probe)["exitCode"] == 1, _terminated(probe)
    assert _terminated(probe)["imageID"].endswith(probe_digest), _terminated(probe)
    lines = kubectl(cp, "logs", "probe").splitlines()
    assert "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6" in lines, lines
    assert json.loads(lines[-1]) == NO_DRIVER, lines[-1]

    for pod in ("agent", "probe"):
        kube.delete("v1", "Pod", pod, "default", gracePeriodSeconds="0")
    assert remove_node(cp.directory, NODE, kube)
    assert kube.get_or_none("v1", "Node", NODE) is None
    assert not node.directory.exists() and Node.all(cp.directory) == []
