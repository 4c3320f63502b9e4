"""The PodResources client against a stand-in kubelet on a unix socket, and its proto against kubelet's.

The stand-in serves the messages of our ``podresources_v1.proto``; what makes that kubelet's protocol is
the first test: every service method, message, field name, type and number equals kubelet's own
``api.proto`` (k8s.io/kubelet, at the version the control plane is built from).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.exporter.holders import ContainerDevices
from node_agent.kubelet.podresources.client import PodResourcesClient, PodResourcesError
from tests.kit.kubelet.common import short_root
from tests.kit.kubelet.podresources import Container, Pod, pod_resources
from tests.kit.tools import missing

REPO = Path(__file__).resolve().parents[3]
OURS = REPO / "node_agent/kubelet/podresources/podresources_v1.proto"


def _kubelet_proto() -> str:
    go_mod = (REPO / "tools/kube/go.mod").read_text()
    version = re.search(r"^\s*k8s\.io/kubelet => k8s\.io/kubelet (v\S+)", go_mod, re.M)
    assert version, "tools/kube/go.mod pins k8s.io/kubelet"
    done = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubelet@{version.group(1)}"],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO / "tools/kube")
    if done.returncode != 0:
        missing(f"k8s.io/kubelet {version.group(1)} from the Go module proxy: {done.stderr or done.stdout}")
    return (Path(json.loads(done.stdout)["Dir"]) / "pkg/apis/podresources/v1/api.proto").read_text()


def _shape(text: str) -> dict[str, object]:
    """Services' methods and messages' fields (type, name, number), comments and options left out."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # field options (gogoproto)
    shape: dict[str, object] = {"package": re.search(r"^\s*package\s+(\S+);", text, re.M).group(1)}  # type: ignore[union-attr]
    shape["services"] = re.findall(r"service\s+(\w+)", text)
    shape["rpcs"] = sorted(re.findall(r"rpc\s+(\w+)\s*\((\w+)\)\s*returns\s*\((\w+)\)", text))
    for name, body in re.findall(r"message\s+(\w+)\s*\{([^}]*)\}", text):
        shape[f"message {name}"] = sorted(re.findall(r"((?:repeated\s+)?\w+)\s+(\w+)\s*=\s*(\d+)\s*;", body))
    return shape


def test_the_proto_is_kubelets() -> None:
    theirs, ours = _shape(_kubelet_proto()), _shape(OURS.read_text())
    assert ours == theirs


@pytest.fixture
def socket() -> Iterator[Path]:
    with short_root("podres-") as root:
        yield root / "var/lib/kubelet/pod-resources/kubelet.sock"


def test_list_answers_each_container_with_its_devices_and_claims(socket: Path) -> None:
    pods = [
        Pod("train", "ml", [Container("main", devices={"nvidia.com/gpu": ["GPU-a", "GPU-b"]}),
                            Container("sidecar")]),  # holds nothing: left out
        Pod("infer", "web", [Container("srv", claims=[("gpu", "web", [("gpu.nvidia.com", "node-a", "gpu-3")])])]),
        Pod("nic", "net", [Container("c", devices={"example.com/sriov": ["vf0"]})]),
    ]
    with pod_resources(socket, pods) as kubelet:
        client = PodResourcesClient(str(socket))
        try:
            got = client.list()
        finally:
            client.close()
    assert kubelet.calls == 1
    assert got == [
        ContainerDevices("train", "ml", "main", (("nvidia.com/gpu", "GPU-a"), ("nvidia.com/gpu", "GPU-b"))),
        ContainerDevices("infer", "web", "srv", (), (("gpu.nvidia.com", "node-a", "gpu-3"),)),
        ContainerDevices("nic", "net", "c", (("example.com/sriov", "vf0"),)),
    ]


def test_a_kubelet_that_does_not_answer_is_an_error_naming_the_socket(socket: Path) -> None:
    with pod_resources(socket, []) as kubelet:
        kubelet.down = True
        client = PodResourcesClient(str(socket), timeout_s=2)
        try:
            with pytest.raises(PodResourcesError, match=r"PodResources List on .*kubelet.sock: .*UNAVAILABLE"):
                client.list()
            kubelet.down = False  # kubelet is back: the same client answers again
            assert client.list() == []
        finally:
            client.close()
