"""End-to-end: the plugin serves real sockets, the kubelet stand-in registers it and prepares claims
whose objects live in a fake API server; CDI specs and the checkpoint land in a fake host root."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from node_agent.dra import cdi
from node_agent.dra.checkpoint import ClaimState
from node_agent.dra.claims import ClaimRef
from node_agent.dra.driver import DraDriver
from node_agent.host import HostRoot
from node_agent.kubelet.dra.server import PluginServer
from tests.kit.dra_builders import DRIVER, NODE, claim, gpu_config
from tests.kit.kubelet.dra import DraKubelet
from tests.node_agent.dra.conftest import Env

MIG_1G = "gpu-1-mig-1g10gb-19-6"


def put_claim(env: Env, body: dict[str, object]) -> tuple[str, str, str]:
    meta = body["metadata"]
    assert isinstance(meta, dict)
    client.ResourceV1Api(env.server.api_client()).create_namespaced_resource_claim(meta["namespace"], cast(Any, body))
    return meta["namespace"], meta["name"], meta["uid"]


def spec_file(env: Env, uid: str) -> Path:
    return env.root / cdi.spec_path(DRIVER, uid).lstrip("/")


def checkpoint(env: Env) -> dict[str, object]:
    data = json.loads((env.root / "var/lib/nvidia-gpu-agent/dra/checkpoint.json").read_text())
    claims = data["data"]["preparedClaims"]
    assert isinstance(claims, dict)
    return claims


def test_registration_lists_v1_first_and_serves_both_versions(env: Env, plugin: tuple[PluginServer, DraKubelet]
                                                              ) -> None:
    server, kubelet = plugin
    assert kubelet.plugins[DRIVER].version == "v1.DRAPlugin"
    assert kubelet.plugins[DRIVER].endpoint == f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock"
    assert server.registration.registered
    old = DraKubelet(env.root, known_versions=("v1beta1.DRAPlugin",))
    assert old.register().version == "v1beta1.DRAPlugin"
    ref = put_claim(env, claim("old", "uid-old", [("gpu", "gpu-0")]))
    resp = old.prepare(DRIVER, [ref])
    assert resp.claims["uid-old"].devices[0].device_name == "gpu-0"
    old.close()


def test_full_gpu_prepare_and_unprepare(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ref = put_claim(env, claim("one-gpu", "uid-1", [("gpu", "gpu-0")]))
    resp = kubelet.prepare(DRIVER, [ref])
    entry = resp.claims["uid-1"]
    assert entry.error == ""
    [dev] = entry.devices
    assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["gpu"], NODE, "gpu-0")
    assert list(dev.cdi_device_ids) == ["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"]
    spec = json.loads(spec_file(env, "uid-1").read_text())
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
    assert checkpoint(env)["uid-1"]["state"] == ClaimState.PREPARE_COMPLETED.value  # type: ignore[index]
    again = kubelet.prepare(DRIVER, [ref])
    assert again.claims["uid-1"] == entry
    assert kubelet.unprepare(DRIVER, [ref]).claims["uid-1"].error == ""
    assert not spec_file(env, "uid-1").exists()
    assert checkpoint(env) == {}


def test_mig_device(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ref = put_claim(env, claim("mig", "uid-mig", [("mig", MIG_1G)]))
    entry = kubelet.prepare(DRIVER, [ref]).claims["uid-mig"]
    assert entry.error == ""
    nodes = json.loads(spec_file(env, "uid-mig").read_text())["devices"][0]["containerEdits"]["deviceNodes"]
    paths = [n["path"] for n in nodes]
    assert paths[0] == "/dev/nvidia1" and all(p.startswith("/dev/nvidia-caps/") for p in paths[1:]) and len(paths) == 3
    # The MIG-enabled GPU is not offered as a whole GPU as well.
    whole = put_claim(env, claim("whole", "uid-whole", [("gpu", "gpu-1")]))
    assert "not published by this node" in kubelet.prepare(DRIVER, [whole]).claims["uid-whole"].error


def test_vfio_device(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ref = put_claim(env, claim("vm", "uid-vfio", [("vm", "gpu-vfio-0")]))
    entry = kubelet.prepare(DRIVER, [ref]).claims["uid-vfio"]
    assert entry.error == ""
    spec = json.loads(spec_file(env, "uid-vfio").read_text())
    assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == ["/dev/vfio/vfio",
                                                                                          "/dev/vfio/40"]
    assert "containerEdits" not in spec  # no nvidiactl/uvm for a passthrough-only claim


def test_shared_claim_prepared_once_for_two_pods(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ref = put_claim(env, claim("shared", "uid-shared", [("gpu", "gpu-0")]))
    first = kubelet.prepare(DRIVER, [ref]).claims["uid-shared"]
    second = kubelet.prepare(DRIVER, [ref]).claims["uid-shared"]
    assert first == second and first.error == ""
    assert len(list((env.root / "var/run/cdi").glob("*.json"))) == 1
    assert kubelet.unprepare(DRIVER, [ref]).claims["uid-shared"].error == ""
    assert kubelet.unprepare(DRIVER, [ref]).claims["uid-shared"].error == ""  # idempotent


def test_claim_with_time_slicing_and_mps_configs(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ts = put_claim(env, claim("ts", "uid-ts", [("gpu", "gpu-0")], configs=[
        gpu_config("FromClass", [], {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),
        gpu_config("FromClaim", ["gpu"], {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    ]))
    assert kubelet.prepare(DRIVER, [ts]).claims["uid-ts"].error == ""
    uuid0 = env.source.snapshot().gpus[0].uuid
    assert env.sharing.calls == [("compute-mode", uuid0, "DEFAULT"), ("timeslice", uuid0, 3)]
    assert kubelet.unprepare(DRIVER, [ts]).claims["uid-ts"].error == ""
    assert env.sharing.calls[-2:] == [("timeslice", uuid0, 0), ("compute-mode", uuid0, "DEFAULT")]
    env.sharing.calls.clear()
    mps = put_claim(env, claim("mps", "uid-mps", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", ["gpu"], {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                                                "defaultPinnedDeviceMemoryLimit": "10Gi"}})]))
    assert kubelet.prepare(DRIVER, [mps]).claims["uid-mps"].error == ""
    assert env.sharing.calls == [("compute-mode", uuid0, "EXCLUSIVE_PROCESS"),
                                 ("start-mps", "uid-mps", (uuid0,), 50, {0: 10240})]
    edits = json.loads(spec_file(env, "uid-mps").read_text())["devices"][0]["containerEdits"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in edits["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in edits["env"]
    assert edits["mounts"][0]["containerPath"] == "/run/nvidia-gpu-agent/mps/uid-mps/pipe"
    assert (env.root / "run/nvidia-gpu-agent/mps/uid-mps/pipe").is_dir()
    assert kubelet.unprepare(DRIVER, [mps]).claims["uid-mps"].error == ""
    assert ("stop-mps", "uid-mps") in env.sharing.calls
    assert not (env.root / "run/nvidia-gpu-agent/mps/uid-mps").exists()


def test_bad_opaque_config_is_refused_with_the_field_named(env: Env, plugin: tuple[PluginServer, DraKubelet]
                                                           ) -> None:
    _, kubelet = plugin
    ref = put_claim(env, claim("typo", "uid-typo", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", ["gpu"], {"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}})]))
    error = kubelet.prepare(DRIVER, [ref]).claims["uid-typo"].error
    assert "sharing.timeSlicingConfig.intervall: unknown field" in error
    wrong_kind = put_claim(env, claim("kind", "uid-kind", [("mig", MIG_1G)], configs=[gpu_config(
        "FromClaim", [], None)]))
    assert "use MigDeviceConfig" in kubelet.prepare(DRIVER, [wrong_kind]).claims["uid-kind"].error
    assert not list((env.root / "var/run/cdi").glob("*.json"))


def test_double_allocation_is_refused(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    a = put_claim(env, claim("a", "uid-a", [("gpu", "gpu-0")]))
    b = put_claim(env, claim("b", "uid-b", [("gpu", "gpu-0")]))
    admin = put_claim(env, claim("admin", "uid-admin", [("gpu", "gpu-0")], admin=True))
    resp = kubelet.prepare(DRIVER, [a, b, admin])
    assert resp.claims["uid-a"].error == ""
    assert "already prepared for claim team-a/a (uid uid-a)" in resp.claims["uid-b"].error
    assert resp.claims["uid-admin"].error == ""
    # A MIG device and its whole parent GPU overlap too (the parent is offered only after MIG is disabled).
    mig = put_claim(env, claim("m", "uid-m", [("mig", MIG_1G)]))
    assert kubelet.prepare(DRIVER, [mig]).claims["uid-m"].error == ""


def test_claim_checks_uid_allocation_and_pool(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ns, name, _ = put_claim(env, claim("replaced", "uid-new", [("gpu", "gpu-0")]))
    assert "the claim was replaced" in kubelet.prepare(DRIVER, [(ns, name, "uid-old")]).claims["uid-old"].error
    other = put_claim(env, claim("elsewhere", "uid-pool", [("gpu", "gpu-0")], pool="other-node"))
    assert "not this node's pool" in kubelet.prepare(DRIVER, [other]).claims["uid-pool"].error
    body = claim("pending", "uid-pending", [("gpu", "gpu-0")])
    body["status"] = {}
    pending = put_claim(env, body)
    assert "not allocated" in kubelet.prepare(DRIVER, [pending]).claims["uid-pending"].error
    assert "not found" in kubelet.prepare(DRIVER, [("team-a", "ghost", "uid-ghost")]).claims["uid-ghost"].error


def test_restart_between_prepare_and_unprepare(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    server, kubelet = plugin
    ref = put_claim(env, claim("survivor", "uid-s", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", [], {"strategy": "TimeSlicing"})]))
    assert kubelet.prepare(DRIVER, [ref]).claims["uid-s"].error == ""
    kubelet.close()
    server.stop(grace=0.1)
    # The claim is deleted while the plugin is down: unprepare must work from the checkpoint alone.

    client.ResourceV1Api(env.server.api_client()).delete_namespaced_resource_claim("survivor", "team-a")
    restarted = env.new_driver()
    restarted.start()
    server2 = PluginServer(restarted, HostRoot(env.root))
    server2.start()
    try:
        kubelet2 = DraKubelet(env.root)
        kubelet2.register()
        env.sharing.calls.clear()
        assert kubelet2.unprepare(DRIVER, [ref]).claims["uid-s"].error == ""
        uuid0 = env.source.snapshot().gpus[0].uuid
        assert ("timeslice", uuid0, 0) in env.sharing.calls
        assert not spec_file(env, "uid-s").exists()
        kubelet2.close()
    finally:
        server2.stop(grace=0.1)


def test_half_done_prepare_is_rolled_back(env: Env) -> None:
    env.driver.start()
    ref = put_claim(env, claim("crash", "uid-crash", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", [], {"strategy": "MPS"})]))
    env.sharing.fail_on = "start-mps"

    out = env.driver.prepare([ClaimRef(*ref)])
    assert "start-mps failed" in out["uid-crash"].error
    assert ("stop-mps", "uid-crash") in env.sharing.calls  # rolled back at once
    assert not spec_file(env, "uid-crash").exists()
    assert checkpoint(env) == {}
    # A crash after PrepareStarted (simulated by editing the journal) is rolled back on the next start.
    env.sharing.fail_on = ""
    assert env.driver.prepare([ClaimRef(*ref)])["uid-crash"].error == ""
    store = env.driver.state._store
    data = store.load().data
    data.prepared_claims["uid-crash"].state = ClaimState.PREPARE_STARTED
    store.save(data)
    env.sharing.calls.clear()
    env.new_driver().start()
    assert ("stop-mps", "uid-crash") in env.sharing.calls
    assert checkpoint(env) == {}
    assert not spec_file(env, "uid-crash").exists()


def test_reboot_discards_the_checkpoint(env: Env) -> None:
    env.driver.start()

    ref = put_claim(env, claim("before-reboot", "uid-r", [("gpu", "gpu-0")]))
    assert env.driver.prepare([ClaimRef(*ref)])["uid-r"].error == ""
    (env.root / "proc/sys/kernel/random/boot_id").write_text("99999999-aaaa-bbbb-cccc-dddddddddddd\n")
    for f in (env.root / "var/run/cdi").glob("*"):  # /var/run is tmpfs: gone after a reboot
        f.unlink()
    env.sharing.calls.clear()
    driver = env.new_driver()
    driver.start()
    assert driver.state.last_recovery is not None and driver.state.last_recovery.recovery.value == "reboot"
    reasons = [o.raw["reason"] for (r, _ns, _n), o in env.server.emulator.objects.items() if r.plural == "events"]
    assert reasons == ["DRACheckpointDiscarded"]
    assert checkpoint(env) == {}
    # Prepared again from scratch instead of trusting a PrepareCompleted from the previous boot.
    assert driver.prepare([ClaimRef(*ref)])["uid-r"].error == ""
    assert spec_file(env, "uid-r").exists()


def test_corrupted_checkpoint_is_reported_and_rebuilt(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.driver.start()

    ref = put_claim(env, claim("keep", "uid-k", [("gpu", "gpu-0")]))
    assert env.driver.prepare([ClaimRef(*ref)])["uid-k"].error == ""
    path = env.root / "var/lib/nvidia-gpu-agent/dra/checkpoint.json"
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    driver = env.new_driver()
    with caplog.at_level("ERROR"):
        driver.start()
    assert "event=checkpoint-corrupted" in caplog.text
    [event] = [o.raw for (r, _ns, _n), o in env.server.emulator.objects.items() if r.plural == "events"]
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == (
        "DRACheckpointCorrupted", "Warning", NODE)
    assert "rebuilt 1 prepared claim(s)" in event["message"]
    assert path.with_name("checkpoint.json.corrupt").exists()
    [rebuilt] = checkpoint(env)["uid-k"]["devices"]  # type: ignore[index]
    assert rebuilt["physicalUUID"] == env.source.snapshot().gpus[0].uuid
    assert rebuilt["cdiDeviceIDs"] == ["k8s.gpu.nvidia.com/claim=uid-k-gpu-0"]
    # Rebuilt from the claim's CDI spec: the device stays protected against double allocation ...
    other = put_claim(env, claim("thief", "uid-t", [("gpu", "gpu-0")]))
    assert "already prepared" in driver.prepare([ClaimRef(*other)])["uid-t"].error
    # ... and unprepare still cleans up.
    assert driver.unprepare([ClaimRef(*ref)])["uid-k"] == ""
    assert not spec_file(env, "uid-k").exists()


def test_kubelet_deadline_is_respected(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    """A stalled API server must not make the plugin overrun the kubelet's deadline: the answer arrives in
    time, with a per-claim error the kubelet retries, instead of DEADLINE_EXCEEDED for the whole call."""
    _, kubelet = plugin
    ref = put_claim(env, claim("slow", "uid-slow", [("gpu", "gpu-0")]))
    release = threading.Event()

    async def stall(request: object) -> dict[str, object]:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return {}

    env.server.emulator["get", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/slow"] << stall
    env.driver.settings = type(env.driver.settings)(**{**env.driver.settings.__dict__, "deadline_margin": 0.3})
    try:
        started = time.monotonic()
        resp = kubelet.prepare(DRIVER, [ref], timeout=1.5)
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert elapsed < 1.5
    assert resp.claims["uid-slow"].error
    assert not spec_file(env, "uid-slow").exists()
    # The kubelet's own 45 s deadline leaves the driver its 40 s budget.
    assert env.driver._deadline(45.0).remaining() == pytest.approx(40.0, abs=0.5)


def test_registration_socket_is_served_again_when_wiped(env: Env, plugin: tuple[PluginServer, DraKubelet]
                                                        ) -> None:
    server, _ = plugin
    socket = env.root / server.registration_endpoint.lstrip("/")
    socket.unlink()
    end = time.monotonic() + 2
    while not socket.exists() and time.monotonic() < end:
        time.sleep(0.01)
    assert socket.exists()
    again = DraKubelet(env.root)
    assert again.register().name == DRIVER
    again.close()


def test_driver_requires_node_name(env: Env) -> None:
    with pytest.raises(ValueError, match="node name"):
        DraDriver(type(env.driver.settings)(node=""), api=env.driver._api, source=env.source,
                  host=HostRoot(env.root), backend=env.sharing)


def test_missing_device_nodes_refuse_instead_of_caching_an_incomplete_spec(
        env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    (env.root / "dev/nvidia0").unlink()
    (env.root / "dev/nvidia-uvm-tools").unlink()
    ref = put_claim(env, claim("early", "uid-early", [("gpu", "gpu-0")]))
    error = kubelet.prepare(DRIVER, [ref]).claims["uid-early"].error
    assert "device nodes not on the host yet: /dev/nvidia0" in error
    assert not spec_file(env, "uid-early").exists() and checkpoint(env) == {}
    (env.root / "dev/nvidia0").touch()  # the driver finished loading; the kubelet retries
    assert kubelet.prepare(DRIVER, [ref]).claims["uid-early"].error == ""
    common = json.loads(spec_file(env, "uid-early").read_text())["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in common] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]  # absent UVM tools node left out


def test_kubelet_restart_wiping_slices_gets_them_republished(env: Env, plugin: tuple[PluginServer, DraKubelet]
                                                             ) -> None:
    stop = threading.Event()
    loop = threading.Thread(target=env.driver.run_inventory_loop, args=(stop,), daemon=True)
    env.driver.settings = type(env.driver.settings)(**{**env.driver.settings.__dict__, "poll_interval": 0.02})
    loop.start()
    try:
        api = client.ResourceV1Api(env.server.api_client())
        for s in env.server.slices():  # what a starting kubelet does to its node's slices
            api.delete_resource_slice(s["metadata"]["name"])
        DraKubelet(env.root).register()  # ... before it re-registers the plugin
        end = time.monotonic() + 2
        while not env.server.slices() and time.monotonic() < end:
            time.sleep(0.01)
        assert len(env.server.slices()[0]["spec"]["devices"]) == 6
    finally:
        stop.set()
        loop.join(5)


def test_claim_with_several_devices_and_one_mps_daemon(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ref = put_claim(env, claim("multi", "uid-multi", [("train", "gpu-0"), ("infer", MIG_1G)], configs=[
        gpu_config("FromClaim", ["train"], {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30}}),
    ]))
    entry = kubelet.prepare(DRIVER, [ref]).claims["uid-multi"]
    assert entry.error == ""
    assert {(tuple(d.request_names), d.device_name) for d in entry.devices} == {(("train",), "gpu-0"),
                                                                               (("infer",), MIG_1G)}
    assert [c[0] for c in env.sharing.calls] == ["compute-mode", "start-mps"]  # MPS only for the train GPU
    spec = json.loads(spec_file(env, "uid-multi").read_text())
    envs = {d["name"]: d["containerEdits"].get("env", []) for d in spec["devices"]}
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in envs["uid-multi-gpu-0"]
    assert not any(e.startswith("CUDA_MPS") for e in envs[f"uid-multi-{MIG_1G}"])
