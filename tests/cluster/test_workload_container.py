"""A GPU workload in a real container on a runc-default node, from the device plugin's CDI answer alone.

The chain a pod takes with ``deviceListStrategy: cdi-cri``, with real peers at each step: the device plugin
(NVIDIA's mock NVML under a driver root laid out by the real ``cc``/``ldconfig``) registers with the
kubelet stand-in and answers Allocate with CDI device names; the CDI library containerd and CRI-O use
(``cdi-inject``) resolves them from the spec the plugin wrote; runc creates the container and runs the
spec's hooks with the NVIDIA Container Toolkit's real ``nvidia-cdi-hook``. Inside, a probe program loads
``libcuda.so.1`` and ``libnvidia-ml.so.1`` by soname, initialises NVML and counts the GPUs: no NVIDIA
runtime anywhere. Without the hook program the spec falls back to soname mounts, and the probe still works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from node_agent.cdi.driveredits import DriverEditsSource
from node_agent.dra import cdi
from node_agent.dra.devices import allocatable_devices
from node_agent.host import HostRoot
from node_agent.host.driverroot import DriverRoot
from tests.kit.dra_builders import DRIVER, machine
from tests.kit.driverinstall import install_driver
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet
from tests.kit.oci import Runtime, minimal_rootfs
from tests.kit.tools import MOCK_NVML, required_bin

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
VERSION = "550.54.15"  # go-nvml's dgxa100 mock machine
RESOURCE = "nvidia.com/gpu"
DEV_NODES = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def _char_devices(dev_root: Path) -> None:
    """The GPUs' device nodes as real character devices (numbers of /dev/null: runc copies major/minor)."""
    (dev_root / "dev").mkdir(parents=True, exist_ok=True)
    for name in DEV_NODES:
        node = dev_root / "dev" / name
        if not node.exists():
            os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))


def _probe(tmp: Path) -> Path:
    out = tmp / "gpu-probe"
    subprocess.run(["cc", "-O1", "-o", str(out), str(Path(__file__).with_name("gpu_probe.c")), "-ldl"], check=True)
    return out


def _workload(tmp: Path, runtime: Runtime, hook: Path) -> dict[str, Any]:
    mock = required_bin(MOCK_NVML) / MOCK_NVML
    driver = install_driver(tmp / "driver", VERSION, nvml_library=mock.resolve())
    host = tmp / "host"  # the plugin's --host-root: /var/run/cdi, the MPS root
    dev_root = tmp / "devroot"  # the node's dev root as the runtime sees it ...
    _char_devices(dev_root)
    seen = host / str(dev_root).lstrip("/")  # ... and where the plugin, under its host root, sees it
    seen.parent.mkdir(parents=True, exist_ok=True)
    seen.symlink_to(dev_root)
    config = tmp / "plugin.yaml"
    config.write_text(
        "version: v1\nflags:\n"
        f"  nvidiaDriverRoot: {driver.root}\n  nvidiaDevRoot: {dev_root}\n"
        f"  plugin:\n    deviceListStrategy: cdi-cri\n    containerDriverRoot: {driver.root}\n"
        f"    nvidiaCTKPath: {hook}\n")
    sockets = tmp / "device-plugins"
    sockets.mkdir()
    kubelet = DevicePluginKubelet(sockets)
    kubelet.start()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVIDIA_DRIVER_ROOT", "CONFIG_FILE")}
    env.update(PYTHONPATH=str(REPO), MOCK_NVML_MACHINE="dgxa100")
    plugin = subprocess.Popen(
        [sys.executable, "-m", "node_agent", "--host-root", str(host), "--nvml", "real", "--driver-root",
         str(driver.root), "--node-name", "gpu-node", "--log-level", "info", "device-plugin", "--socket-dir",
         str(sockets), "--config-file", str(config), "--metrics-port", "0", "--mps-daemon", "false",
         "--cdi-hook-dir", str(hook.parent)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        kubelet.wait_registered({RESOURCE}, timeout=60)
        kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)
        answer = kubelet.allocate(RESOURCE, [next(iter(kubelet.endpoints[RESOURCE].devices))])
    finally:
        plugin.terminate()
        output = plugin.communicate(timeout=20)[0]
        kubelet.stop()
    names = [d.name for d in answer.container_responses[0].cdi_devices]
    assert names and all(n.startswith("k8s.device-plugin.nvidia.com/gpu=") for n in names), output
    rootfs = minimal_rootfs(tmp / "rootfs", {"/usr/bin/gpu-probe": _probe(tmp)})
    bundle = tmp / "bundle"
    # NVML in the container sees only the GPUs whose device node the runtime created (the mock's device
    # directory: tools/mocknvml/visibility.go), as a workload's nvidia-smi shows exactly its allocation.
    config_json = runtime.bundle(bundle, rootfs, ["/usr/bin/gpu-probe"],
                                 ["MOCK_NVML_MACHINE=dgxa100", "MOCK_NVML_DEV_ROOT=/dev"])
    spec_dir = host / "var/run/cdi"
    oci = runtime.inject(config_json, [spec_dir], names)
    done = runtime.run(bundle)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\nplugin:\n{output}"
    result: dict[str, Any] = json.loads(done.stdout)
    result["oci"] = oci
    return result


def test_a_cuda_container_from_the_cdi_spec_with_the_toolkit_hook(tmp_path: Path) -> None:
    runtime = Runtime.pinned(tmp_path / "runc-state")
    result = _workload(tmp_path, runtime, runtime.hook)
    assert result["libcuda"] and result["libnvidia_ml"], result
    assert (result["nvml_init"], result["device_count_rc"], result["device_count"]) == (0, 0, 1), result
    assert result["dev_nvidia0"] and result["dev_nvidiactl"] and result["nvidia_smi"], result
    # The hooks ran: ldconfig listed the mounted libraries and create-symlinks made the dev link.
    assert result["ld_cache_libcuda"] and result["libcuda_dev_link"], result
    hooks = result["oci"]["hooks"]["createContainer"]
    assert [h["args"][1] for h in hooks] == ["create-symlinks", "update-ldcache"]


def test_without_the_hook_the_libraries_resolve_by_their_soname_mounts(tmp_path: Path) -> None:
    runtime = Runtime.pinned(tmp_path / "runc-state")
    result = _workload(tmp_path, runtime, tmp_path / "no-toolkit/nvidia-cdi-hook")
    assert result["libcuda"] and result["libnvidia_ml"] and result["nvml_init"] == 0, result
    assert result["device_count"] == 1 and result["libcuda_dev_link"], result
    assert not result["ld_cache_libcuda"], result  # the documented cost: no linker cache entry
    assert "hooks" not in result["oci"], result["oci"].get("hooks")


def test_dra_claim_specs_load_in_the_cdi_library(tmp_path: Path) -> None:
    """The DRA plugin's per-claim spec, with the driver edits, as the runtime's CDI cache loads it."""
    runtime = Runtime.pinned(tmp_path / "runc-state")
    driver = install_driver(tmp_path / "driver", VERSION)
    edits = DriverEditsSource(DriverRoot(driver.root), "/run/nvidia/driver", str(runtime.hook),
                              runtime.hook).edits(VERSION)
    devices = {d.name: d for d in allocatable_devices(machine(gpus=2, mig_on=(1,)))}
    claim = [cdi.ClaimDevice(devices["gpu-0"], ("gpu",)), cdi.ClaimDevice(devices["gpu-1-mig-1g10gb-19-6"], ("mig",))]
    host = HostRoot(tmp_path / "host")
    cdi.write_spec(host, DRIVER, "uid-1", cdi.build_spec(DRIVER, "uid-1", "ns/claim", claim, driver_edits=edits))
    listed = runtime.list_devices([tmp_path / "host/var/run/cdi"])
    assert sorted(listed) == sorted(cdi.device_id(DRIVER, "uid-1", d.device.name) for d in claim)
