"""Build the ResourceSlices of this node's pool: pure functions from devices to API bodies.

The pool is named after the node, every slice of a change carries the same, bumped ``generation`` and
the pool's ``resourceSliceCount``, and devices are split so that no slice exceeds the API's limits: 128
devices, or 64 when any device carries taints (the 1.35+ rule; applying it on 1.34 too costs nothing).
Slices are owned by the Node object, so deleting a node garbage-collects its slices.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from node_agent.dra.devices import Allocatable

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
MAX_NAME = 253
#: Label on every slice this driver publishes, so cleanup can find them without field selectors.
DRIVER_LABEL = "gpu.nvidia-gpu.io/dra-driver"
NODE_LABEL = "gpu.nvidia-gpu.io/dra-node"


@dataclass(frozen=True)
class NodeRef:
    """The Node the slices belong to (uid empty when unknown: then no owner reference is set)."""

    name: str
    uid: str = ""


def chunk(devices: Sequence[Allocatable]) -> list[list[Allocatable]]:
    """Split devices into slices within the per-slice limit; an empty pool still gets one empty slice."""
    limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS if any(d.taints for d in devices) else MAX_DEVICES_PER_SLICE
    if not devices:
        return [[]]
    return [list(devices[i : i + limit]) for i in range(0, len(devices), limit)]


def slice_name(node: str, driver: str, index: int) -> str:
    """A deterministic, DNS-subdomain name ``<node>-<driver>-<i>``; long names keep a hash suffix."""
    base = re.sub(r"[^a-z0-9.-]", "-", f"{node}-{driver}".lower())
    name = f"{base}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[: MAX_NAME - 12 - len(str(index))]}-{digest}-{index}"


def label_value(text: str) -> str:
    """A label value (63 chars of ``[a-z0-9A-Z._-]``) standing for a driver or node name."""
    if len(text) <= 63:
        return text
    return text[:52] + "-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def build_slices(devices: Sequence[Allocatable], driver: str, node: NodeRef, generation: int) -> list[dict[str, Any]]:
    """The full desired set of ResourceSlice bodies for this node's pool at ``generation``."""
    chunks = chunk(devices)
    out: list[dict[str, Any]] = []
    for i, part in enumerate(chunks):
        meta: dict[str, Any] = {
            "name": slice_name(node.name, driver, i),
            "labels": {DRIVER_LABEL: label_value(driver), NODE_LABEL: label_value(node.name)},
        }
        if node.uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid,
                                        "controller": True}]
        out.append({
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": meta,
            "spec": {
                "driver": driver,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": [d.to_api() for d in part],
            },
        })
    return out


def content_key(slices: Sequence[dict[str, Any]]) -> list[Any]:
    """What must match for two slice sets to be the same publication (everything but the generation)."""
    key = []
    for s in slices:
        spec = dict(s.get("spec") or {})
        pool = dict(spec.get("pool") or {})
        pool.pop("generation", None)
        spec["pool"] = pool
        key.append((s.get("metadata", {}).get("name"), spec))
    return sorted(key, key=lambda kv: str(kv[0]))
