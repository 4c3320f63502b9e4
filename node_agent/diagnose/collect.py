"""What ``diagnose`` reads, section by section (see the package docstring for why each is there).

Every value is read on its own and an error is kept in its place (``{"error": "..."}``), so one missing
symbol, unsupported query or unreadable file costs that value, never the report. Raw files the report
quotes are kept in :attr:`Collector.files` for the bundle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from node_agent.cdi.elf import exported_symbols
from node_agent.host import HostRoot
from node_agent.host.driverroot import DriverRoot
from node_agent.nvml import NvmlBackend, open_nvml
from node_agent.nvml.names import BRANDS, COMPUTE_MODES, recovery_action
from node_agent.nvml.session import NvmlSession
from nvgpu import hostpaths, inventory, yamltext
from nvgpu.nodescripts.facts import STATE_DIR

log = logging.getLogger(__name__)

#: Bumped when a section changes shape, so tools reading bundles can tell.
FORMAT_VERSION = 1
#: Raw files larger than this are summarised (size, sha256-free) instead of quoted.
MAX_FILE_BYTES = 256 * 1024
#: The kernel log read for XIDs, from its end.
MAX_KERNEL_LOG_BYTES = 4 * 1024 * 1024
MAX_XID_LINES = 100
MAX_PROCESSES = 20_000
MAX_STATE_FILES = 500
#: Host files quoted whole: the container runtime's configuration and the NVIDIA runtime's.
RUNTIME_FILES = ("/etc/containerd/config.toml", "/etc/crio/crio.conf", "/etc/nvidia-container-runtime/config.toml",
                 "/etc/docker/daemon.json")
RUNTIME_DIRS = ("/etc/containerd/conf.d", "/etc/crio/crio.conf.d")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
STATE_DIRS = (STATE_DIR, hostpaths.AGENT_RUN_DIR)
KERNEL_LOGS = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")
DEVICE_DIRS = ("/dev", "/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels")
#: Node label and annotation domains the report shows (the GPU stack's; the node's others are not ours).
NODE_KEY_PREFIXES = ("nvidia.com/", "gpu.nvidia-gpu.io/", "node.deckhouse.io/", "update.node.deckhouse.io/",
                     "feature.node.kubernetes.io/")


def _error(e: BaseException) -> dict[str, str]:
    return {"error": f"{type(e).__name__}: {e}" if not str(e) else str(e)}


def _value(read: Callable[[], Any]) -> Any:
    """``read()`` as JSON-able data, or its error in its place."""
    try:
        return _jsonable(read())
    except Exception as e:  # the report keeps going: this value is what failed
        return _error(e)


def _jsonable(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {k: _jsonable(x) for k, x in dataclasses.asdict(v).items()}
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


@dataclasses.dataclass
class Collector:
    """One node's report. ``kube`` and ``node_name`` (both or neither) add the Kubernetes section."""

    host: HostRoot
    driver_root: DriverRoot
    backend: NvmlBackend
    node_name: str | None = None
    kube: Any = None
    #: Host path -> bytes of every file the report read, for the bundle.
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)

    def collect(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "collectedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "node": self.node_name,
            "nvmlBackend": self.backend.kind,
        }
        doc["driver"], doc["gpus"] = self._nvml()
        doc["xids"] = _value(self._xids)
        doc["kernelModules"] = _value(self._modules)
        doc["deviceNodes"] = _value(self._device_nodes)
        doc["deviceHolders"] = _value(self._holders)
        doc["runtime"] = _value(self._runtime)
        doc["cdiSpecs"] = _value(self._cdi_specs)
        doc["agentState"] = _value(self._agent_state)
        doc["kubernetes"] = _value(self._kubernetes) if self.kube is not None and self.node_name else None
        return doc

    # -- files ---------------------------------------------------------------------------------------
    def _read(self, host_path: str, limit: int = MAX_FILE_BYTES) -> bytes | None:
        data = self.host.read_bytes_or_none(host_path)
        if data is not None:
            self.files[host_path] = data[:limit]
        return data

    def _file(self, host_path: str) -> dict[str, Any] | None:
        """A quoted file: its text (cut at :data:`MAX_FILE_BYTES`) and size, or None when absent."""
        data = self._read(host_path)
        if data is None:
            return None
        return {"size": len(data), "text": data[:MAX_FILE_BYTES].decode("utf-8", "replace"),
                "truncated": len(data) > MAX_FILE_BYTES}

    def _listdir(self, host_path: str) -> list[str]:
        try:
            return sorted(self.host.listdir(host_path))
        except (OSError, ValueError):
            return []

    # -- NVML ----------------------------------------------------------------------------------------
    def _nvml(self) -> tuple[Any, Any]:
        try:
            with open_nvml(self.backend) as nvml:
                return self._driver(nvml), self._gpus(nvml)
        except Exception as e:  # NVML itself unavailable: both sections say why
            return _error(e), _error(e)

    def _driver(self, nvml: NvmlSession) -> dict[str, Any]:
        # The library this process loaded (what answered every query below), else the driver root's.
        library = _mapped_library("libnvidia-ml")
        tried: list[str] = []
        if library is None:
            library, tried = self.driver_root.find_library()
        symbols = exported_symbols(library, "nvml") if library is not None else None
        return {
            "driverVersion": _value(lambda: nvml.driver().driver_version),
            "cudaDriverVersion": _value(lambda: ".".join(map(str, nvml.driver().cuda_driver_version))),
            "nvmlVersion": _value(nvml.nvml_version),
            "driverRoot": str(self.driver_root.path),
            "library": str(library) if library is not None else {"error": f"not found in {', '.join(tried)}"},
            "exportedSymbols": symbols if symbols is not None else {
                "error": "no ELF library to read" if library is None else f"{library}: not a readable ELF library"},
            "procVersion": _value(lambda: self._text("/proc/driver/nvidia/version")),
        }

    def _text(self, host_path: str) -> str | None:
        data = self._read(host_path)
        return data.decode("utf-8", "replace") if data is not None else None

    def _gpus(self, nvml: NvmlSession) -> list[dict[str, Any]]:
        return [self._gpu(nvml, index) for index in range(nvml.device_count())]

    def _gpu(self, nvml: NvmlSession, index: int) -> dict[str, Any]:
        def q(name: str, *args: Any) -> Any:
            return nvml.query(index, name, *args)

        out: dict[str, Any] = {"index": index, "identity": _value(lambda: nvml.gpu(index))}
        out["brand"] = _value(lambda: BRANDS.get(int(q("nvmlDeviceGetBrand")), str(q("nvmlDeviceGetBrand"))))
        out["serial"] = _value(lambda: q("nvmlDeviceGetSerial"))
        out["vbios"] = _value(lambda: q("nvmlDeviceGetVbiosVersion"))
        out["persistenceMode"] = _value(lambda: bool(q("nvmlDeviceGetPersistenceMode")))
        out["computeMode"] = _value(lambda: COMPUTE_MODES.get(int(q("nvmlDeviceGetComputeMode")), "unknown"))
        out["migMode"] = _value(lambda: nvml.mig_mode(index))
        out["fabric"] = _value(lambda: nvml.fabric_info(index))
        out["remappedRows"] = _value(lambda: dict(zip(("correctable", "uncorrectable", "pending", "failed"),
                                                      q("nvmlDeviceGetRemappedRows"), strict=True)))
        out["retiredPagesPending"] = _value(lambda: bool(q("nvmlDeviceGetRetiredPagesPendingStatus")))
        out["recoveryAction"] = _value(lambda: recovery_action(nvml, index))
        out["processes"] = _value(lambda: nvml.processes(index))
        out["mig"] = _value(lambda: self._mig(nvml, index))
        return out

    def _mig(self, nvml: NvmlSession, index: int) -> dict[str, Any] | None:
        mode = nvml.mig_mode(index)
        if mode is None:
            return None  # not MIG-capable
        profiles = [{**_jsonable(p), "placements": _value(functools.partial(nvml.possible_placements, index, p.id)),
                     "remaining": _value(functools.partial(nvml.remaining_capacity, index, p.id))}
                    for p in nvml.gpu_instance_profiles(index)]
        instances = [{**_jsonable(gi), "computeInstances": _value(functools.partial(nvml.compute_instances, index,
                                                                                    gi.id))}
                     for gi in (nvml.gpu_instances(index) if mode.current else ())]
        return {"profiles": profiles, "gpuInstances": instances}

    # -- kernel and devices ----------------------------------------------------------------------------
    def _xids(self) -> dict[str, Any]:
        """NVRM Xid lines, newest last: the kernel's own buffer where it can be read, else its log files."""
        source, text = self._kernel_log()
        lines = [ln for ln in text.splitlines() if "NVRM: Xid" in ln]
        return {"source": source, "lines": lines[-MAX_XID_LINES:]}

    def _kernel_log(self) -> tuple[str | None, str]:
        kmsg = self.host.path("/dev/kmsg")
        with contextlib.suppress(OSError):
            if stat.S_ISCHR(kmsg.stat().st_mode):
                return "/dev/kmsg", _drain_kmsg(kmsg)
        for path in KERNEL_LOGS:
            local = self.host.path(path)
            with contextlib.suppress(OSError):
                size = local.stat().st_size
                with local.open("rb") as f:
                    f.seek(max(0, size - MAX_KERNEL_LOG_BYTES))
                    return path, f.read().decode("utf-8", "replace")
        return None, ""

    def _modules(self) -> list[dict[str, Any]]:
        text = self._text("/proc/modules") or ""
        out = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[0].startswith(("nvidia", "vfio")):
                out.append({"name": parts[0], "size": int(parts[1]) if parts[1].isdigit() else parts[1],
                            "refs": int(parts[2]) if parts[2].isdigit() else parts[2],
                            "usedBy": [u for u in parts[3].split(",") if u and u != "-"], "state": parts[4]})
        return out

    def _device_nodes(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for directory in DEVICE_DIRS:
            entries = []
            for name in self._listdir(directory):
                if directory == "/dev" and not name.startswith("nvidia"):
                    continue
                path = f"{directory}/{name}"
                try:
                    st = self.host.path(path).lstat()
                except (OSError, ValueError) as e:
                    entries.append({"path": path, **_error(e)})
                    continue
                kind = ("char" if stat.S_ISCHR(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode)
                        else "symlink" if stat.S_ISLNK(st.st_mode) else "file")
                entry: dict[str, Any] = {"path": path, "type": kind, "mode": oct(stat.S_IMODE(st.st_mode))}
                if kind == "char":
                    entry["device"] = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
                entries.append(entry)
            out[directory] = entries
        return out

    def _holders(self) -> list[dict[str, Any]]:
        """Processes with a ``/dev/nvidia*`` node open (what keeps a reset, a VFIO bind or a driver unload
        waiting), from the host's ``/proc``."""
        out = []
        pids = [p for p in self._listdir("/proc") if p.isdigit()][:MAX_PROCESSES]
        for pid in pids:
            devices = set()
            for fd in self._listdir(f"/proc/{pid}/fd"):
                target = self.host.readlink(f"/proc/{pid}/fd/{fd}")
                if target is not None and target.startswith("/dev/nvidia"):
                    devices.add(target)
            if devices:
                comm = (self.host.read_text_or_none(f"/proc/{pid}/comm") or "").strip()
                out.append({"pid": int(pid), "command": comm, "devices": sorted(devices)})
        return out

    # -- runtime, CDI, agent state -------------------------------------------------------------------------
    def _runtime(self) -> dict[str, Any]:
        files: dict[str, Any] = {path: self._file(path) for path in RUNTIME_FILES}
        for directory in RUNTIME_DIRS:
            for name in self._listdir(directory):
                files[f"{directory}/{name}"] = self._file(f"{directory}/{name}")
        return {path: f for path, f in files.items() if f is not None}

    def _cdi_specs(self) -> list[dict[str, Any]]:
        out = []
        for directory in CDI_DIRS:
            for name in self._listdir(directory):
                path = f"{directory}/{name}"
                data = self._read(path)
                if data is None:
                    continue
                entry: dict[str, Any] = {"path": path, "size": len(data)}
                try:
                    doc = yamltext.load(data.decode("utf-8", "replace"), path)
                    entry["kind"] = doc.get("kind") if isinstance(doc, dict) else None
                    entry["cdiVersion"] = doc.get("cdiVersion") if isinstance(doc, dict) else None
                    devices = doc.get("devices") if isinstance(doc, dict) else None
                    entry["devices"] = [d.get("name") for d in devices or [] if isinstance(d, dict)]
                except yamltext.YamlLoadError as e:
                    entry.update(_error(e))
                out.append(entry)
        return out

    def _agent_state(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for root in STATE_DIRS:
            for path in self._walk(root):
                if len(out) >= MAX_STATE_FILES:
                    return out
                local = self.host.path(path)
                try:
                    st = local.lstat()
                except OSError:
                    continue
                entry: dict[str, Any] = {"path": path, "size": st.st_size,
                                         "modified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))}
                if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_FILE_BYTES:
                    data = self._read(path)
                    if data is not None and path.endswith(".json"):
                        try:
                            entry["json"] = json.loads(data)
                        except ValueError as e:
                            entry.update(_error(e))
                out.append(entry)
        return out

    def _walk(self, root: str) -> Iterator[str]:
        for name in self._listdir(root):
            path = f"{root}/{name}"
            local = self.host.path(path)
            if local.is_dir() and not local.is_symlink():
                yield from self._walk(path)
            elif stat.S_ISREG(local.lstat().st_mode):
                yield path

    # -- Kubernetes ----------------------------------------------------------------------------------
    def _kubernetes(self) -> dict[str, Any]:
        node = self.kube.get(f"/api/v1/nodes/{self.node_name}")
        meta = node.get("metadata") or {}

        def ours(d: Mapping[str, str] | None) -> dict[str, str]:
            return {k: v for k, v in sorted((d or {}).items()) if k.startswith(NODE_KEY_PREFIXES)}

        gpus = _value(lambda: [
            {"name": g["metadata"]["name"], "spec": g.get("spec"), "status": g.get("status")}
            for g in self.kube.items(inventory.collection_path(),
                                     query={"labelSelector": f"{inventory.NODE_LABEL}={self.node_name}"})])
        return {"labels": ours(meta.get("labels")), "annotations": ours(meta.get("annotations")),
                "taints": (node.get("spec") or {}).get("taints") or [],
                "unschedulable": bool((node.get("spec") or {}).get("unschedulable")), "gpuObjects": gpus}


def _mapped_library(stem: str) -> Path | None:
    """The file of a shared library this process has mapped whose name starts with ``stem``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if path.startswith("/") and Path(path).name.startswith(stem):
                return Path(path)
    return None


def _drain_kmsg(path: Path) -> str:
    """What ``/dev/kmsg`` holds now, read without blocking (each reader has its own position: reading
    consumes nothing for anyone else)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records: list[str] = []
    size = 0
    try:
        while size < MAX_KERNEL_LOG_BYTES:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while reading: skip ahead
                    continue
                raise
            if not record:
                break
            size += len(record)
            _, _, message = record.decode("utf-8", "replace").partition(";")
            records.append(message.rstrip("\n"))
    finally:
        os.close(fd)
    return "\n".join(records)


def collect(host: HostRoot, driver_root: DriverRoot, backend: NvmlBackend, *, node_name: str | None = None,
            kube: Any = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The report and the raw files it read."""
    c = Collector(host, driver_root, backend, node_name, kube)
    return c.collect(), c.files
