"""The GPU inventory on the real control plane: ``kubectl get gpus`` lists a simulated node's GPUs.

The dev stack as applied (its CRD, the labeller's RBAC, the node-confinement policy), a kwok Node of the
a100-train group, and the labeller's DaemonSet arguments run once per step as its pod would run them
(its own pod-bound token, a simulated DGX A100 under a host root): objects appear, follow a GPU that is
lost and a MIG layout change, are written only when something changed, cannot be written by another
node's labeller, carry no finalizer, and go with their Node.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster import ApiError, ControlPlane, Kube
from localcluster.dryrun import wait_crds_served
from localcluster.objects import wait_for
from nvgpu import inventory, labels
from nvml_sim import SimulatedMachine
from tests.cluster.agents import (
    NS,
    REPO,
    AgentIdentity,
    agent_command,
    config_map_files,
    container_env,
    create_group_nodes,
    identity,
    with_config_dir,
)
from tests.cluster.stack import AppliedStack
from tests.kit.fakehost import build_fake_host

pytestmark = pytest.mark.cluster

DAEMONSET = "gpu-labeller-a100-train"
NODE_GROUP = "gpu-a100"
MACHINE = "dgx-a100-80gb"
NODE, OTHER = "inv-a100-a", "inv-a100-b"


@dataclass
class Labeller:
    root: Path
    identity: AgentIdentity
    args: list[str]
    env: dict[str, str]

    @property
    def sim(self) -> SimulatedMachine:
        return SimulatedMachine(MACHINE, self.root / "run/nvidia-gpu-agent/nvml-sim" / f"{MACHINE}.json")

    def run(self) -> dict[str, Any]:
        """One labelling run, the DaemonSet's arguments without ``--loop``: its JSON report."""
        done = subprocess.run(agent_command("--host-root", str(self.root), "--host-exec", "direct", "--nvml",
                                            f"simulated:{MACHINE}", "--kubeconfig", str(self.identity.kubeconfig),
                                            "--json", *self.args),
                              capture_output=True, text=True, timeout=120, cwd=REPO, env=self.env, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        assert not [w for w in report["warnings"] if "inventory" in w], report["warnings"]
        return report


    def loop(self, *extra: str) -> subprocess.Popen[str]:
        """The labeller as its pod runs it (``--loop``), with ``extra`` flags; stop it with SIGTERM."""
        return subprocess.Popen(agent_command("--host-root", str(self.root), "--host-exec", "direct", "--nvml",
                                              f"simulated:{MACHINE}", "--kubeconfig", str(self.identity.kubeconfig),
                                              *self.args, "--loop", *extra),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=self.env)


def _once(args: list[str]) -> list[str]:
    """The loop's arguments as one run: ``--loop`` and ``--interval N`` dropped."""
    i = args.index("--interval")
    return [a for a in args[:i] + args[i + 2:] if a != "--loop"]


@pytest.fixture(scope="module")
def labeller(kube: Kube, dev_stack: AppliedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Labeller]:
    work = tmp_path_factory.mktemp("inventory")
    create_group_nodes(kube, dev_stack, NODE_GROUP, (NODE, OTHER))
    try:
        ds = dev_stack.object("DaemonSet", DAEMONSET)["spec"]["template"]["spec"]
        (container,) = ds["containers"]
        configs = config_map_files(kube.get("v1", "ConfigMap", "device-plugin-config-a100-train", NS)["data"],
                                   work / "configs")
        args = with_config_dir(_once(list(container["args"])), configs)
        assert "--inventory" in args, args
        root = build_fake_host(work / "host", MACHINE).root

        wait_crds_served(kube, [inventory.CRD_NAME])  # applied with the stack just now
        env = {"PATH": "/usr/bin:/bin", **container_env(container, NODE)}
        yield Labeller(root, identity(kube, DAEMONSET, NODE, work / "id"), args, env)
    finally:
        for name in (NODE, OTHER):
            kube.delete("v1", "Node", name)


def _gpus(kube: Kube, node: str = NODE) -> dict[str, dict[str, Any]]:
    listed = kube.request("GET", inventory.collection_path(), query={"labelSelector": f"{inventory.NODE_LABEL}={node}"})
    return {o["metadata"]["name"]: o for o in listed["items"]}


def _kubectl(control_plane: ControlPlane, *args: str) -> str:
    done = subprocess.run(["kubectl", "--kubeconfig", str(control_plane.kubeconfig), *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_get_gpus_lists_the_nodes_gpus(kube: Kube, control_plane: ControlPlane, labeller: Labeller) -> None:
    labeller.run()
    gpus = _gpus(kube)
    assert sorted(gpus) == [inventory.object_name(NODE, i) for i in range(8)]
    node_uid = kube.get("v1", "Node", NODE)["metadata"]["uid"]
    for name, obj in gpus.items():
        assert obj["spec"]["node"] == NODE and name == inventory.object_name(NODE, obj["spec"]["index"])
        assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                       "uid": node_uid}]
        assert not obj["metadata"].get("finalizers"), "nothing can hold up a destroy or a Node deletion"
        status = obj["status"]
        assert status["productName"] == "NVIDIA A100-SXM4-80GB" and status["model"] == "A100-80GB"
        assert status["memoryMiB"] == 81920 and status["computeCapability"] == "8.0"
        assert status["uuid"].startswith("GPU-") and status["pciBusID"].startswith("0000:")
        assert (status["sharing"], status["allocationMode"]) == ("Exclusive", "devicePlugin")
        assert status["mig"] == {"mode": "Disabled"} and status["health"]["state"] == "Healthy"
        assert status["exposedAs"] == [{"name": "nvidia.com/gpu", "count": 1}]
        assert status["driverVersion"] and status["cudaVersion"] and status["kernelModules"] == "open"
        assert "driverUpgrade" not in status
    # What an administrator types, with the CRD's printer columns.
    table = _kubectl(control_plane, "get", "gpus", "-o", "wide", "-l", f"{inventory.NODE_LABEL}={NODE}").splitlines()
    assert table[0].split() == ["NAME", "NODE", "INDEX", "MODEL", "MEMORY(MIB)", "MIG", "HEALTH", "AGE", "UUID",
                                "DRIVER", "MODULES", "UPGRADE", "CHECK", "SHARING", "ALLOCATION", "REASON", "LAST-XID",
                                "NEEDS"]
    assert len(table) == 9 and all(" NVIDIA A100-SXM4-80GB " in row and " Healthy " in row for row in table[1:])


def test_a_run_with_nothing_changed_writes_nothing(kube: Kube, labeller: Labeller) -> None:
    labeller.run()
    before = {n: o["metadata"]["resourceVersion"] for n, o in _gpus(kube).items()}
    labeller.run()
    assert {n: o["metadata"]["resourceVersion"] for n, o in _gpus(kube).items()} == before


def _raise_until(kube: Kube, labeller: Labeller, index: int, xid: int) -> dict[str, Any] | None:
    """The GPU's health once its object shows ``xid``; else raise the XID (again) and answer None."""
    health: dict[str, Any] = _gpus(kube)[inventory.object_name(NODE, index)]["status"]["health"]
    if health.get("lastXID") == xid:
        return health
    labeller.sim.inject_xid(index, xid)
    return None


def test_xids_show_at_once_and_a_critical_one_turns_the_gpu_unhealthy_for_the_quiet_period(
        kube: Kube, control_plane: ControlPlane, labeller: Labeller) -> None:
    """The labeller's loop (a 60 s interval, as deployed) holds an NVML event set: an XID starts the next run
    at once, so the object follows within seconds; a quiet period of 2 s makes the recovery quick to see."""
    labeller.run()
    ecc, app = inventory.object_name(NODE, 2), inventory.object_name(NODE, 1)
    proc = labeller.loop("--interval", "60", "--inventory-xid-quiet", "2")
    try:
        # The recorder sees what is raised after its event set exists: raise until the object shows it.
        health = wait_for(lambda: _raise_until(kube, labeller, 2, 48), timeout=20, interval=1,
                          what=f"{ecc} showing XID 48")
        assert health["state"] == "Unhealthy" and health["reason"] == "critical XID 48 less than 2s ago", health
        time.sleep(2.5)
        wait_for(lambda: _raise_until(kube, labeller, 1, 13), timeout=20, interval=1, what=f"{app} showing XID 13")
        gpus = _gpus(kube)
        assert gpus[app]["status"]["health"]["state"] == "Healthy"
        # The quiet period passed, but the double-bit error left a row remap pending: a reset first.
        held = gpus[ecc]["status"]["health"]
        assert (held["state"], held["needs"], held["lastXID"]) == ("Unhealthy", "reset", 48), held
        row = next(r for r in _kubectl(control_plane, "get", "gpus", "-o", "wide", ecc).splitlines()[1:])
        assert row.split()[-2:] == ["48", "reset"], row
        labeller.sim.reset_gpu(2)

        def recovered() -> dict[str, Any] | None:
            health: dict[str, Any] = _gpus(kube)[ecc]["status"]["health"]
            if health["state"] == "Healthy":
                return health
            labeller.sim.inject_xid(1, 13)  # an application's XID starts the next run
            return None

        health = wait_for(recovered, timeout=20, interval=1, what=f"{ecc} healthy after its reset")
        assert health["lastXID"] == 48 and "needs" not in health, "the last XID is kept"
        row = next(r for r in _kubectl(control_plane, "get", "gpus", "-o", "wide", ecc).splitlines()[1:])
        assert row.split()[-1] == "48", row  # no reason, nothing needed: those columns are blank
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "event=xid gpu=2 xid=48" in out and "critical=True" in out, out


def test_the_nodes_driver_upgrade_and_check_show_on_its_gpus(kube: Kube, labeller: Labeller) -> None:
    """The upgrade controller's label and failure annotation on the Node, and node setup's check labels (a
    driver that is not the declared one), show on every GPU of the node at the labeller's next run, and go
    when their writers clear them."""
    failure = "the new driver pod was not ready within 900 s"
    kube.patch("v1", "Node", NODE, {"metadata": {
        "labels": {labels.DRIVER_UPGRADE_STATE: "upgrade-failed",
                   **labels.check_labels("unusable", ["driver-mismatch", "toolkit-missing"])},
        "annotations": {labels.DRIVER_UPGRADE_FAILURE: failure}}})
    try:
        labeller.run()
        statuses = [o["status"] for o in _gpus(kube).values()]
        assert {s["driverUpgrade"]["state"] for s in statuses} == {"upgrade-failed"}
        assert {s["driverUpgrade"]["reason"] for s in statuses} == {failure}
        assert all(s["nodeCheck"] == {"verdict": "unusable", "reasons": ["driver-mismatch", "toolkit-missing"]}
                   for s in statuses)
    finally:
        kube.patch("v1", "Node", NODE, {"metadata": {
            "labels": {labels.DRIVER_UPGRADE_STATE: None, **labels.check_labels("ok", [])},
            "annotations": {labels.DRIVER_UPGRADE_FAILURE: None}}})
    labeller.run()
    statuses = [o["status"] for o in _gpus(kube).values()]
    assert not [s for s in statuses if "driverUpgrade" in s]
    assert all(s["nodeCheck"] == {"verdict": "ok"} for s in statuses)
    cleared = dict.fromkeys((labels.NODE_CHECK, labels.NODE_CHECK_REASONS))
    kube.patch("v1", "Node", NODE, {"metadata": {"labels": cleared}})


def test_a_lost_gpu_turns_unhealthy_and_comes_back(kube: Kube, labeller: Labeller) -> None:
    labeller.run()
    before = _gpus(kube)
    lost = inventory.object_name(NODE, 3)
    labeller.sim.lose_gpu(3)
    try:
        labeller.run()
        after = _gpus(kube)
        health = after[lost]["status"]["health"]
        assert health["state"] == "Unhealthy" and "lost" in health["reason"].lower(), health
        assert after[lost]["status"]["uuid"] == before[lost]["status"]["uuid"], "what was known of it is kept"
        version = {n: o["metadata"]["resourceVersion"] for n, o in before.items()}
        unchanged = {n for n in after if after[n]["metadata"]["resourceVersion"] == version[n]}
        assert unchanged == set(before) - {lost}
    finally:
        labeller.sim.restore_gpu(3)
    labeller.run()
    assert _gpus(kube)[lost]["status"]["health"]["state"] == "Healthy"


def test_a_mig_layout_change_shows_in_the_instances(kube: Kube, control_plane: ControlPlane,
                                                    labeller: Labeller, tmp_path: Path) -> None:
    config = tmp_path / "mig.yaml"
    config.write_text(kube.get("v1", "ConfigMap", "nvidia-gpu-mig-parted-config", NS)["data"]["config.yaml"])
    done = subprocess.run(agent_command("--host-root", str(labeller.root), "--nvml", f"simulated:{MACHINE}", "mig",
                                        "apply", "--config", str(config), "--name", "all-3g.40gb"),
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    labeller.run()
    for obj in _gpus(kube).values():
        mig = obj["status"]["mig"]
        assert mig["mode"] == "Enabled", mig
        assert [i["profile"] for i in mig["instances"]] == ["3g.40gb", "3g.40gb"], mig
        assert obj["status"]["exposedAs"] == [{"name": "nvidia.com/mig-3g.40gb", "count": 2}]
    row = _kubectl(control_plane, "get", "gpus", inventory.object_name(NODE, 0)).splitlines()[1]
    assert " Enabled " in row


def test_another_nodes_labeller_may_not_write_these_gpus(kube: Kube, labeller: Labeller, tmp_path: Path) -> None:
    other = identity(kube, DAEMONSET, OTHER, tmp_path)
    name = inventory.object_name(NODE, 0)
    with pytest.raises(ApiError) as caught:
        other.kube.request("PATCH", inventory.object_path(name) + "/status",
                           {"status": {"health": {"state": "Unhealthy", "reason": "forged"}}},
                           content_type="application/merge-patch+json")
    assert (caught.value.status, caught.value.reason) == (403, "Forbidden"), caught.value
    assert f"the gpu-labeller on node {OTHER} may only change its own node, not the GPUs of node {NODE}" \
        in caught.value.message
    with pytest.raises(ApiError) as caught:
        other.kube.request("DELETE", inventory.object_path(name))
    assert caught.value.status == 403
    assert _gpus(kube)[name]["status"]["health"]["state"] == "Healthy"


def test_a_labeller_whose_daemonset_is_gone_takes_its_gpus_with_it(kube: Kube, labeller: Labeller,
                                                                    tmp_path: Path) -> None:
    """The node group removed from the stack: its labeller, stopped (SIGTERM) and finding its DaemonSet gone,
    withdraws its labels and deletes its node's GPU objects (nobody would keep them current)."""
    labeller.run()
    assert len(_gpus(kube)) == 8
    args = list(labeller.args)
    args[args.index("--daemonset") + 1] = f"{NS}/gpu-labeller-removed-group"
    i = args.index("labels") + 1
    args[i:i] = ["--loop", "--interval", "1"]
    log = tmp_path / "labeller.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(agent_command("--host-root", str(labeller.root), "--host-exec", "direct", "--nvml",
                                              f"simulated:{MACHINE}", "--kubeconfig",
                                              str(labeller.identity.kubeconfig), "--log-level", "info", *args),
                                cwd=REPO, env=labeller.env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        # Once it has labelled, its SIGTERM handler is in place.
        wait_for(lambda: proc.poll() is None and "labelled labels=" in log.read_text(), timeout=60,
                 what="the loop's first run")
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = log.read_text()
    assert proc.returncode == 0, out
    assert "daemonset retired, labels withdrawn" in out, out
    assert _gpus(kube) == {}, out


def test_deleting_the_node_deletes_its_gpus(kube: Kube, labeller: Labeller) -> None:
    """Last: the garbage collector follows the ownerReferences (no finalizer to wait for)."""
    labeller.run()
    assert len(_gpus(kube)) == 8
    kube.delete("v1", "Node", NODE)
    wait_for(lambda: not _gpus(kube), timeout=60, interval=0.5, what="the GPUs of the deleted Node collected")
