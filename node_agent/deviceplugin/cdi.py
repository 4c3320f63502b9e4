"""The CDI spec file for the plugin's devices (``k8s.device-plugin.nvidia.com/gpu``).

With the ``cdi-annotations`` or ``cdi-cri`` strategies, Allocate answers with fully qualified CDI
names and the container runtime resolves them from spec files in ``/var/run/cdi``. The plugin writes
that file itself at every start: one device per UUID and per NVML index (so either device-ID strategy
resolves), each with its device nodes, plus the control nodes shared by all and the driver's files and
toolkit hooks found under the driver root (``node_agent.cdi.driveredits``), so the container needs no
NVIDIA runtime. The document follows the
CDI JSON schema (``cncf-tags/container-device-interface`` ``schema/schema.json``), which the tests
validate against. Writes are atomic and skipped when nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from node_agent.cdi.driveredits import host_path as _host
from node_agent.cdi.spec import ContainerEdits, DeviceNode
from node_agent.deviceplugin.config import Settings
from node_agent.deviceplugin.devices import CONTROL_DEVICES, HostFiles, device_node_present
from node_agent.deviceplugin.resources import PluginDevice, Resource, imex_channel_path
from nvgpu.nodescripts import facts

#: The fully qualified names Allocate answers with (``KIND=DEVICE``) are this file's devices.
CDI_VENDOR = "k8s.device-plugin.nvidia.com"
CDI_CLASS = "gpu"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
CDI_IMEX_KIND = f"{CDI_VENDOR}/imex-channel"
CDI_VERSION = "0.5.0"
CDI_SPEC_DIR = facts.CDI_DYNAMIC_DIR
SPEC_FILE = f"{CDI_SPEC_DIR}/{CDI_VENDOR}-{CDI_CLASS}.yaml"
IMEX_SPEC_FILE = f"{CDI_SPEC_DIR}/{CDI_VENDOR}-imex-channel.yaml"


def _node(path: str, dev_root: str) -> dict[str, Any]:
    return {"path": path, "hostPath": _host(dev_root, path), "permissions": "rw"}


def discovery_root(settings: Settings, host_root: Path) -> Path:
    """Where the plugin sees the driver's files: ``containerDriverRoot`` when the node's driver root is
    mounted there (the DaemonSets mount it at ``/driver-root``; a path of this process, not under the host
    root), else ``nvidiaDriverRoot`` under the host root (a plugin run on the host). The spec always names
    the files by their host path under ``nvidiaDriverRoot``."""
    mounted = Path(settings.container_driver_root)
    try:
        if mounted.is_dir() and any(mounted.iterdir()):
            return mounted
    except OSError:
        pass
    return host_root / settings.nvidia_driver_root.lstrip("/")


def build_spec(resources: Sequence[Resource], settings: Settings, host: HostFiles,
               driver_edits: ContainerEdits | None = None) -> dict[str, Any]:
    """The spec document: devices named by UUID and index, control nodes and driver mounts shared."""
    dev_root = settings.nvidia_dev_root
    physical: dict[str, PluginDevice] = {}
    for r in resources:
        for d in r.devices:
            physical.setdefault(d.uuid, d)
    devices = []
    for d in sorted(physical.values(), key=lambda d: (d.gpu_index, d.index)):
        edits = {"deviceNodes": [_node(p, dev_root) for p in d.paths]}
        for name in (d.uuid, d.index):
            devices.append({"name": name, "containerEdits": edits})
    control = [p for i, p in enumerate(CONTROL_DEVICES) if i == 0 or device_node_present(host, _host(dev_root, p))]
    # The control nodes, then the driver's libraries, binaries and hooks (node_agent.cdi.driveredits).
    common = ContainerEdits(
        env=["NVIDIA_VISIBLE_DEVICES=void"],
        device_nodes=[DeviceNode(path=p, host_path=_host(dev_root, p), permissions="rw") for p in control],
    ).merged(driver_edits)
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices,
            "containerEdits": common.model_dump(by_alias=True, exclude_none=True)}


def build_imex_spec(settings: Settings) -> dict[str, Any] | None:
    if not settings.imex_channel_ids:
        return None
    devices = [{
        "name": str(c),
        "containerEdits": {"deviceNodes": [_node(imex_channel_path(c), settings.nvidia_dev_root)]},
    } for c in settings.imex_channel_ids]
    return {"cdiVersion": CDI_VERSION, "kind": CDI_IMEX_KIND, "devices": devices}


def render(spec: dict[str, Any]) -> str:
    return yaml.safe_dump(spec, sort_keys=False)


def write_specs(resources: Sequence[Resource], settings: Settings, host: HostFiles,
                driver_edits: ContainerEdits | None = None) -> list[str]:
    """Write (or remove) the spec files for the current devices; returns the paths that changed."""
    changed: list[str] = []
    if not settings.uses_cdi:
        return changed
    if host.write_atomic(SPEC_FILE, render(build_spec(resources, settings, host, driver_edits))):
        changed.append(SPEC_FILE)
    imex = build_imex_spec(settings)
    # With no channel (left) to offer, no stale spec naming one stays behind.
    if host.write_atomic(IMEX_SPEC_FILE, render(imex)) if imex is not None else host.remove(IMEX_SPEC_FILE):
        changed.append(IMEX_SPEC_FILE)
    return changed
