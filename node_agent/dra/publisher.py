"""Publishes this node's pool: reconciles the desired ResourceSlices against what the API server holds.

Each publication that changes anything bumps the pool generation past every generation seen, patches
slices that exist, creates missing ones and deletes surplus ones, so consumers that use only the
highest generation never mix two inventories. An unchanged inventory costs one list call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from node_agent.dra.api import DraApi
from node_agent.dra.devices import Allocatable
from node_agent.dra.slices import NodeRef, build_slices, content_key
from node_agent.kube.errors import KubeError, NotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publication:
    generation: int
    slices: int
    devices: int
    changed: bool


class SlicePublisher:
    def __init__(self, api: DraApi, driver: str, node: str) -> None:
        self._api = api
        self._driver = driver
        self._node_name = node
        self._node: NodeRef | None = None
        self._lock = threading.Lock()

    def node_ref(self) -> NodeRef:
        with self._lock:
            return self._node_ref()

    def _node_ref(self) -> NodeRef:
        if self._node is None:
            try:
                self._node = NodeRef(self._node_name, self._api.get_node_uid(self._node_name))
            except KubeError as e:
                log.warning("event=node-uid-unknown node=%s error=%s", self._node_name, e)
                return NodeRef(self._node_name)
        return self._node

    def publish(self, devices: Sequence[Allocatable]) -> Publication:
        with self._lock:
            node = self._node_ref()
            existing = self._api.list_slices(self._driver, self._node_name)
            current = max((int(s.get("spec", {}).get("pool", {}).get("generation") or 0) for s in existing),
                          default=0)
            desired = build_slices(devices, self._driver, node, max(current, 1))
            if existing and content_key(existing) == content_key(desired) and all(
                int(s["spec"]["pool"].get("generation") or 0) == current for s in existing
            ):
                return Publication(current, len(existing), len(devices), changed=False)
            generation = current + 1
            desired = build_slices(devices, self._driver, node, generation)
            have = {s["metadata"]["name"] for s in existing}
            for body in desired:
                name = body["metadata"]["name"]
                if name in have:
                    self._api.patch_slice(name, body)
                else:
                    self._api.create_slice(body)
            for name in sorted(have - {b["metadata"]["name"] for b in desired}):
                with contextlib.suppress(NotFound):  # already gone
                    self._api.delete_slice(name)
            log.info("event=slices-published driver=%s node=%s generation=%d slices=%d devices=%d",
                     self._driver, self._node_name, generation, len(desired), len(devices))
            return Publication(generation, len(desired), len(devices), changed=True)

    def withdraw(self) -> int:
        """Delete every slice of this node's pool (uninstall and tests); returns how many were deleted."""
        with self._lock:
            gone = 0
            for s in self._api.list_slices(self._driver, self._node_name):
                with contextlib.suppress(NotFound):  # already gone
                    self._api.delete_slice(s["metadata"]["name"])
                    gone += 1
            return gone
