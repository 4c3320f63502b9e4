"""The GPU inventory objects the labeller writes: what they say, that it fits the CRD's schema, and that a
run writes only what changed (the real API server's side is ``tests/cluster/test_gpu_inventory.py``)."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest

from node_agent.dra.devices import allocatable_devices
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.host import HostRoot
from node_agent.labeller import inventory
from node_agent.labeller.inventory import InventoryContext
from node_agent.nvml import NvmlBackend, NvmlNotSupported, open_nvml
from node_agent.nvml.types import DriverInfo, Inventory, LostGpu
from node_agent.nvml.xidwatch import XidRecorder, XidSeen
from nvgpu import inventory as api
from nvgpu.migparted import build_config
from nvidia_gpu.components.manifests.inventory import PRINTER_COLUMNS, SCHEMA, crd
from nvml_sim import SimulatedMachine
from nvml_sim.lib import MIG_MONITOR_ENV
from tests.kit.fakehost import build_fake_host, sim_state_file

REPO = Path(__file__).resolve().parents[3]

CTX = InventoryContext(sharing="Exclusive")


def _read(tmp_path: Path, machine: str, mig: str | None = None) -> tuple[Inventory, DriverInfo]:
    """The GPUs of a simulated machine, after ``mig apply --name MIG`` (the agent's own command) if given."""
    root = build_fake_host(tmp_path / "host", machine).root
    state = sim_state_file(root, machine)
    if mig:
        config = tmp_path / "mig.yaml"
        config.write_text(build_config().to_yaml())
        done = subprocess.run([sys.executable, "-m", "node_agent", "--host-root", str(root), "--nvml",
                               f"simulated:{machine}", "mig", "apply", "--config", str(config), "--name", mig],
                              capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    with open_nvml(NvmlBackend("simulated", machine, state)) as nvml:
        return nvml.inventory(), nvml.driver()


@pytest.fixture
def dgx(tmp_path: Path) -> tuple[Inventory, DriverInfo]:
    return _read(tmp_path, "dgx-h100")


def _validator() -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


def test_a_gpu_object_says_what_nvml_says_and_fits_the_crd(dgx: tuple[Inventory, DriverInfo]) -> None:
    inv, driver = dgx
    status = inventory.gpu_status(inv.gpus[0], driver, CTX)
    assert status["productName"] == inv.gpus[0].name and status["model"] == "H100-80GB"
    assert status["pciBusID"] == inv.gpus[0].sysfs_bus_id and status["computeCapability"] == "9.0"
    assert status["mig"] == {"mode": "Disabled"} and status["health"] == {"state": "Healthy"}
    assert status["driverVersion"] == driver.driver_version
    obj: dict[str, Any] = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "n-gpu0"},
           "spec": {"node": "n", "index": 0}, "status": {**status, "health": {"state": "Healthy",
                                                                              "since": "2026-12-03T10:00:00Z"}}}
    _validator().validate(obj)


@pytest.mark.parametrize(("ctx", "expected"), [
    (CTX, [{"name": "nvidia.com/gpu", "count": 1}]),
    (dataclasses.replace(CTX, sharing="TimeSlicing", replicas=4), [{"name": "nvidia.com/gpu", "count": 4}]),
    (dataclasses.replace(CTX, allocation_mode="dra"), [{"name": "gpu.nvidia.com/gpu-0", "count": 1}]),
])
def test_whole_gpus_are_exposed_as_the_device_plugin_or_dra_offers_them(
        dgx: tuple[Inventory, DriverInfo], ctx: InventoryContext, expected: list[dict[str, Any]]) -> None:
    gpu = next(g for g in dgx[0].gpus if g.minor == 0)
    assert inventory.exposed_as(gpu, ctx) == expected


def test_mig_instances_and_their_resources(tmp_path: Path) -> None:
    inv, driver = _read(tmp_path, "dgx-h100", mig="all-3g.40gb")
    gpu = inv.gpus[0]
    status = inventory.gpu_status(gpu, driver, dataclasses.replace(CTX, sharing="MIG", mig_strategy="mixed"))
    assert status["mig"]["mode"] == "Enabled"
    assert [i["profile"] for i in status["mig"]["instances"]] == ["3g.40gb", "3g.40gb"]
    assert status["exposedAs"] == [{"name": "nvidia.com/mig-3g.40gb", "count": 2}]
    single = dataclasses.replace(CTX, sharing="MIG", mig_strategy="single")
    assert inventory.exposed_as(gpu, single) == [{"name": "nvidia.com/gpu", "count": 2}]
    dra = dataclasses.replace(CTX, sharing="MIG", allocation_mode="dra")
    # The DRA plugin's own device names for these instances, under its driver.

    root = tmp_path / "host"
    source = NvmlInventorySource(NvmlBackend("simulated", "dgx-h100", sim_state_file(root, "dgx-h100")),
                                 HostRoot(root))
    try:
        published = {d.name for d in allocatable_devices(source.snapshot())}
    finally:
        source.close()
    exposed = inventory.exposed_as(gpu, dra)
    assert [e["count"] for e in exposed] == [1, 1]
    assert {e["name"].removeprefix("gpu.nvidia.com/") for e in exposed} <= published
    _validator().validate({"spec": {"node": "n", "index": 0}, "status": status})


def test_a_lost_gpu_keeps_what_was_known_and_turns_unhealthy(dgx: tuple[Inventory, DriverInfo]) -> None:
    inv, driver = dgx
    before = inventory.gpu_status(inv.gpus[3], driver, CTX)
    lost = Inventory(tuple(g for g in inv.gpus if g.index != 3), (LostGpu(3, "GPU is lost (NVML error 15)"),))
    want = inventory.desired(lost, driver, CTX, {3: before})
    assert want[3] == {**before, "health": {"state": "Unhealthy", "reason": "GPU is lost (NVML error 15)"}}


def test_the_status_patch_removes_what_is_no_longer_true() -> None:
    old = {"health": {"state": "Unhealthy", "reason": "lost", "since": "t0"}, "memoryMiB": 1, "gone": "x"}
    new = {"health": {"state": "Healthy", "since": "t1"}, "memoryMiB": 1}
    assert inventory._merge_patch(old, new) == {"gone": None, "health": {"state": "Healthy", "reason": None,
                                                                          "since": "t1"}}


class FakeKube:
    """Records the calls; lists what it holds. Enough for the write-only-on-change logic."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def get(self, path: str, *, query: dict[str, str] | None = None, what: str = "") -> Any:
        self.calls.append(("GET", path))
        return {"items": list(self.objects.values())}

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.calls.append((method, path))
        name = path.rsplit("/", 2)[-2] if path.endswith("/status") else path.rsplit("/", 1)[-1]
        if method == "POST":
            self.objects[body["metadata"]["name"]] = {**body, "status": {}}
        elif method == "PATCH":
            self.objects[name]["status"] = _apply(self.objects[name]["status"], body["status"])
        elif method == "DELETE":
            del self.objects[name]
        return None


def _apply(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            out[k] = _apply(out.get(k) or {}, v)
        else:
            out[k] = v
    return out


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    yield FakeKube()


def test_sync_creates_then_writes_only_changes_then_deletes(kube: FakeKube, dgx: tuple[Inventory, DriverInfo]) -> None:
    inv, driver = dgx
    times = iter(datetime.datetime(2026, 12, 3, 10, 0, i, tzinfo=datetime.UTC) for i in range(10))

    def sync(i: Inventory) -> inventory.SyncResult:
        return inventory.sync(kube, "n", i, driver, CTX, node_uid=lambda: "uid-1", now=lambda: next(times))  # type: ignore[arg-type]

    first = sync(inv)
    assert first.created == tuple(api.object_name("n", i) for i in range(8))
    assert kube.objects["n-gpu0"]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert kube.objects["n-gpu0"]["status"]["health"] == {"state": "Healthy", "since": "2026-12-03T10:00:00Z"}
    kube.calls.clear()
    assert not sync(inv).changed and kube.calls == [("GET", api.collection_path())]  # one list, no write
    lost = Inventory(inv.gpus[:7], (LostGpu(7, "GPU is lost"),))
    assert sync(lost).updated == ("n-gpu7",)
    assert kube.objects["n-gpu7"]["status"]["health"]["state"] == "Unhealthy"
    assert kube.objects["n-gpu0"]["status"]["health"]["since"] == "2026-12-03T10:00:00Z", "unchanged, kept"
    assert sync(Inventory(inv.gpus[:6])).deleted == ("n-gpu6", "n-gpu7")
    assert sorted(kube.objects) == [api.object_name("n", i) for i in range(6)]


def test_a_kept_listing_spares_the_list_until_a_write_or_the_resync(
        kube: FakeKube, dgx: tuple[Inventory, DriverInfo]) -> None:
    """At rest the labeller lists its GPU objects once per resync, not once a run; a write is followed by
    a list that confirms what landed."""
    inv, driver = dgx
    clock = [0.0]
    listing = inventory.Listing(resync_s=600, clock=lambda: clock[0])
    stamp = datetime.datetime(2026, 12, 3, 10, 0, 0, tzinfo=datetime.UTC)

    def sync(i: Inventory) -> inventory.SyncResult:
        return inventory.sync(kube, "n", i, driver, CTX, node_uid=lambda: "uid-1", now=lambda: stamp,  # type: ignore[arg-type]
                              listing=listing)

    assert sync(inv).created  # listed, then created: the listing is dropped
    kube.calls.clear()
    for _ in range(5):
        clock[0] += 60
        assert not sync(inv).changed
    assert kube.calls == [("GET", api.collection_path())]  # the list after the writes, then nothing
    clock[0] += 600
    kube.calls.clear()
    assert not sync(inv).changed and kube.calls == [("GET", api.collection_path())]  # the resync
    lost = Inventory(inv.gpus[:7], (LostGpu(7, "GPU is lost"),))
    kube.calls.clear()
    assert sync(lost).updated == ("n-gpu7",) and [m for m, _ in kube.calls] == ["PATCH"]  # from the kept list


def test_the_crd_is_cluster_scoped_with_a_status_subresource_and_kubectl_columns() -> None:
    c = crd()
    assert c["metadata"]["name"] == api.CRD_NAME == "gpus.gpu.nvidia-gpu.io"
    assert c["spec"]["scope"] == "Cluster"
    (version,) = c["spec"]["versions"]
    assert version["subresources"] == {"status": {}} and version["storage"]
    assert [col["name"] for col in PRINTER_COLUMNS if not col.get("priority")] == [
        "Node", "Index", "Model", "Memory(MiB)", "MIG", "Health", "Age"]


T0 = datetime.datetime(2026, 12, 3, 10, 0, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(("xid", "after_s", "state"), [
    (48, 10, "Unhealthy"),   # a double-bit ECC error, within the quiet period
    (48, 60, "Healthy"),     # the quiet period passed: the device plugin trusts the GPU again too
    (13, 1, "Healthy"),      # an application's graphics engine exception: the GPU is fine
])
def test_the_last_xid_shows_and_a_critical_one_keeps_the_gpu_unhealthy_for_the_quiet_period(
        dgx: tuple[Inventory, DriverInfo], xid: int, after_s: int, state: str) -> None:
    inv, driver = dgx
    now = T0 + datetime.timedelta(seconds=after_s)
    want = inventory.desired(inv, driver, CTX, {}, xids={2: XidSeen(xid, T0)}, now=now)
    health = want[2]["health"]
    assert (health["state"], health["lastXID"], health["lastXIDTime"]) == (state, xid, "2026-12-03T10:00:00Z")
    assert ("reason" in health) == (state == "Unhealthy")
    if state == "Unhealthy":
        assert health["reason"] == "critical XID 48 less than 60s ago"
    assert all(want[i]["health"] == {"state": "Healthy"} for i in want if i != 2)
    _validator().validate({"spec": {"node": "n", "index": 2}, "status": {**want[2], "health": {
        **health, "since": "2026-12-03T10:00:00Z"}}})


def test_a_restarted_labeller_keeps_the_last_xid_the_object_shows(dgx: tuple[Inventory, DriverInfo]) -> None:
    inv, driver = dgx
    shown = {"health": {"state": "Unhealthy", "lastXID": 79, "lastXIDTime": "2026-12-03T10:00:00Z"}}
    soon = inventory.desired(inv, driver, CTX, {5: shown}, now=T0 + datetime.timedelta(seconds=5))
    assert soon[5]["health"] == {"state": "Unhealthy", "lastXID": 79, "lastXIDTime": "2026-12-03T10:00:00Z",
                                 "reason": "critical XID 79 less than 60s ago"}
    newer = XidSeen(13, T0 + datetime.timedelta(seconds=30))
    later = inventory.desired(inv, driver, CTX, {5: shown}, xids={5: newer}, now=T0 + datetime.timedelta(seconds=31))
    assert later[5]["health"] == {"state": "Healthy", "lastXID": 13, "lastXIDTime": "2026-12-03T10:00:30Z"}
    lost = Inventory(tuple(g for g in inv.gpus if g.index != 5), (LostGpu(5, "GPU is lost"),))
    gone = inventory.desired(lost, driver, CTX, {5: shown}, now=T0)
    assert gone[5]["health"] == {"state": "Unhealthy", "reason": "GPU is lost", "lastXID": 79,
                                 "lastXIDTime": "2026-12-03T10:00:00Z"}


def test_the_recorder_sees_xids_while_other_sessions_come_and_go(tmp_path: Path) -> None:
    """An event set held open in a thread, and the labelling runs opening and closing NVML beside it: the
    simulator, like a real process's one libnvidia-ml, keeps the held session's handles across them."""
    root = build_fake_host(tmp_path / "host", "dgx-h100").root
    backend = NvmlBackend("simulated", "dgx-h100", sim_state_file(root, "dgx-h100"))
    raised = threading.Event()
    recorder = XidRecorder(lambda: open_nvml(backend), raised.set, clock=lambda: T0)
    recorder.start()
    try:
        assert recorder.wait_watching(10)
        for _ in range(3):  # labelling runs meanwhile
            with open_nvml(backend) as nvml:
                assert len(nvml.inventory().gpus) == 8
        machine = SimulatedMachine("dgx-h100", backend.state_file)
        with open_nvml(backend) as nvml:  # raised while a labelling run has NVML open
            machine.inject_xid(6, 13)
            machine.inject_xid(3, 48, gi_id=1, ci_id=0)
            assert raised.wait(3), "the held event set saw the XID"
            assert len(nvml.inventory().gpus) == 8
        deadline = time.monotonic() + 10
        while len(recorder.seen()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert recorder.seen() == {6: XidSeen(13, T0), 3: XidSeen(48, T0)}
        assert not recorder.seen()[6].critical and recorder.seen()[3].critical
    finally:
        recorder.stop()


def test_every_gpu_object_shows_the_nodes_driver_modules_and_upgrade(dgx: tuple[Inventory, DriverInfo]) -> None:
    """The kernel modules and the driver upgrade's state are the node's: on each GPU's object, a lost one's
    too, within the CRD's schema; once the upgrade is done and its label gone, the patch removes them."""
    inv, driver = dgx
    failing = inventory.NodeDriver("open", "upgrade-failed", "drain did not finish within 1800 s", "unusable",
                                   ("driver-mismatch",))
    lost = Inventory(tuple(g for g in inv.gpus if g.index != 3), (LostGpu(3, "GPU is lost (NVML error 15)"),))
    before = {3: inventory.gpu_status(inv.gpus[3], driver, CTX)}
    want = inventory.desired(lost, driver, CTX, before, node=failing)
    assert len(want) == len(inv.gpus)
    for status in want.values():
        assert status["kernelModules"] == "open"
        assert status["driverUpgrade"] == {"state": "upgrade-failed", "reason": "drain did not finish within 1800 s"}
        assert status["nodeCheck"] == {"verdict": "unusable", "reasons": ["driver-mismatch"]}
        _validator().validate({"spec": {"node": "n", "index": 0}, "status": status})
    done = inventory.desired(inv, driver, CTX, {}, node=inventory.NodeDriver("proprietary"))
    patch = inventory._merge_patch(want[0], done[0])
    assert patch["driverUpgrade"] is None and patch["nodeCheck"] is None and patch["kernelModules"] == "proprietary"
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate({"spec": {"node": "n", "index": 0}, "status": {**done[0], "kernelModules": "nouveau"}})


def test_a_mig_gpu_nvml_will_not_describe_keeps_its_object_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read without the MIG monitor capability, a GPU in MIG mode answers NO_PERMISSION for its memory and
    MIG devices (NVIDIA/k8s-device-plugin#1683). Its object stays (not deleted, not "lost"), healthy, with
    ``unreadable`` saying what is missing and why, and it fits the CRD."""
    monkeypatch.delenv(MIG_MONITOR_ENV, raising=False)
    root = build_fake_host(tmp_path / "host", "dgx-h100").root
    backend = NvmlBackend("simulated", "dgx-h100", sim_state_file(root, "dgx-h100"))
    with open_nvml(backend) as nvml:
        nvml.set_mig_mode(3, True)
        gi = nvml.create_gpu_instance(3, 9)
        nvml.create_compute_instance(3, gi.id)
    SimulatedMachine("dgx-h100", backend.state_file).require_mig_monitor()
    with open_nvml(backend) as nvml:
        inv, driver = nvml.inventory(), nvml.driver()
    want = inventory.desired(inv, driver, CTX, {})
    assert sorted(want) == list(range(8))
    status = want[3]
    assert status["health"]["state"] == "Healthy" and status["mig"]["mode"] == "Enabled"
    assert [u.split(":")[0] for u in status["unreadable"]] == ["memory", "MIG devices"]
    assert "NVIDIA_MIG_MONITOR_DEVICES=all" in status["unreadable"][0]
    assert all("unreadable" not in want[i] for i in range(8) if i != 3)
    validator = _validator()
    for s in want.values():
        validator.validate({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"},
                            "spec": {"node": "n", "index": 0}, "status": s})
    assert "unreadable" in SCHEMA["properties"]["status"]["properties"]


class _NoEventSets:
    """A session on a driver without event sets: every ``watch_events`` is NOT_SUPPORTED (NVML code 3)."""

    calls = 0

    def __enter__(self) -> _NoEventSets:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def watch_events(self, *args: object, **kwargs: object) -> None:
        type(self).calls += 1
        raise NvmlNotSupported("nvmlEventSetCreate: Not Supported (NVML error 3)", 3)


def test_a_driver_without_event_sets_is_said_once_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    """NVIDIA's mock (and some drivers) answer NOT_SUPPORTED for event sets: the recorder says so once and
    ends, where it used to warn every few seconds for the agent's life."""
    recorder = XidRecorder(lambda: cast(Any, _NoEventSets()), lambda: None)
    with caplog.at_level(logging.WARNING, logger="node_agent.nvml.xidwatch"):
        recorder.start()
        recorder._thread.join(timeout=5)
    assert not recorder._thread.is_alive()
    assert _NoEventSets.calls == 1
    assert [r.getMessage() for r in caplog.records if "xid-watch" in r.getMessage()] == [
        "event=xid-watch-unsupported reason=nvmlEventSetCreate: Not Supported (NVML error 3) "
        "detail=XIDs are not recorded on this node"]
    assert recorder.seen() == {}
