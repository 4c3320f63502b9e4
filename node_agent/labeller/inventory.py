"""This node's GPU objects (:mod:`nvgpu.inventory`): created, updated when what NVML says changed, deleted
when a GPU is gone from the node.

The labeller keeps them because it runs on every GPU node of every group, in both allocation modes, and
already reads the GPUs once per interval. It writes with its own pod's identity; the node-confinement
admission policy lets it write only objects of its own node. A GPU NVML reports as lost keeps its object,
marked ``Unhealthy`` with NVML's reason; one that is no longer listed at all is deleted. The objects are
owned by the Node, so the garbage collector removes them with it.

Each object also shows its node's driver: the version NVML reports, the kernel modules loaded (open or
proprietary, from ``/proc/driver/nvidia/version``), node setup's last check (its verdict and reasons, a
declared driver that is not the loaded one among them, from the Node's check labels) and, while the
stack's upgrade controller rolls a driver, the node's upgrade state and why it failed (from the Node's
upgrade label and annotation), so ``kubectl get gpus -o wide`` shows a rollout GPU by GPU.

Each object shows its GPU's last XID and when it was raised (:mod:`node_agent.nvml.xidwatch`); a critical
one (not an application's) keeps the GPU ``Unhealthy`` for the quiet period the device plugin waits before
it trusts the GPU again, so the object and the allocatable count tell the same story. Past that period it
stays ``Unhealthy`` while NVML shows something outstanding (a recovery action, a pending or failed row
remap, a pending retired page: ``NvmlSession.recovery``), as the device plugin holds it; and ``health.needs``
says what it takes (``reset``, ``reboot``, ``replacement`` ...). A recovery action or a failed remap keeps
the GPU ``Unhealthy`` with no XID seen at all (NVIDIA: the GPU must be reset, or rebooted, before new work).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from node_agent.dra.devices import mig_device_name
from node_agent.kube.errors import NotFound
from node_agent.kube.transport import Kube
from node_agent.nvml.types import DriverInfo, Gpu, GpuRecovery, Inventory
from node_agent.nvml.xidwatch import XidSeen, utcnow
from nvgpu import catalogue, inventory

log = logging.getLogger(__name__)

JSON_MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class InventoryContext:
    """What the GPU objects say beyond NVML (the group's sharing and allocation mode; the MIG strategy and
    replicas are filled in from the device plugin's config on each run)."""

    sharing: str
    allocation_mode: str = "devicePlugin"
    dra_driver: str = "gpu.nvidia.com"
    mig_strategy: str = "none"
    replicas: int = 1
    #: Seconds a GPU stays Unhealthy after a critical XID (the device plugin's recovery quiet period).
    xid_quiet_s: float = 60.0


@dataclass(frozen=True)
class NodeDriver:
    """What the node says of its driver beyond NVML: the loaded kernel modules, the upgrade's state."""

    kernel_modules: str | None = None
    upgrade_state: str | None = None
    upgrade_failure: str | None = None
    #: Node setup's last check on the node (its check labels): ``ok`` or ``unusable``, and the reasons.
    check_verdict: str | None = None
    check_reasons: tuple[str, ...] = ()

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.check_verdict:
            out["nodeCheck"] = {"verdict": self.check_verdict, **({"reasons": list(self.check_reasons)}
                                                                   if self.check_reasons else {})}
        if self.kernel_modules:
            out["kernelModules"] = self.kernel_modules
        if self.upgrade_state:
            upgrade = {"state": self.upgrade_state}
            if self.upgrade_failure:
                upgrade["reason"] = self.upgrade_failure
            out["driverUpgrade"] = upgrade
        return out


@dataclass(frozen=True)
class SyncResult:
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


#: Seconds the labeller trusts its last list of the node's GPU objects while it writes none of them.
RESYNC_S = 600.0


@dataclass
class Listing:
    """The node's GPU objects as this labeller last listed them, so a run that finds nothing to change
    costs no request: the objects are this labeller's alone (the node-confinement policy lets no other
    agent write them), so the list is repeated only every ``resync_s`` (to see a hand edit or deletion)
    and after this labeller wrote, to confirm what landed."""

    resync_s: float = RESYNC_S
    clock: Callable[[], float] = time.monotonic
    objects: dict[int, dict[str, Any]] | None = None
    listed_at: float = 0.0
    lists: int = 0  #: lists made (tests, benchmarks)

    def fresh(self) -> dict[int, dict[str, Any]] | None:
        if self.objects is None or self.clock() - self.listed_at >= self.resync_s:
            return None
        return self.objects

    def keep(self, objects: dict[int, dict[str, Any]]) -> None:
        self.objects, self.listed_at = objects, self.clock()
        self.lists += 1

    def drop(self) -> None:
        self.objects = None


TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _stamp(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime(TIME_FORMAT)


def _parsed(text: object) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


def last_xid(recorded: XidSeen | None, status: Mapping[str, Any]) -> XidSeen | None:
    """The newer of what the recorder saw and what the object says already: a restarted labeller (whose
    recorder starts empty) keeps the last XID, and its Unhealthy window, where they were."""
    health = status.get("health") or {}
    xid, at = health.get("lastXID"), _parsed(health.get("lastXIDTime"))
    kept = XidSeen(xid, at) if isinstance(xid, int) and at is not None else None
    if recorded is None or (kept is not None and kept.at > recorded.at):
        return kept
    return recorded


def gpu_health(xid: XidSeen | None, now: datetime.datetime, quiet_s: float,
               recovery: GpuRecovery | None = None) -> dict[str, Any]:
    """Healthy, unless NVML says the GPU must take no new work (a recovery action, a failed remap), or a
    critical XID was raised less than ``quiet_s`` ago or left something NVML still shows outstanding; the
    last XID and what NVML says the GPU needs either way."""
    health: dict[str, Any] = {"state": "Healthy"}
    need = recovery.need if recovery is not None else None
    nvml_says = ", ".join(recovery.reasons) if recovery is not None else ""
    if xid is not None:
        health.update(lastXID=xid.xid, lastXIDTime=_stamp(xid.at))
    if need is not None:
        health["needs"] = need.value
    if recovery is not None and recovery.out_of_service:
        health.update(state="Unhealthy", reason=f"NVML: {nvml_says}")
    elif xid is not None and xid.critical and (now - xid.at).total_seconds() < quiet_s:
        health.update(state="Unhealthy", reason=f"critical XID {xid.xid} less than {quiet_s:g}s ago")
    elif xid is not None and xid.critical and need is not None:
        health.update(state="Unhealthy", reason=f"critical XID {xid.xid}, and NVML: {nvml_says}")
    return health


def exposed_as(gpu: Gpu, ctx: InventoryContext) -> list[dict[str, Any]]:
    """What a workload asks for to get (a share of) ``gpu``: the device plugin's resources, or DRA devices."""
    counts: dict[str, int] = {}
    if gpu.mig_enabled:
        for d in gpu.mig_devices:
            if ctx.allocation_mode == "dra":  # the device the DRA plugin publishes, by its own naming
                name = f"{ctx.dra_driver}/" + mig_device_name(gpu.minor, d.profile, d.gi_profile_id, d.placement.start)
            elif ctx.mig_strategy == "single":
                name = "nvidia.com/gpu"
            else:
                name = "nvidia.com/mig-" + d.profile.replace("+", ".")
            counts[name] = counts.get(name, 0) + 1
    elif ctx.allocation_mode == "dra":
        counts[f"{ctx.dra_driver}/gpu-{gpu.minor}"] = 1
    else:
        counts["nvidia.com/gpu"] = max(1, ctx.replicas)
    return [{"name": n, "count": c} for n, c in sorted(counts.items())]


def gpu_status(gpu: Gpu, driver: DriverInfo | None, ctx: InventoryContext, node: NodeDriver = NodeDriver()
               ) -> dict[str, Any]:
    model = catalogue.identify_model(gpu.pci_device_id, gpu.name)
    mig: dict[str, Any] = {"mode": "Unsupported"}
    if gpu.mig_mode is not None:
        mig = {"mode": "Enabled" if gpu.mig_mode.current else "Disabled"}
        if gpu.mig_mode.change_pending:
            mig["pendingMode"] = "Enabled" if gpu.mig_mode.pending else "Disabled"
        if gpu.mig_enabled:
            mig["instances"] = [{"profile": d.profile, "gpuInstance": d.gi_id, "computeInstance": d.ci_id,
                                 "uuid": str(d.uuid), "memoryMiB": d.memory_mib}
                                for d in sorted(gpu.mig_devices, key=lambda d: (d.gi_id, d.ci_id))]
    status: dict[str, Any] = {
        "uuid": str(gpu.uuid), "pciBusID": gpu.sysfs_bus_id, "productName": gpu.name,
        "model": model.key if model else "", "architecture": gpu.architecture, "memoryMiB": gpu.memory_mib,
        "computeCapability": f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
        "sharing": ctx.sharing, "allocationMode": ctx.allocation_mode, "mig": mig,
        "exposedAs": exposed_as(gpu, ctx), "health": {"state": "Healthy"},
    }
    if gpu.unreadable:  # counted and shown all the same, with what NVML refused and why
        status["unreadable"] = list(gpu.unreadable)
    if driver is not None:
        status["driverVersion"] = driver.driver_version
        status["cudaVersion"] = f"{driver.cuda_driver_version[0]}.{driver.cuda_driver_version[1]}"
    status.update(node.status())
    return status


def desired(inv: Inventory, driver: DriverInfo | None, ctx: InventoryContext, existing: Mapping[int, Mapping[str, Any]],
            *, xids: Mapping[int, XidSeen] | None = None, now: datetime.datetime | None = None,
            node: NodeDriver = NodeDriver(), recoveries: Mapping[int, GpuRecovery] | None = None
            ) -> dict[int, dict[str, Any]]:
    """Per NVML index, the status each GPU's object should have (``existing``: index to current status;
    ``xids``: the recorder's last XID per index; ``recoveries``: what NVML says each GPU still needs). A
    lost GPU keeps what was known of it and is marked unhealthy with NVML's reason."""
    now = now or utcnow()
    xids = xids or {}
    recoveries = recoveries or {}
    out: dict[int, dict[str, Any]] = {}
    for g in inv.gpus:
        out[g.index] = gpu_status(g, driver, ctx, node)
        out[g.index]["health"] = gpu_health(last_xid(xids.get(g.index), existing.get(g.index) or {}), now,
                                            ctx.xid_quiet_s, recoveries.get(g.index))
    for lost in inv.lost:
        before = dict(existing.get(lost.index) or {})
        health: dict[str, Any] = {"state": "Unhealthy", "reason": lost.reason}
        xid = last_xid(xids.get(lost.index), before)
        if xid is not None:
            health.update(lastXID=xid.xid, lastXIDTime=_stamp(xid.at))
        before["health"] = health
        before = {k: v for k, v in before.items() if k not in ("kernelModules", "driverUpgrade", "nodeCheck")}
        before.update(node.status())  # the node's driver state is the node's, lost GPU or not
        out[lost.index] = before
    return out


def _merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch turning ``old`` into ``new`` (keys gone are set to null; lists replaced)."""
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        was = old.get(k)
        if isinstance(v, dict) and isinstance(was, dict):
            sub = _merge_patch(was, v)
            if sub:
                patch[k] = sub
        elif v != was:
            patch[k] = v
    return patch


def _comparable(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status without the time its health state was stamped (that is kept, not compared)."""
    health = {k: v for k, v in (status.get("health") or {}).items() if k != "since"}
    return {**status, "health": health}


def sync(kube: Kube, node: str, inv: Inventory, driver: DriverInfo | None, ctx: InventoryContext, *,
         node_uid: Callable[[], str], xids: Mapping[int, XidSeen] | None = None,
         now: Callable[[], datetime.datetime] = utcnow, node_driver: NodeDriver = NodeDriver(),
         recoveries: Mapping[int, GpuRecovery] | None = None, listing: Listing | None = None) -> SyncResult:
    """Make this node's GPU objects match ``inv``: one list (none while ``listing`` holds a fresh one), then
    a write only where something changed."""
    current = listing.fresh() if listing is not None else None
    if current is None:
        listed = kube.get(inventory.collection_path(), query={"labelSelector": f"{inventory.NODE_LABEL}={node}"},
                          what=f"list GPUs of node {node}") or {}
        current = {int(o["spec"]["index"]): o for o in listed.get("items") or []
                   if o.get("spec", {}).get("node") == node}
        if listing is not None:
            listing.keep(current)
    at = now()
    want = desired(inv, driver, ctx, {i: o.get("status") or {} for i, o in current.items()}, xids=xids, now=at,
                   node=node_driver, recoveries=recoveries)
    created, updated, deleted = [], [], []
    for index, status in sorted(want.items()):
        obj = current.get(index)
        old = dict((obj or {}).get("status") or {})
        health = status["health"]
        before = old.get("health") or {}
        kept = before.get("state") == health["state"] and "since" in before
        health["since"] = before["since"] if kept else _stamp(at)
        if obj is None:
            name = inventory.object_name(node, index)
            kube.request("POST", inventory.collection_path(), {
                "apiVersion": inventory.API_VERSION, "kind": inventory.KIND,
                "metadata": {"name": name, "labels": {inventory.NODE_LABEL: node}, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid()}]},
                "spec": {"node": node, "index": index},
            }, query={"fieldManager": inventory.FIELD_MANAGER}, what=f"create GPU {name}")
            created.append(name)
            old = {}
        elif _comparable(old) == _comparable(status):
            continue
        else:
            updated.append(obj["metadata"]["name"])
        name = inventory.object_name(node, index) if obj is None else obj["metadata"]["name"]
        kube.request("PATCH", inventory.object_path(name) + "/status", {"status": _merge_patch(old, status)},
                     content_type=JSON_MERGE, query={"fieldManager": inventory.FIELD_MANAGER},
                     what=f"update GPU {name} status")
    for index, obj in sorted(current.items()):
        if index in want:
            continue
        name = obj["metadata"]["name"]
        with contextlib.suppress(NotFound):  # gone already (the Node went first)
            kube.request("DELETE", inventory.object_path(name), what=f"delete GPU {name}")
        deleted.append(name)
    result = SyncResult(tuple(created), tuple(updated), tuple(deleted))
    if listing is not None and result.changed:
        listing.drop()  # the next run lists what landed
    if result.changed:
        log.info("event=gpu-inventory node=%s created=%s updated=%s deleted=%s", node, ",".join(created) or "-",
                 ",".join(updated) or "-", ",".join(deleted) or "-")
    return result
