"""This node's Node object, kept current by a watch, so an agent that consults it every interval reads
it from memory instead of the API server.

:class:`OwnNodeWatch` is the agent's list-then-watch loop (:class:`~node_agent.kube.watch.ListWatch`)
with the list replaced by one GET of the Node: the role needs ``get`` and ``watch`` on nodes, not
``list``. The watch (``fieldSelector=metadata.name=<node>``, bookmarks on) resumes from the version it
ended at, so at rest it costs one request per ``watch_timeout_s``; a Node change (an operator's hand
edit, the config label switched, the setup gate taken away) reaches :meth:`OwnNodeWatch.current` within
the watch's latency. Where the watch is refused, the GET repeats every ``relist_interval_s`` (the
caller's own interval), as reading on demand did.

:meth:`OwnNodeWatch.offer` takes the Node a patch answered with, so the writer's next read sees its own
write even before the watch delivers it; an older version (a watch event already overtaken by that
patch) never replaces a newer one. :meth:`OwnNodeWatch.invalidate` makes the next read a GET (after a
409: the copy was stale).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from node_agent.kube import nodes
from node_agent.kube.errors import NotFound
from node_agent.kube.transport import Kube
from node_agent.kube.watch import ListWatch, WatchTiming, resource_version

log = logging.getLogger(__name__)


def _newer(candidate: str, than: str) -> bool:
    """Whether ``candidate`` is a later resourceVersion than ``than``. Versions are opaque to clients, but
    every Kubernetes API server hands out etcd revisions, which are integers that only grow; anything
    else is taken as newer (the copy is then at worst one watch event stale)."""
    if not than:
        return True
    try:
        return int(candidate) > int(than)
    except ValueError:
        return candidate != than


class OwnNodeWatch(ListWatch):
    """The own Node, from a GET and then a watch, on a thread until :meth:`stop`."""

    def __init__(self, kube: Kube, node_name: str, *, timing: WatchTiming | None = None) -> None:
        super().__init__(kube, nodes.NODES, field_selector=f"metadata.name={node_name}", on_list=self._listed,
                         on_event=self._changed, timing=timing, name="own-node-watch", log_as="own-node-watch")
        self.node_name = node_name
        self._lock = threading.Lock()
        self._node: dict[str, Any] | None = None
        self._synced = False
        self.gets = 0  #: GETs made by :meth:`current` because no copy was current (tests, benchmarks)

    def list(self) -> str:
        """One GET of the Node (not a list: the role need not enumerate Nodes), handed to ``on_list``."""
        self.lists += 1
        try:
            obj = nodes.get_node(self.kube, self.node_name)
        except NotFound:
            self._listed([])
            return ""
        self._listed([obj])
        return resource_version(obj)

    def current(self) -> dict[str, Any]:
        """A copy of the Node: the watched one once synced, else one GET now (raises ``KubeError``, and
        ``NotFound`` when the Node does not exist)."""
        with self._lock:
            if self._synced and self._node is not None:
                return copy.deepcopy(self._node)
        self.gets += 1
        obj = nodes.get_node(self.kube, self.node_name)
        self.offer(obj)
        return copy.deepcopy(obj)

    def offer(self, obj: Mapping[str, Any]) -> None:
        """A Node read or written elsewhere (a patch's answer): kept unless the copy is newer already."""
        if (obj.get("metadata") or {}).get("name") != self.node_name:
            return
        rv = resource_version(obj)
        with self._lock:
            if self._node is None or _newer(rv, resource_version(self._node)):
                self._node = copy.deepcopy(dict(obj))
                self._synced = True

    def invalidate(self) -> None:
        """The copy is stale (a write was refused for its version): the next :meth:`current` reads."""
        with self._lock:
            self._synced = False

    def _listed(self, items: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            self._node = next((dict(i) for i in items if (i.get("metadata") or {}).get("name") == self.node_name),
                              None)
            self._synced = self._node is not None

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self.node_name:
            return  # a server that ignores the field selector sends other nodes too
        if kind == "DELETED":
            with self._lock:
                self._node, self._synced = None, False
            return
        self.offer(obj)
