"""``setup`` / ``teardown``: the whole node-setup flow, with the Node label on a fake API server."""

from __future__ import annotations

from pathlib import Path

from nvgpu import labels
from nvgpu.nodescripts import plan
from tests.kit.fakehost import build_fake_host
from tests.node_agent.agent_testkit import ApiServer, Cli

SETUP = "node.deckhouse.io/gpu-setup-complete"
VFIO = "node.deckhouse.io/gpu-vfio-ready"


def test_setup_then_teardown(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path, "dgx-h100", containerd=2, deckhouse=False)
    etc_before = host.snapshot("/etc")
    kube = {"node": "gpu-node-1", "kubeconfig": api_server.kubeconfig}
    code, doc = cli(host.root, "simulated:dgx-h100", "setup", **kube)
    assert (code, doc["complete"]) == (0, True), doc
    assert [s["name"] for s in doc["steps"]] == ["check", "runtime", "sysctl"]
    assert api_server.labels("gpu-node-1")[SETUP] == ""
    assert host.path("/proc/sys/net/core/bpf_jit_harden").read_text() == "1\n"
    code, doc = cli(host.root, "simulated:dgx-h100", "setup", **kube)
    assert (code, doc["labelChanges"]) == (0, {})
    code, doc = cli(host.root, "simulated:dgx-h100", "teardown", **kube)
    assert (code, doc["complete"]) == (0, True), doc
    assert SETUP not in api_server.labels("gpu-node-1")
    assert host.snapshot("/etc") == etc_before
    assert host.path("/proc/sys/net/core/bpf_jit_harden").read_text() == "2\n"
    assert host.log("systemctl") == ["restart containerd", "restart containerd"]


def test_failed_check_removes_the_label(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    api_server.set_labels("gpu-node-1", {SETUP: ""})
    host = build_fake_host(tmp_path, "t4x1", driver_version="440.33.01")
    etc_before = host.snapshot("/etc")
    code, doc = cli(host.root, "simulated:t4x1", "setup", node="gpu-node-1", kubeconfig=api_server.kubeconfig)
    assert (code, doc["complete"]) == (1, False)
    assert doc["steps"][-1]["name"] == "check" and "driver-too-old" in doc["steps"][-1]["detail"]
    assert SETUP not in api_server.labels("gpu-node-1")
    assert host.snapshot("/etc") == etc_before


def test_dra_setup_adds_vfio(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path / "on", "a30x4")
    kube = {"node": "gpu-node-1", "kubeconfig": api_server.kubeconfig}
    code, doc = cli(host.root, "simulated:a30x4", "setup", "--dra", **kube)
    # The order of the Deckhouse scripts' weights (the device nodes are told in the check's step).
    assert code == 0 and [s["name"] for s in doc["steps"]] == [
        s.name for s in plan.SETUP_ORDER if s.name != "devices"] == ["check", "runtime", "vfio", "sysctl"]
    assert (api_server.labels("gpu-node-1")[SETUP], api_server.labels("gpu-node-1")[VFIO]) == ("", "true")
    off = build_fake_host(tmp_path / "off", "a30x4", iommu=False)
    code, doc = cli(off.root, "simulated:a30x4", "setup", "--dra", **kube)
    assert (code, doc["steps"][-1]["detail"]) == (1, "iommu-off")
    assert off.path("/proc/sys/net/core/bpf_jit_harden").read_text() == "2\n"  # the flow stopped before sysctl
    labels = api_server.labels("gpu-node-1")
    assert SETUP not in labels and VFIO not in labels


def test_no_gpu_node(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, None)
    before = host.snapshot("/etc")
    code, doc = cli(host.root, "simulated:t4x1", "setup", "--no-patch-node")
    assert (code, doc["complete"]) == (0, False)
    assert doc["steps"][0]["detail"] == "no NVIDIA GPU on this node: nothing to set up"
    assert host.snapshot("/etc") == before


def test_foreign_file_stops_setup_with_refused(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    host.path("/etc/sysctl.d/99-zz-nvidia-gpu.conf").write_text("kernel.foo = 1\n")
    code, doc = cli(host.root, "simulated:l4x2", "setup", "--no-patch-node", "--no-restart")
    assert code == 5 and doc["steps"][-1]["name"] == "sysctl"


def test_kube_error_is_exit_4(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text('{"apiVersion": "v1", "kind": "Config", "current-context": "x", "clusters": [{"name": "x", '
                          '"cluster": {"server": "http://127.0.0.1:9"}}], "users": [{"name": "x", "user": {}}], '
                          '"contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}')
    code, doc = cli(host.root, "simulated:l4x2", "teardown", node="gpu-node-1", kubeconfig=kubeconfig)
    assert code == 4 and doc["steps"][-1]["name"] == "node-labels"


def test_setup_publishes_the_os_and_kernel_even_when_the_node_is_not_ready(tmp_path: Path, cli: Cli,
                                                                          api_server: ApiServer) -> None:
    """A node waiting for its driver container: setup's check fails (no driver yet), yet the OS and kernel
    labels that choose the driver container's image are published, and no pre-installed driver is claimed;
    teardown takes them off again."""
    host = build_fake_host(tmp_path, "dgx-h100", deckhouse=False, driver_loaded=False, nvidia_smi=False,
                           os_release=("rhel", "9.4"), kernel="5.14.0-427.13.1.el9_4.x86_64")
    kube = {"node": "gpu-node-1", "kubeconfig": api_server.kubeconfig}
    code, doc = cli(host.root, "simulated:dgx-h100", "setup", **kube)
    assert code != 0 and not doc["complete"], doc
    got = api_server.labels("gpu-node-1")
    assert {k: got.get(k) for k in labels.OS_LABELS} == {
        labels.OS_RELEASE_ID: "rhel", labels.OS_RELEASE_VERSION_ID: "9.4",
        labels.KERNEL_VERSION_FULL: "5.14.0-427.13.1.el9_4.x86_64"}
    assert labels.GPU_DEPLOY_DRIVER not in got and SETUP not in got
    cli(host.root, "simulated:dgx-h100", "teardown", **kube)
    assert not set(labels.OS_LABELS) & set(api_server.labels("gpu-node-1"))


def test_a_host_with_its_own_driver_is_marked_pre_installed(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path, "dgx-h100", containerd=2, deckhouse=False)
    code, _ = cli(host.root, "simulated:dgx-h100", "setup", node="gpu-node-1", kubeconfig=api_server.kubeconfig)
    assert code == 0
    got = api_server.labels("gpu-node-1")
    assert got[labels.GPU_DEPLOY_DRIVER] == labels.DRIVER_PREINSTALLED
    assert (got[labels.OS_RELEASE_ID], got[labels.OS_RELEASE_VERSION_ID]) == ("ubuntu", "22.04")
    code, _ = cli(host.root, "simulated:dgx-h100", "teardown", node="gpu-node-1", kubeconfig=api_server.kubeconfig)
    assert code == 0 and labels.GPU_DEPLOY_DRIVER not in api_server.labels("gpu-node-1")  # setup's value: removed
