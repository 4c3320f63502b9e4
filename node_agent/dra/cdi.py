"""Per-claim CDI spec files: one transient spec per prepared claim in ``/var/run/cdi``.

Each claim gets ``/var/run/cdi/<vendor>-claim_<claimUID>.json`` with kind ``<vendor>/claim`` and one device
per allocated device named ``<claimUID>-<device>``, so names are unique per claim and a runtime's spec
cache can never serve one claim's edits to another. The vendor is ``k8s.<driver>`` (``k8s.gpu.nvidia.com``
for the default driver name, as NVIDIA's driver does). The spec's annotations record the claim and its
devices, which lets the driver rebuild its checkpoint from the spec files if the checkpoint is corrupted.

Specs are built with the typed models of ``node_agent.cdi.spec`` and written atomically; the tests validate
them against the upstream schema. The common edits carry the control nodes and, from
``node_agent.cdi.driveredits``, the driver's libraries, binaries and toolkit hooks found under the driver
root, so a workload needs no NVIDIA runtime.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node_agent.cdi.spec import CDI_DIR, CdiDevice, CdiSpec, ContainerEdits, DeviceNode, Mount
from node_agent.dra.devices import Allocatable, DeviceKind
from node_agent.dra.hostfs import HostPaths

__all__ = ["CDI_DIR", "CdiDevice", "CdiSpec", "ClaimDevice", "ContainerEdits", "DeviceNode", "Mount",
           "SharingEdits", "build_spec", "delete_spec", "scan_specs", "write_spec"]

#: 0.6.0 is the lowest version with annotations, the newest field used here.
CDI_VERSION = "0.6.0"
CDI_CLASS = "claim"
CLAIM_ANNOTATION = "nvidia-gpu.io/claim"
DEVICES_ANNOTATION = "nvidia-gpu.io/devices"
#: Control nodes every CUDA container needs, whichever GPU it gets; the first is required, the UVM nodes
#: appear when ``nvidia-uvm`` is loaded and are included when present (a missing node fails the container).
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
#: Runtimes read the specs; only the agent writes them.
SPEC_FILE_MODE = 0o644


@dataclass(frozen=True)
class SharingEdits:
    """Extra container edits a sharing strategy needs (MPS pipe directory and limits)."""

    env: tuple[str, ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()  #: (host path, container path)


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a prepared claim, with the request names the kubelet reports back."""

    device: Allocatable
    requests: tuple[str, ...]
    sharing: SharingEdits = field(default_factory=SharingEdits)


def vendor(driver: str) -> str:
    return f"k8s.{driver}"


def kind(driver: str) -> str:
    return f"{vendor(driver)}/{CDI_CLASS}"


def spec_path(driver: str, claim_uid: str) -> str:
    return f"{CDI_DIR}/{vendor(driver)}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.json"


def device_id(driver: str, claim_uid: str, device_name: str) -> str:
    """The fully qualified CDI device name the kubelet passes to the runtime."""
    return f"{kind(driver)}={claim_uid}-{device_name}"


def _node(path: str) -> DeviceNode:
    return DeviceNode(path=path, host_path=path, permissions="rw")


def missing_device_nodes(host: HostPaths, devices: Sequence[ClaimDevice]) -> list[str]:
    """Nodes the claim needs that are not on the host yet (driver still loading). Prepare refuses then,
    instead of writing a spec without them that runtimes would cache (NVIDIA's driver issue #1380)."""
    needed = [n for cd in devices for n in cd.device.device_nodes]
    if any(cd.device.kind is not DeviceKind.VFIO for cd in devices):
        needed.append(CONTROL_NODES[0])
    return [n for n in dict.fromkeys(needed) if not host.exists(n)]


def build_spec(driver: str, claim_uid: str, claim: str, devices: Sequence[ClaimDevice],
               control_nodes: Sequence[str] = CONTROL_NODES, *,
               driver_edits: ContainerEdits | None = None) -> CdiSpec:
    out = []
    for cd in devices:
        d = cd.device
        env: list[str] = list(d.env) + list(cd.sharing.env)
        if d.kind is not DeviceKind.VFIO:
            env.append(f"NVIDIA_VISIBLE_DEVICES={d.uuid}")
        mounts = [Mount(host_path=h, container_path=c, options=["rw", "nosuid", "nodev", "bind"])
                  for h, c in cd.sharing.mounts]
        out.append(CdiDevice(name=f"{claim_uid}-{d.name}", container_edits=ContainerEdits(
            env=env or None, device_nodes=[_node(p) for p in d.device_nodes], mounts=mounts or None,
        )))
    needs_control = any(cd.device.kind is not DeviceKind.VFIO for cd in devices)
    common = ContainerEdits(
        env=["NVIDIA_DRIVER_CAPABILITIES=compute,utility"], device_nodes=[_node(p) for p in control_nodes],
    ).merged(driver_edits) if needs_control else None
    annotations = {
        CLAIM_ANNOTATION: claim,
        DEVICES_ANNOTATION: json.dumps([cd.device.name for cd in devices], separators=(",", ":")),
    }
    return CdiSpec(cdi_version=CDI_VERSION, kind=kind(driver), annotations=annotations, devices=out,
                   container_edits=common)


def write_spec(host: HostPaths, driver: str, claim_uid: str, spec: CdiSpec) -> str:
    path = spec_path(driver, claim_uid)
    host.write_atomic(path, json.dumps(spec.to_json(), indent=2, sort_keys=True).encode(), mode=SPEC_FILE_MODE)
    return path


def delete_spec(host: HostPaths, driver: str, claim_uid: str) -> bool:
    return host.remove(spec_path(driver, claim_uid))


@dataclass(frozen=True)
class FoundSpec:
    claim_uid: str
    claim: str
    device_names: tuple[str, ...]
    path: Path


def scan_specs(host: HostPaths, driver: str) -> list[FoundSpec]:
    """The claim specs this driver left in ``/var/run/cdi`` (used to rebuild a corrupted checkpoint)."""
    directory = host.path(CDI_DIR)
    prefix = f"{vendor(driver)}-{CDI_CLASS}_"
    found: list[FoundSpec] = []
    if not directory.is_dir():
        return found
    for p in sorted(directory.glob(f"{prefix}*.json")):
        try:
            data = json.loads(p.read_text())
            ann = data.get("annotations") or {}
            names = tuple(json.loads(ann.get(DEVICES_ANNOTATION, "[]")))
            found.append(FoundSpec(p.name[len(prefix) : -len(".json")], str(ann.get(CLAIM_ANNOTATION, "")), names, p))
        except (OSError, ValueError, AttributeError):
            continue
    return found
