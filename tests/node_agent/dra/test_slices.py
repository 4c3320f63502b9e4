"""Inventory to ResourceSlices: NVIDIA-compatible attributes, pool/generation rules, limits, health, and
republishing after hardware changes."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import replace

import pytest

from node_agent.dra.devices import (
    Attribute,
    DeviceKind,
    GpuInfo,
    HealthAction,
    Inventory,
    allocatable_devices,
    memory_attribute,
    mig_device_name,
    semver,
)
from node_agent.dra.slices import MAX_DEVICES_PER_SLICE, NodeRef, build_slices, slice_name
from tests.kit.dra_builders import DRIVER, NODE, full_gpu, machine
from tests.node_agent.dra.conftest import Env


def test_full_gpu_attributes_match_nvidia_driver() -> None:
    [dev] = allocatable_devices(machine(gpus=1))
    api = dev.to_api()
    assert api["name"] == "gpu-0"
    assert api["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": dev.uuid},
        "memory": {"int": 81559},  # ours, not NVIDIA's: the capacity in MiB, for attribute selectors
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
    }
    assert api["capacity"] == {"memory": {"value": "81559Mi"}}  # 81559 MiB, in the binary form NVIDIA writes


def test_mig_devices_replace_their_parent_and_carry_profile_and_slices() -> None:
    devices = allocatable_devices(machine(gpus=2, mig_on=(1,)))
    names = [d.name for d in devices]
    assert "gpu-1" not in names
    assert names[1:] == ["gpu-1-mig-3g40gb-9-0", "gpu-1-mig-2g20gb-14-4", "gpu-1-mig-1g10gb-19-6",
                         "gpu-1-mig-1g10gb-19-7"]
    mig = devices[1]
    assert mig.kind is DeviceKind.MIG
    assert mig.attributes["profile"].value == "3g.40gb"
    assert mig.attributes["parentUUID"].value == devices[0].uuid.replace("a000", "a001")
    assert {k for k in mig.capacity if k.startswith("memorySlice")} == {f"memorySlice{i}" for i in range(4)}
    assert mig.capacity["memory"] == 40448 * 2**20
    assert mig.attributes["memory"].to_api() == {"int": 40448}
    assert mig_device_name(0, "1g.10gb+me", 20, 3) == "gpu-0-mig-1g10gb-me-20-3"


def test_vfio_device_attributes() -> None:
    [vfio] = [d for d in allocatable_devices(machine(gpus=0, vfio=1))]
    assert vfio.name == "gpu-vfio-0"
    assert vfio.attributes["type"].value == "vfio"
    assert vfio.attributes["numa"].to_api() == {"int": 0}
    assert vfio.attributes["deviceID"].value == "0x2330"
    assert "addressableMemory" in vfio.capacity
    assert "memory" not in vfio.attributes  # only where the ``memory`` capacity is


def test_memory_attribute_is_the_memory_capacity_in_whole_mib() -> None:
    """Every device with ``memory`` capacity (and only those) carries ``memory`` as an int attribute in MiB,
    rounded down, so ``device.attributes['gpu.nvidia.com'].memory >= 16000`` selects by it."""
    devices = allocatable_devices(machine(gpus=2, mig_on=(1,), vfio=1))
    assert {d.kind for d in devices} == {DeviceKind.GPU, DeviceKind.MIG, DeviceKind.VFIO}
    for d in devices:
        assert ("memory" in d.attributes) == ("memory" in d.capacity), d.name
        if "memory" in d.capacity:
            attr = d.attributes["memory"]
            assert attr.type == "int" and type(attr.value) is int, d.name
            assert attr.value == d.capacity["memory"] // 2**20, d.name
    odd = GpuInfo(index=0, minor=0, uuid="GPU-x", product_name="T", brand="Nvidia", architecture="turing",
                  compute_capability=(7, 5), memory_bytes=15360 * 2**20 + 2**20 - 1, pci_bus_id="0000:01:00.0")
    [d] = allocatable_devices(Inventory("550.54.15", "12.4", gpus=(odd,)))
    assert d.to_api()["attributes"]["memory"] == {"int": 15360}  # type: ignore[index]
    assert memory_attribute(16000 * 2**20) == Attribute("int", 16000)


@pytest.mark.parametrize(("raw", "want"), [("550.54.15", "550.54.15"), ("550.67", "550.67.0"),
                                           ("580.95.05", "580.95.5"), ("12", "12.0.0")])
def test_versions_are_semver(raw: str, want: str) -> None:
    assert semver(raw) == want


def test_bad_version_is_refused() -> None:
    with pytest.raises(ValueError, match="not numeric"):
        semver("550.54.15-beta")


def test_unhealthy_gpu_is_withdrawn_or_tainted() -> None:
    inv = machine(gpus=2, mig_on=(1,))
    lost = replace(inv, gpus=tuple(replace(g, unhealthy="gpu-lost") for g in inv.gpus))
    assert allocatable_devices(lost) == []
    tainted = allocatable_devices(lost, DRIVER, HealthAction.TAINT)
    assert len(tainted) == 5
    assert all(d.to_api()["taints"] == [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}] for d in tainted)
    xid = replace(inv, gpus=(replace(inv.gpus[0], unhealthy="xid", xid=79),))
    [d] = allocatable_devices(xid, DRIVER, HealthAction.TAINT)
    assert d.to_api()["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]


def test_pool_is_split_within_the_device_limit() -> None:
    gpus = tuple(full_gpu(i) for i in range(300))
    devices = allocatable_devices(Inventory("550.54.15", "12.4", gpus=gpus))
    slices = build_slices(devices, DRIVER, NodeRef(NODE, "uid-1"), generation=3)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE, 44]
    for s in slices:
        assert s["spec"]["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 3}
        assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER
        assert s["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    tainted = allocatable_devices(Inventory("550.54.15", "12.4", gpus=tuple(
        replace(g, unhealthy="gpu-lost") for g in gpus)), DRIVER, HealthAction.TAINT)
    assert max(len(s["spec"]["devices"]) for s in build_slices(tainted, DRIVER, NodeRef(NODE), 1)) == 64


def test_empty_node_publishes_one_empty_slice() -> None:
    [s] = build_slices([], DRIVER, NodeRef(NODE), 1)
    assert s["spec"]["devices"] == [] and s["spec"]["pool"]["resourceSliceCount"] == 1


def test_slice_names_are_valid_even_for_long_node_names() -> None:
    name = slice_name("n" * 250, DRIVER, 12)
    assert len(name) <= 253 and name.endswith("-12")


def test_long_product_name_is_truncated_to_the_attribute_limit() -> None:
    too_many = GpuInfo(index=0, minor=0, uuid="GPU-x", product_name="x" * 100, brand="Nvidia", architecture="hopper",
                       compute_capability=(9, 0), memory_bytes=1, pci_bus_id="0000:01:00.0")
    [d] = allocatable_devices(Inventory("550.54.15", "12.4", gpus=(too_many,)))
    assert len(d.attributes["productName"].value) == 64  # type: ignore[arg-type]


def _generations(env: Env) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in env.server.slices()}


def test_start_publishes_and_unchanged_inventory_publishes_nothing(env: Env) -> None:
    pub = env.driver.start()
    assert pub is not None and pub.changed and pub.generation == 1
    [s] = env.server.slices()
    assert [d["name"] for d in s["spec"]["devices"]] == [
        "gpu-0", "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-2g20gb-14-4", "gpu-1-mig-1g10gb-19-6", "gpu-1-mig-1g10gb-19-7",
        "gpu-vfio-0"]
    assert s["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    assert env.driver.refresh() is None
    # A restarted plugin that finds its own slices unchanged does not bump the generation.
    again = env.new_driver().start()
    assert again is not None and not again.changed and _generations(env) == {1}


def test_inventory_changes_republish_within_two_seconds(env: Env) -> None:
    """Within one poll interval (0.5 s here; the DaemonSet's default is 5 s, see DriverSettings)."""
    env.driver.settings = dataclasses.replace(env.driver.settings, poll_interval=0.5)
    env.driver.start()
    stop = threading.Event()
    loop = threading.Thread(target=env.driver.run_inventory_loop, args=(stop,), daemon=True)
    loop.start()
    try:
        started = time.monotonic()
        env.source.set(machine(gpus=2, mig_on=(0, 1), vfio=1))  # MIG reconfiguration of GPU 0
        while _generations(env) != {2} and time.monotonic() - started < 2:
            time.sleep(0.01)
        assert _generations(env) == {2}
        names = [d["name"] for s in env.server.slices() for d in s["spec"]["devices"]]
        assert "gpu-0" not in names and "gpu-0-mig-3g40gb-9-0" in names
        started = time.monotonic()
        env.source.lose(0)  # GPU 0 falls off the bus: it and its MIG devices are withdrawn
        while _generations(env) != {3} and time.monotonic() - started < 2:
            time.sleep(0.01)
        names = [d["name"] for s in env.server.slices() for d in s["spec"]["devices"]]
        assert _generations(env) == {3} and not any(n.startswith("gpu-0") for n in names)
    finally:
        stop.set()
        loop.join(5)


def test_withdraw_deletes_this_nodes_slices(env: Env) -> None:
    env.driver.start()
    assert env.driver.publisher.withdraw() == 1
    assert env.server.slices() == []


def test_resync_restores_slices_deleted_behind_the_drivers_back(env: Env) -> None:
    env.driver.start()
    assert env.driver.publisher.withdraw() == 1  # e.g. the kubelet's 30 s wipe while the plugin hung
    assert env.driver.refresh() is None  # nothing changed locally: no API call at all
    env.driver.resync()
    pub = env.driver.refresh()
    assert pub is not None and pub.changed and len(env.server.slices()) == 1
