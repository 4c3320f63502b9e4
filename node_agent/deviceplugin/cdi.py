"""The CDI spec file for the plugin's devices (``k8s.device-plugin.nvidia.com/gpu``).

With the ``cdi-annotations`` or ``cdi-cri`` strategies, Allocate answers with fully qualified CDI
names and the container runtime resolves them from spec files in ``/var/run/cdi``. The plugin writes
that file itself at every start: one device per UUID and per NVML index (so either device-ID strategy
resolves), each with its device nodes, plus the control nodes shared by all. The document follows the
CDI JSON schema (``cncf-tags/container-device-interface`` ``schema/schema.json``), which the tests
validate against. Writes are atomic and skipped when nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from node_agent.deviceplugin.allocate import CDI_CLASS, CDI_IMEX_KIND, CDI_KIND, CDI_VENDOR
from node_agent.deviceplugin.config import Settings
from node_agent.deviceplugin.devices import CONTROL_DEVICES, HostFiles
from node_agent.deviceplugin.resources import PluginDevice, Resource, imex_channel_path

CDI_VERSION = "0.5.0"
CDI_SPEC_DIR = "/var/run/cdi"
SPEC_FILE = f"{CDI_SPEC_DIR}/{CDI_VENDOR}-{CDI_CLASS}.yaml"
IMEX_SPEC_FILE = f"{CDI_SPEC_DIR}/{CDI_VENDOR}-imex-channel.yaml"


def _host(root: str, path: str) -> str:
    return path if root in ("", "/") else root.rstrip("/") + path


def _node(path: str, dev_root: str) -> dict[str, Any]:
    return {"path": path, "hostPath": _host(dev_root, path), "permissions": "rw"}


#: Where distributions put the driver's user-space libraries (relative to the driver root).
DRIVER_LIB_DIRS: tuple[str, ...] = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                                    "/usr/lib")
#: The compute and utility libraries a CUDA container needs (nvidia-container-toolkit's "compute,utility").
DRIVER_LIBS: tuple[str, ...] = ("libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
                                "libnvidia-nvvm.so", "libnvidia-gpucomp.so", "libnvidia-allocator.so",
                                "libnvidia-cfg.so", "libnvidia-opencl.so")
DRIVER_BINS: tuple[str, ...] = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                                "nvidia-cuda-mps-server")


def driver_files(host: HostFiles, driver_root: str, driver_version: str) -> list[str]:
    """The driver's versioned libraries and tools under ``driver_root``, as host-absolute paths from that
    root (what a CDI spec mounts when the container runtime is not NVIDIA's)."""
    found: list[str] = []
    for d in DRIVER_LIB_DIRS:
        names = set(host.listdir(_host(driver_root, d)))
        for lib in DRIVER_LIBS:
            name = f"{lib}.{driver_version}"
            if name in names:
                found.append(f"{d}/{name}")
        if found:
            break  # one library directory per driver install
    for b in DRIVER_BINS:
        if host.exists(_host(driver_root, f"/usr/bin/{b}")):
            found.append(f"/usr/bin/{b}")
    return found


def discovery_root(host: HostFiles, settings: Settings) -> str:
    """Where to look for the driver's files: ``containerDriverRoot`` when the host's driver root is
    mounted there (as NVIDIA's DaemonSet does, at ``/driver-root``), else ``nvidiaDriverRoot``. The spec
    always names the files by their host path under ``nvidiaDriverRoot``."""
    if host.listdir(settings.container_driver_root):
        return settings.container_driver_root
    return settings.nvidia_driver_root


def build_spec(resources: Sequence[Resource], settings: Settings, host: HostFiles,
               driver_mounts: Sequence[str] = ()) -> dict[str, Any]:
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
    control = [p for i, p in enumerate(CONTROL_DEVICES) if i == 0 or host.exists(_host(dev_root, p))]
    common: dict[str, Any] = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [_node(p, dev_root) for p in control],
    }
    if driver_mounts:
        driver_root = settings.nvidia_driver_root
        common["mounts"] = [
            {"hostPath": _host(driver_root, m), "containerPath": m, "options": ["ro", "nosuid", "nodev", "bind"]}
            for m in driver_mounts
        ]
        # Refresh the container's linker cache so the mounted libraries resolve (what nvidia-ctk's
        # generated specs do); the folders are those the libraries were mounted into.
        folders = sorted({m.rsplit("/", 1)[0] for m in driver_mounts if ".so." in m})
    if driver_mounts and host.exists(settings.nvidia_ctk_path):
        common["hooks"] = [{
            "hookName": "createContainer",
            "path": settings.nvidia_ctk_path,
            "args": ["nvidia-ctk", "hook", "update-ldcache", *(a for f in folders for a in ("--folder", f))],
        }]
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices, "containerEdits": common}


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
                driver_mounts: Sequence[str] = ()) -> list[str]:
    """Write (or remove) the spec files for the current devices; returns the paths that changed."""
    changed: list[str] = []
    if not settings.uses_cdi:
        return changed
    if host.write_text(SPEC_FILE, render(build_spec(resources, settings, host, driver_mounts))):
        changed.append(SPEC_FILE)
    imex = build_imex_spec(settings)
    if imex is not None and host.write_text(IMEX_SPEC_FILE, render(imex)):
        changed.append(IMEX_SPEC_FILE)
    elif imex is None and host.exists(IMEX_SPEC_FILE):
        host.remove(IMEX_SPEC_FILE)  # no channel (left) to offer: no stale spec naming one
        changed.append(IMEX_SPEC_FILE)
    return changed
