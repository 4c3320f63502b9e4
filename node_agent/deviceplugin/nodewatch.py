"""Watches this node's config label, so a changed label switches the plugin's config within a second.

:class:`NodeLabelWatch` is a :class:`~node_agent.deviceplugin.nodelabel.LabelSource` kept current by the
agent's one list-then-watch loop (:class:`node_agent.kube.watch.ListWatch`) on the own Node
(``fieldSelector=metadata.name=<node>``): list once, watch from the list's ``resourceVersion`` with
bookmarks, re-list on 410 Gone, back off on failures, re-list every ``relist_interval_s`` while the
watch is refused (see :mod:`node_agent.kube.watch` for the failure kinds). The last value is cached, so
:meth:`NodeLabelWatch.label` costs nothing once the watch runs; each change calls the subscribers (the
config watcher's ``wake``). Credentials: the agent's ``--kubeconfig`` when it has one, else the pod's
ServiceAccount (:mod:`node_agent.kube.credentials`).

The device plugin imports this module only when it watches a label (``--config-dir`` and a node name):
a plugin serving one fixed config never loads the Kubernetes layer at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node_agent.deviceplugin.nodelabel import CONFIG_LABEL
from node_agent.kube import nodes
from node_agent.kube.transport import Kube
from node_agent.kube.watch import ListWatch, WatchTiming

log = logging.getLogger(__name__)

__all__ = ["NodeLabelWatch", "WatchTiming"]


class NodeLabelWatch(ListWatch):
    """The own Node's ``key`` label, from a list and then a watch (the loop, counters and ``stop`` are
    :class:`~node_agent.kube.watch.ListWatch`'s)."""

    def __init__(self, node_name: str, key: str = CONFIG_LABEL, *, kube: Kube | None = None,
                 kubeconfig: Path | None = None, timing: WatchTiming | None = None,
                 pause: Callable[[threading.Event, float], object] | None = None) -> None:
        super().__init__(kube if kube is not None else Kube.connect(kubeconfig), nodes.NODES,
                         field_selector=f"metadata.name={node_name}", on_list=self._listed, on_event=self._changed,
                         timing=timing, name="node-label-watch", log_as="node-watch", pause=pause)
        self.node_name = node_name
        self.key = key
        self._lock = threading.Lock()
        self._value: str | None = None
        self._synced = False
        self._subscribers: list[Callable[[], None]] = []

    # -- LabelSource ---------------------------------------------------------------------------------
    def label(self) -> str | None:
        """The label's value: cached once listed, else one list now (raises ``KubeError`` when unreadable)."""
        with self._lock:
            if self._synced:
                return self._value
        self.list()
        with self._lock:
            return self._value

    def subscribe(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (from the watch thread) after every change of the label's value."""
        self._subscribers.append(fn)

    # -- internals -----------------------------------------------------------------------------------
    def _listed(self, items: list[dict[str, Any]]) -> None:
        value = None  # unset when the Node is not listed
        for item in items:
            if (item.get("metadata") or {}).get("name") == self.node_name:
                value = nodes.label_of(item, self.key)
        self._set(value)

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self.node_name:
            return  # a server that ignores the field selector sends other nodes too
        self._set(None if kind == "DELETED" else nodes.label_of(obj, self.key))

    def _set(self, value: str | None) -> None:
        with self._lock:
            if self._synced and self._value == value:
                return
            first, self._synced, self._value = not self._synced, True, value
        if first:
            return  # the first value read is the starting point, not a change
        log.info("event=node-label-changed label=%s value=%s", self.key, value)
        for fn in self._subscribers:
            fn()
