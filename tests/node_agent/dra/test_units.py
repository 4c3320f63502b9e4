"""Unit tests: opaque config decoding and precedence, the checkpoint format, CDI specs against the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node_agent.cdi.driveredits import DriverEditsSource
from node_agent.dra import cdi
from node_agent.dra.checkpoint import (
    VERSION,
    CheckpointData,
    CheckpointStore,
    ClaimState,
    PreparedClaim,
    PreparedDevice,
    Recovery,
)
from node_agent.dra.config import ConfigError, GpuConfig, MigDeviceConfig, decode, parse_quantity, resolve
from node_agent.dra.devices import DeviceKind, allocatable_devices
from node_agent.dra.sharing import plan
from node_agent.host import HostRoot
from node_agent.host.atomic import LockTimeout, content_checksum, exclusive_lock
from node_agent.host.driverroot import DriverRoot
from tests.kit.dra_builders import DRIVER, gpu_config, machine
from tests.kit.driverinstall import install_driver
from tests.node_agent.cdi.schema import cdi_validator

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "deviceplugin" / "data"


# -- opaque configs -----------------------------------------------------------------------------------
def test_precedence_class_then_claim_and_specific_beats_general() -> None:
    configs = [
        gpu_config("FromClaim", ["gpu"], {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
        gpu_config("FromClaim", [], {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),
        gpu_config("FromClass", ["gpu"], {"strategy": "MPS"}),
        gpu_config("FromClaim", ["gpu"], {"strategy": "TimeSlicing"}, driver="other.example.com"),
    ]
    cfg = resolve(configs, DRIVER, "gpu", DeviceKind.GPU)
    assert isinstance(cfg, GpuConfig) and cfg.sharing is not None
    assert cfg.sharing.time_slicing_config is not None and cfg.sharing.time_slicing_config.interval.level == 3
    # Another request only sees the general claim config; a subrequest matches its parent request.
    other = resolve(configs, DRIVER, "other", DeviceKind.GPU)
    assert isinstance(other, GpuConfig) and other.sharing and other.sharing.time_slicing_config
    assert other.sharing.time_slicing_config.interval.value == "Short"
    sub = resolve(configs, DRIVER, "gpu/h100", DeviceKind.GPU)
    assert isinstance(sub, GpuConfig) and sub.sharing and sub.sharing.time_slicing_config
    assert sub.sharing.time_slicing_config.interval.value == "Long"


def test_defaults_when_no_config() -> None:
    assert resolve([], DRIVER, "gpu", DeviceKind.MIG) == MigDeviceConfig(api_version="resource.nvidia.com/v1beta1",
                                                                           kind="MigDeviceConfig")


@pytest.mark.parametrize(("params", "needle"), [
    ({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}, "apiVersion: must be resource.nvidia.com/v1beta1"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "TpuConfig"}, "kind: allowed: GpuConfig, MigDeviceConfig"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "extra": 1}, "parameters.extra: unknown field"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Magic"}},
     "sharing.strategy: allowed: 'TimeSlicing' or 'MPS'"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
      "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}},
     "less than or equal to 100"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
      "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1.5Gi"}}}, "whole quantity"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
      "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}}, "only allowed with strategy TimeSlicing"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
      "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}, "sharing.timeSlicingConfig: unknown field"),
    ("GpuConfig", "expected an object"),
])
def test_strict_decoding_names_the_field(params: Any, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        decode(params)
    assert needle in str(e.value)


def test_mps_limits_per_device_by_index_or_uuid() -> None:
    cfg = decode({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "8Gi",
                                         "defaultPerDevicePinnedMemoryLimit": {"GPU-b": "2Gi", "0": "1024Mi"}}}})
    assert isinstance(cfg, GpuConfig) and cfg.sharing and cfg.sharing.mps_config
    assert cfg.sharing.mps_config.pinned_limits_mib(["GPU-a", "GPU-b"]) == {0: 1024, 1: 2048}
    with pytest.raises(ConfigError, match="neither an index below 1"):
        cfg.sharing.mps_config.pinned_limits_mib(["GPU-a"])


@pytest.mark.parametrize(("text", "value"), [("10Gi", 10 * 2**30), ("512M", 512 * 10**6), ("1073741824", 2**30),
                                             (7, 7)])
def test_quantities(text: str | int, value: int) -> None:
    assert parse_quantity(text) == value


# -- checkpoint ---------------------------------------------------------------------------------------
def _store(tmp_path: Path, boot: str = "boot-1") -> CheckpointStore:
    p = tmp_path / "proc/sys/kernel/random/boot_id"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(boot + "\n")
    return CheckpointStore(HostRoot(tmp_path), "/var/lib/nvidia-gpu-agent/dra/checkpoint.json")


def _data() -> CheckpointData:
    return CheckpointData(prepared_claims={"uid-1": PreparedClaim(
        state=ClaimState.PREPARE_COMPLETED, namespace="ns", name="c",
        devices=[PreparedDevice(device="gpu-0", cdi_device_ids=["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"])])})


def test_checkpoint_round_trip_is_versioned_and_checksummed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(_data())
    doc = json.loads(store.file.read_text())
    assert doc["version"] == VERSION and doc["checksum"] == content_checksum(doc["data"])
    assert doc["data"]["nodeBootID"] == "boot-1"
    assert oct(store.file.stat().st_mode & 0o777) == "0o600"
    loaded = store.load()
    assert loaded.recovery is Recovery.NONE and loaded.data.prepared_claims["uid-1"].devices[0].device == "gpu-0"


def test_fields_added_by_a_newer_agent_do_not_break_the_checksum(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(_data())
    doc = json.loads(store.file.read_text())
    doc["data"]["preparedClaims"]["uid-1"]["futureField"] = {"x": 1}
    doc["checksum"] = content_checksum(doc["data"])
    store.file.write_text(json.dumps(doc))
    assert store.load().recovery is Recovery.NONE


@pytest.mark.parametrize("damage", ["truncate", "checksum", "version", "shape"])
def test_damaged_checkpoint_is_set_aside_and_rebuilt(tmp_path: Path, damage: str) -> None:
    store = _store(tmp_path)
    store.save(_data())
    doc = json.loads(store.file.read_text())
    if damage == "truncate":
        store.file.write_text(store.file.read_text()[:20])
    elif damage == "checksum":
        doc["data"]["preparedClaims"]["uid-1"]["name"] = "tampered"
        store.file.write_text(json.dumps(doc))
    elif damage == "version":
        doc["version"] = 99
        store.file.write_text(json.dumps(doc))
    else:
        doc["data"] = {"preparedClaims": {"uid-1": {"state": "Bogus", "devices": []}}}
        doc["checksum"] = content_checksum(doc["data"])
        store.file.write_text(json.dumps(doc))
    spec = cdi.FoundSpec("uid-9", "ns/other", ("gpu-3",), tmp_path / "spec.json")
    loaded = store.load(lambda: [spec], pool="node-a")
    assert loaded.recovery is Recovery.CORRUPTED
    assert store.file.with_name("checkpoint.json.corrupt").exists()
    rebuilt = loaded.data.prepared_claims["uid-9"]
    assert (rebuilt.namespace, rebuilt.name, rebuilt.devices[0].device) == ("ns", "other", "gpu-3")
    assert store.load().recovery is Recovery.NONE  # the rebuilt journal was saved


def test_reboot_discards_and_peek_never_recovers(tmp_path: Path) -> None:
    _store(tmp_path).save(_data())
    after = _store(tmp_path, boot="boot-2")
    assert after.peek() is None
    loaded = after.load()
    assert loaded.recovery is Recovery.REBOOT and loaded.data.prepared_claims == {}


def test_node_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    lock = tmp_path / "prepare.lock"
    with exclusive_lock(lock, timeout_s=1), pytest.raises(LockTimeout), exclusive_lock(lock, timeout_s=0.05):
        pass
    with exclusive_lock(lock, timeout_s=0.05):
        pass


# -- CDI ----------------------------------------------------------------------------------------------
def test_claim_specs_validate_against_the_cdi_schema(tmp_path: Path) -> None:
    validator = cdi_validator()
    install_driver(tmp_path / "driver", "550.54.15")
    driver_files = DriverEditsSource(DriverRoot(tmp_path / "driver"), "/run/nvidia/driver", "/usr/bin/nvidia-cdi-hook",
                                     tmp_path / "driver/usr/bin/nvidia-smi").edits("550.54.15")
    devices = {d.name: d for d in allocatable_devices(machine(gpus=2, mig_on=(1,), vfio=1))}
    mps = decode({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}}})
    assert isinstance(mps, GpuConfig) and mps.sharing
    edits = plan("uid-1", [devices["gpu-0"]], mps.sharing.normalized()).edits
    cases = [
        [cdi.ClaimDevice(devices["gpu-0"], ("gpu",), edits)],
        [cdi.ClaimDevice(devices["gpu-1-mig-1g10gb-19-6"], ("a",)), cdi.ClaimDevice(devices["gpu-0"], ("b",))],
        [cdi.ClaimDevice(devices["gpu-vfio-0"], ("vm",))],
    ]
    host = HostRoot(tmp_path)
    for i, case in enumerate(cases):
        spec = cdi.build_spec(DRIVER, f"uid-{i}", "ns/claim", case, driver_edits=driver_files)
        path = cdi.write_spec(host, DRIVER, f"uid-{i}", spec)
        doc = json.loads((tmp_path / path.lstrip("/")).read_text())
        errors = sorted(validator.iter_errors(doc), key=str)
        assert not errors, errors
        assert len({d["name"] for d in doc["devices"]}) == len(case)
        # Driver files and hooks ride with the control nodes: present unless the claim is VFIO only.
        assert ("hooks" in doc.get("containerEdits", {})) is (i != 2)
    found = cdi.scan_specs(host, DRIVER)
    assert [(f.claim_uid, f.device_names) for f in found][1] == ("uid-1", ("gpu-1-mig-1g10gb-19-6", "gpu-0"))
    assert cdi.delete_spec(host, DRIVER, "uid-0") and not cdi.delete_spec(host, DRIVER, "uid-0")
