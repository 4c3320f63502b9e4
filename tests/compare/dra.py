"""The DRA kubelet plugin side by side: NVIDIA's ``gpu-kubelet-plugin`` and our ``dra-driver`` on one mock
machine, each for its own Node of one real API server (same driver name, so each publishes its own pool),
compared on what the cluster and the kubelet get:

- the ResourceSlices each publishes: driver, pool layout, owner, and per device its name, attributes and
  capacity (node and pool names are the Nodes', so they are compared as "the node's own");
- prepare of the same allocated claim (a ResourceClaim whose status allocates ``gpu-0`` of the plugin's
  pool, read back from the API server by each plugin): the CDI device IDs NodePrepareResources answers,
  and the CDI spec each writes for the claim (the claim's devices' edits: env, device nodes, mounts,
  hooks), claim UIDs and the two CDI roots made comparable.

Both plugins register with a kubelet stand-in that speaks the real ``pluginregistration`` and DRA gRPC
protocols (:class:`tests.kit.kubelet.dra.DraKubelet`). NVIDIA's runs in the mock machine's mount
namespace (:func:`~tests.compare.peers.namespaced`) with the machine's tree as its driver root.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import json_format

from localcluster import Kube
from localcluster.objects import create_kwok_node, wait_for
from tests.compare.peers import REPO, Difference, Machine, edit_items, namespaced, with_mig
from tests.kit.kubelet.dra import DraKubelet

DRIVER = "gpu.nvidia.com"
RESOURCE = "resource.k8s.io/v1"
NAMESPACE = "default"
#: The node name as it appears in the slices and CDI specs, so the two sides compare.
NODE = "<node>"


@dataclass
class Plugin:
    """One running plugin: its Node, work directory (sockets, CDI root, state) and process."""

    side: str
    node: str
    work: Path
    proc: subprocess.Popen[bytes]
    kubelet: DraKubelet
    started: float
    seconds_to_slices: float = 0.0

    cdi_root: Path = Path()

    def log(self) -> str:
        path = self.work / "log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _dirs(work: Path) -> None:
    for sub in ("plugins", "registry", "cdi", "state"):
        (work / sub).mkdir(parents=True, exist_ok=True)


def _argv(m: Machine, side: str, node: str, kubeconfig: Path, work: Path) -> list[str]:
    if side == "nvidia":
        # NVIDIA's flags as its Helm chart sets them for a host driver (driver root = the machine's tree).
        return namespaced(m, [
            str(m.tools / "gpu-kubelet-plugin"), "--node-name", node, "--kubeconfig", str(kubeconfig),
            "--namespace", NAMESPACE, "--cdi-root", str(work / "cdi"),
            "--kubelet-plugins-directory-path", str(work / "plugins"),
            "--kubelet-registrar-directory-path", str(work / "registry"),
            "--nvidia-driver-root", str(m.root), "--container-driver-root", str(m.root),
            "--nvidia-cdi-hook-path", str(m.tools / "nvidia-cdi-hook"),
            "--image-name", "nvcr.io/nvidia/k8s-dra-driver-gpu:v0.4.1"])
    # Ours with the same driver root (where it sees the driver's files, and their path on the node).
    return [sys.executable, "-m", "node_agent", "--host-root", str(m.root), "--driver-root", str(m.root),
            "--nvml", "real", "--node-name", node, "--kubeconfig", str(kubeconfig), "dra-driver",
            "--nvidia-driver-root", str(m.root),
            "--cdi-hook-path", str(m.tools / "nvidia-cdi-hook"), "--cdi-hook-dir", str(m.tools), "--metrics-port", "0"]


#: Where each side writes its CDI specs: NVIDIA's where --cdi-root says; ours in the host's /var/run/cdi.
def _cdi_root(m: Machine, side: str, work: Path) -> Path:
    return work / "cdi" if side == "nvidia" else m.root / "var" / "run" / "cdi"


def slices(kube: Kube, node: str) -> list[dict[str, Any]]:
    return [s for s in kube.list(RESOURCE, "ResourceSlice")
            if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER]


@contextmanager
def running(m: Machine, side: str, kube: Kube, kubeconfig: Path, work: Path) -> Iterator[Plugin]:
    """One side's plugin for its own kwok Node, registered with a kubelet stand-in, until its slices are up."""
    node = f"cmp-{side}-{m.name}-{uuid.uuid4().hex[:6]}"
    create_kwok_node(kube, node)
    _dirs(work)
    with (work / "log").open("w") as log:
        start = time.monotonic()
        proc = subprocess.Popen(_argv(m, side, node, kubeconfig, work), cwd=REPO, env=m.env(),
                                stdout=log, stderr=subprocess.STDOUT)
    # Ours keeps the kubelet's paths under its --host-root (the registry, the plugin socket); NVIDIA's is
    # told the work directory's.
    kubelet = DraKubelet(Path("/"), str(work / "registry")) if side == "nvidia" else DraKubelet(m.root)
    plugin = Plugin(side, node, work, proc, kubelet, start, cdi_root=_cdi_root(m, side, work))
    try:
        try:
            kubelet.register_when_served(timeout=60)
            wait_for(lambda: slices(kube, node) or None, timeout=60, what=f"{side}'s ResourceSlices for {node}")
        except (TimeoutError, AssertionError, grpc.RpcError) as e:
            raise AssertionError(f"{side}'s DRA plugin: {e}\n{plugin.log()}") from None
        plugin.seconds_to_slices = time.monotonic() - start
        yield plugin
    finally:
        kubelet.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for s in slices(kube, node):
            kube.delete(RESOURCE, "ResourceSlice", s["metadata"]["name"])
        kube.delete("v1", "Node", node)


# --- ResourceSlices ------------------------------------------------------------------------------


def slice_items(plugin: Plugin, published: list[dict[str, Any]]) -> dict[str, str]:
    """A plugin's slices as comparable items: pool layout, owner, and each device's attributes and capacity."""
    items: dict[str, str] = {"slices": str(len(published))}
    devices: dict[str, dict[str, Any]] = {}
    for s in published:
        spec = s["spec"]
        pool = dict(spec["pool"])
        pool["name"] = NODE if pool["name"] == plugin.node else pool["name"]
        items["pool"] = json.dumps({k: v for k, v in pool.items() if k != "generation"}, sort_keys=True)
        owners = [{k: v for k, v in o.items() if k in ("apiVersion", "kind", "controller")}
                  | {"name": NODE if o.get("name") == plugin.node else o.get("name")}
                  for o in s["metadata"].get("ownerReferences", [])]
        items["ownerReferences"] = json.dumps(owners, sort_keys=True)
        for key, value in spec.items():
            if key not in ("devices", "pool", "nodeName", "driver"):
                items[f"spec.{key}"] = json.dumps(value, sort_keys=True)
        for d in spec.get("devices") or []:
            devices[d["name"]] = d
    items["devices"] = json.dumps(sorted(devices))
    for name, d in devices.items():
        for key, value in d.items():
            if key in ("attributes", "capacity"):
                for attr, v in value.items():
                    items[f"device.{name}.{key}.{attr}"] = json.dumps(v, sort_keys=True)
            elif key != "name":
                items[f"device.{name}.{key}"] = json.dumps(value, sort_keys=True)
    return items


# --- prepare ---------------------------------------------------------------------------------------


def allocated_claim(kube: Kube, plugin: Plugin, device: str) -> tuple[str, str, str]:
    """A ResourceClaim whose status allocates ``device`` of the plugin's pool, as the scheduler would."""
    name = f"cmp-{plugin.side}-{uuid.uuid4().hex[:6]}"
    claim = kube.create({
        "apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
    kube.patch(RESOURCE, "ResourceClaim", name, {"status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": plugin.node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [plugin.node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}]}},
        NAMESPACE, subresource="status")
    return NAMESPACE, name, claim["metadata"]["uid"]


def _normalize(text: str, plugin: Plugin, m: Machine, claim_uid: str) -> str:
    for old, new in ((claim_uid, "<claim-uid>"), (str(plugin.work), "<work>"), (str(m.root), "<host>"),
                     (str(m.tools), "<tools>"), (plugin.node, NODE)):
        text = text.replace(old, new)
    return text


def _claim_specs(plugin: Plugin, claim_uid: str) -> list[dict[str, Any]]:
    """The CDI specs the plugin wrote for the claim (those naming its UID), parsed."""
    out = []
    for path in sorted(plugin.cdi_root.glob("*")):
        if path.is_file() and claim_uid in path.read_text(errors="replace") + path.name:
            out.append(yaml.safe_load(path.read_text()))
    return out


def prepare_items(kube: Kube, plugin: Plugin, m: Machine, device: str = "gpu-0") -> dict[str, str]:
    """Prepare an allocated claim for ``device`` through the kubelet stand-in; the answer and CDI spec as items."""
    ns, name, uid = allocated_claim(kube, plugin, device)
    try:
        start = time.monotonic()
        response = plugin.kubelet.prepare(DRIVER, [(ns, name, uid)])
        took = time.monotonic() - start
        doc = json.loads(json_format.MessageToJson(response))
        result = doc.get("claims", {}).get(uid, {})
        if result.get("error"):
            raise AssertionError(f"{plugin.side}'s prepare failed: {result['error']}\n{plugin.log()}")
        items = {"prepare.seconds": f"{took:.3f}"}
        for i, dev in enumerate(result.get("devices", [])):
            for key, value in dev.items():
                items[f"prepare.devices[{i}].{key}"] = _normalize(json.dumps(value, sort_keys=True), plugin, m, uid)
        for spec in _claim_specs(plugin, uid):
            norm = json.loads(_normalize(json.dumps(spec, sort_keys=True), plugin, m, uid))
            items["cdi.kind"] = norm.get("kind", "-")
            device_paths: list[str] = []
            for d in norm.get("devices", []):
                edits = d.get("containerEdits") or {}
                items |= edit_items("cdi.device.containerEdits", edits)
                device_paths += [n["path"] for n in edits.get("deviceNodes") or []]
            common = norm.get("containerEdits") or {}
            items |= edit_items("cdi.containerEdits", common)
            # What the container ends up with, whatever each side's spelling: the device nodes of the
            # allocated device, and the files mounted from the driver.
            items["cdi.device.deviceNodes.paths"] = json.dumps(sorted(device_paths))
            items["cdi.mounts.containerPaths"] = json.dumps(sorted(m_["containerPath"] for m_ in
                                                                   common.get("mounts") or []))
        plugin.kubelet.unprepare(DRIVER, [(ns, name, uid)])
        return items
    finally:
        kube.delete(RESOURCE, "ResourceClaim", name, NAMESPACE)


@dataclass(frozen=True)
class Case:
    """A machine state both plugins start on: MIG off, or a layout NVIDIA's mig-parted applied first."""

    name: str
    mig_config: str | None = None


CASES = (Case("full-gpus"), Case("mig-balanced", "all-balanced"))


def device_by_uuid(published: list[dict[str, Any]], uuid_: str) -> str:
    """The name under which a plugin publishes the device with this UUID."""
    for s in published:
        for d in s["spec"].get("devices") or []:
            if d.get("attributes", {}).get("uuid", {}).get("string") == uuid_:
                return str(d["name"])
    raise AssertionError(f"no published device has uuid {uuid_}")


def first_uuid(published: list[dict[str, Any]], kind: str) -> str:
    """The smallest UUID among a plugin's devices of ``kind`` (``gpu``, ``mig``): the device to prepare."""
    found = sorted(d["attributes"]["uuid"]["string"] for s in published for d in s["spec"].get("devices") or []
                   if d.get("attributes", {}).get("type", {}).get("string") == kind)
    if not found:
        raise AssertionError(f"no {kind} device published")
    return str(found[0])


def differences(case: str, ours: Mapping[str, str], theirs: Mapping[str, str]) -> list[Difference]:
    skip = {"prepare.seconds", "seconds-to-slices"}
    return [Difference("dra", case, k, ours.get(k, "-"), theirs.get(k, "-"))
            for k in sorted((set(ours) | set(theirs)) - skip) if ours.get(k, "-") != theirs.get(k, "-")]


def compare(m: Machine, case: Case, kube: Kube, kubeconfig: Path, work: Path) -> dict[str, dict[str, str]]:
    """Both plugins, one after the other, on the machine in ``case``'s state: per side, the slices' and the
    prepared claim's items. The prepared device is the same physical one on both sides (by UUID)."""
    work.mkdir(parents=True, exist_ok=True)
    if case.mig_config:
        m = with_mig(m, case.mig_config, work / "mig-state.json")
    seen: dict[str, dict[str, str]] = {}
    target: str | None = None
    for side in ("ours", "nvidia"):
        with running(m, side, kube, kubeconfig, work / side) as plugin:
            published = slices(kube, plugin.node)
            target = target or first_uuid(published, "mig" if case.mig_config else "gpu")
            items = slice_items(plugin, published)
            items |= prepare_items(kube, plugin, m, device_by_uuid(published, target))
            items["seconds-to-slices"] = f"{plugin.seconds_to_slices:.2f}"
            seen[side] = items
    return seen
