"""The device plugin side by side: NVIDIA's ``nvidia-device-plugin`` and our ``device-plugin`` on one mock
machine, each registering with its own kubelet stand-in (the real gRPC protocol), compared on what the
kubelet sees: resource names, device IDs, health and NUMA topology from ListAndWatch, and the Allocate
response (envs, mounts, device specs, annotations, CDI devices) for the same request."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from tests.compare.gfd import DATA
from tests.compare.peers import Difference, Machine, edit_items, for_machine, namespaced
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet

RESOURCE = "nvidia.com/gpu"
#: Device lists NVIDIA's plugin joins in Go map order (a different order on every call), compared as sets.
UNORDERED_ENVS = ("NVIDIA_VISIBLE_DEVICES",)
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
CDI_DIR = "/var/run/cdi"


@dataclass(frozen=True)
class Case:
    name: str
    flags: tuple[str, ...]  #: the same NVIDIA flags for both sides
    config: Path | None = None
    #: A MIG layout NVIDIA's mig-parted applies first (:func:`~tests.compare.peers.with_mig`), and the resource
    #: whose devices are allocated then.
    mig_config: str | None = None
    resource: str = RESOURCE
    #: CDI: both generate a CDI spec from the machine's driver root and hand the kubelet CDI names.
    cdi: bool = False

    def args(self, m: Machine, node_root: str) -> list[str]:
        """The flags for ``m``: the case's, and for CDI the driver root and the hook. ``node_root`` is the
        machine's root as the plugin names node paths: NVIDIA's sees the tree at its place in the real file
        system; ours sees the node through ``--host-root``, where the tree is ``/``."""
        cdi = ["--nvidia-driver-root", node_root, "--container-driver-root", str(m.root),
               "--nvidia-ctk-path", str(m.tools / "nvidia-cdi-hook")] if self.cdi else []
        return [*self.flags, *cdi, *(["--config-file", str(self.config)] if self.config else [])]


CASES = (
    Case("envvar-uuid", ("--device-list-strategy", "envvar", "--device-id-strategy", "uuid")),
    Case("envvar-index", ("--device-list-strategy", "envvar", "--device-id-strategy", "index")),
    Case("volume-mounts", ("--device-list-strategy", "volume-mounts", "--device-id-strategy", "uuid")),
    Case("device-specs", ("--device-list-strategy", "envvar", "--pass-device-specs=true")),
    Case("time-slicing", ("--device-list-strategy", "envvar"), DATA / "nvidia-device-plugin-config-time-slicing.yaml"),
    Case("cdi-annotations", ("--device-list-strategy", "cdi-annotations"), cdi=True),
)
#: On a MIG layout: each profile its own resource (``mixed``, on NVIDIA's ``all-balanced``, allocating the
#: machine's 1-slice profile), or MIG devices as ``nvidia.com/gpu`` (``single``, which needs one profile
#: everywhere: ``all-3g`` is 2 x 3g per GPU). Names as :func:`~tests.compare.peers.for_machine` resolves them.
MIG_CASES = (
    Case("mig-mixed", ("--mig-strategy", "mixed", "--device-list-strategy", "envvar"), mig_config="all-balanced",
         resource="mig-1g"),
    Case("mig-single", ("--mig-strategy", "single", "--device-list-strategy", "envvar"), mig_config="all-3g"),
)


@dataclass
class Seen:
    """What one plugin showed its kubelet."""

    registered: list[str]
    seconds_to_register: float
    devices: dict[str, str]
    topology: dict[str, list[int]]
    allocate: dict[str, Any]
    #: The CDI specs the plugin wrote (CDI strategies), by file name, and what their paths are relative to.
    cdi_specs: dict[str, Any] = field(default_factory=dict)


def _watch(kubelet_dir: Path, argv: list[str], env: dict[str, str], log: Path, *, resource: str = RESOURCE,
           cdi: Path | None = None) -> Seen:
    kubelet = DevicePluginKubelet(kubelet_dir)
    kubelet.start()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    start = time.monotonic()
    try:
        try:
            kubelet.wait_registered({resource}, timeout=30)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text()[-3000:]}") from None
        took = time.monotonic() - start
        time.sleep(0.5)  # a plugin registers its resources one after the other: let the rest arrive
        ep = kubelet.wait_devices(resource, bool, timeout=10)
        ids = sorted(ep.devices)
        response = kubelet.allocate(resource, ids[:2])
        doc = json.loads(json_format.MessageToJson(response.container_responses[0]))
        specs = {p.name: yaml.safe_load(p.read_text()) for p in sorted(cdi.glob("*")) if p.is_file()} if cdi else {}
        return Seen(sorted({r for _, _, r, _ in kubelet.registrations}), took, dict(ep.devices),
                    {k: list(v) for k, v in ep.topology.items()}, doc, specs)
    finally:
        proc.terminate()
        proc.wait(15)
        kubelet.stop()


def nvidia(m: Machine, case: Case, work: Path) -> Seen:
    kubelet = work / "kubelet-nvidia"
    kubelet.mkdir(parents=True, exist_ok=True)
    argv = [str(m.tools / "nvidia-device-plugin"), "--fail-on-init-error=true", *case.args(m, str(m.root))]
    cdi = work / "cdi-nvidia"  # NVIDIA's plugin writes its CDI spec to the fixed /var/run/cdi
    cdi.mkdir(parents=True, exist_ok=True)
    binds = {PLUGIN_DIR: kubelet, CDI_DIR: cdi}
    return _watch(kubelet, namespaced(m, argv, binds), m.env(), work / "nvidia.log",
                  resource=for_machine(m, case.resource), cdi=cdi if case.cdi else None)


def ours(m: Machine, case: Case, work: Path) -> Seen:
    kubelet = work / "kubelet-ours"
    kubelet.mkdir(parents=True, exist_ok=True)
    driver = ["--driver-root", str(m.root)] if case.cdi else []
    hook = ["--cdi-hook-dir", str(m.tools)] if case.cdi else []
    argv = [sys.executable, "-m", "node_agent", "--host-root", str(m.root), *driver, "--nvml", "real",
            "device-plugin", "--socket-dir", str(kubelet), "--metrics-port", "0", "--fail-on-init-error", "true",
            *case.args(m, "/"), *hook]
    cdi = m.root / CDI_DIR.lstrip("/")
    if case.cdi:
        shutil.rmtree(cdi, ignore_errors=True)
    return _watch(kubelet, argv, m.env(), work / "ours.log", resource=for_machine(m, case.resource),
                  cdi=cdi if case.cdi else None)


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(sorted(value, key=lambda v: json.dumps(v, sort_keys=True)), sort_keys=True)
    else:
        out[prefix] = str(value)


#: A CDI annotation key ends in a UUID each Allocate draws (unique per container), on both sides.
_ANNOTATION_UUID = re.compile(r"(cdi\.k8s\.io/[\w.-]+_)[0-9a-f-]{36}$")


def _cdi_items(m: Machine, seen: Seen) -> dict[str, str]:
    """The device plugin's CDI spec: its kind, device names, the common edits and those of the allocated GPUs
    (paths made relative to the machine's tree and the tools directory)."""
    items: dict[str, str] = {}
    allocated = {a.split("=", 1)[1] for v in (seen.allocate.get("annotations") or {}).values() for a in v.split(",")}
    for spec in seen.cdi_specs.values():
        # Node paths relative to the machine's tree (NVIDIA's name it where the tree is; ours as the node's).
        text = json.dumps(spec, sort_keys=True).replace(str(m.tools), "<tools>").replace(str(m.root), "")
        norm = json.loads(text)
        kind = norm.get("kind", "-")
        items[f"cdi.{kind}.devices"] = json.dumps(sorted(d["name"] for d in norm.get("devices") or []))
        common = norm.get("containerEdits") or {}
        items |= edit_items(f"cdi.{kind}.containerEdits", common)
        paths = [n["path"] for n in common.get("deviceNodes") or []]
        for d in norm.get("devices") or []:
            if d["name"] in allocated:
                edits = d.get("containerEdits") or {}
                items |= edit_items(f"cdi.{kind}.device.containerEdits", edits)
                paths += [n["path"] for n in edits.get("deviceNodes") or []]
        # What the container gets, whatever each side's spelling: its device nodes.
        items[f"cdi.{kind}.deviceNodes.paths"] = json.dumps(sorted(set(paths)))
    return items


def _items(m: Machine, seen: Seen) -> dict[str, str]:
    """What the kubelet saw, as comparable items: the ListAndWatch view and the Allocate response's fields."""
    items = {"registered": json.dumps(seen.registered), "deviceIDs": json.dumps(sorted(seen.devices)),
             "health": json.dumps(sorted(set(seen.devices.values()))),
             "topology": json.dumps(seen.topology, sort_keys=True)}
    allocate = dict(seen.allocate)
    if "annotations" in allocate:
        allocate["annotations"] = {_ANNOTATION_UUID.sub(r"\1<uuid>", k): v for k, v in allocate["annotations"].items()}
    _flatten("allocate", allocate, items)
    items |= _cdi_items(m, seen)
    for name in UNORDERED_ENVS:
        key = f"allocate.envs.{name}"
        if key in items:
            items[key] = ",".join(sorted(items[key].split(",")))
    return items


def differences(m: Machine, case: Case, a: Seen, b: Seen) -> list[Difference]:
    """Ours (``a``) against NVIDIA's (``b``), item by item (``-``: the item is absent on that side)."""
    left, right = _items(m, a), _items(m, b)
    return [Difference("device-plugin", f"{m.name}/{case.name}", k, left.get(k, "-"), right.get(k, "-"))
            for k in sorted(set(left) | set(right)) if left.get(k, "-") != right.get(k, "-")]
