"""The labeller's and the node commands' Node access: read labels, patch labels, the node-group config.

:class:`NodeApi` is the narrow view the commands use (``labels``, ``setup``, ``vfio``); :class:`KubeNodeApi`
implements it over the agent's one Kubernetes layer (:mod:`node_agent.kube`), and tests replace it with a
fake or point it at an emulator. Separate from the pure
planning in ``node_agent.labeller.nodeconfig`` so that one is tested without an API server. The read keeps the raw
JSON, so foreign taints (``timeAdded`` and any field this agent does not model) are re-sent byte for byte
when the taint list is rewritten. Every write is a :class:`~node_agent.kube.nodeowner.NodeChange` naming
its writer (the labeller's plans as :data:`~node_agent.kube.nodeowner.LABELLER`, node setup's labels as
:data:`~node_agent.kube.nodeowner.NODE_SETUP`), sent by :func:`node_agent.kube.nodeowner.patch`: one JSON
merge patch of labels, annotations and, when it changes, the whole taint list; with the Node's
``resourceVersion`` in it the API server answers 409 (:class:`~node_agent.kube.errors.Conflict`) if the
Node changed since the read, instead of dropping a concurrent taint.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from node_agent.host import HostRoot
from node_agent.kube import nodeowner, nodes
from node_agent.kube.errors import NotFound
from node_agent.kube.nodeowner import LABELLER, NodeChange, Writer
from node_agent.kube.ownnode import OwnNodeWatch
from node_agent.kube.transport import Kube
from node_agent.labeller.nodeconfig import NodePlan, NodeSnapshot
from node_agent.nvml import NvmlSession


class NodeApi(Protocol):
    """The commands' Node calls; all raise :class:`~node_agent.kube.errors.KubeError` subclasses."""

    def read_node(self, node: str) -> dict[str, Any]:
        """The Node as raw JSON (fields this agent does not model kept)."""
        ...

    def patch_node(self, node: str, change: NodeChange, what: str = "patch") -> dict[str, Any]:
        """One writer's change (:func:`node_agent.kube.nodeowner.patch`); answers the Node afterwards."""
        ...

    def labels(self, node: str) -> dict[str, str]: ...

    def patch_labels(self, node: str, changes: Mapping[str, str | None], *, writer: Writer) -> dict[str, str]: ...

    def daemonset_retired(self, namespace: str, name: str) -> bool: ...


class NodeEnv(Protocol):
    """What the labeller and the setup flow act on: this host, its GPUs, its Node.

    The agent's command context (``node_agent.cli.context.AgentContext``) is one; the domain code depends
    on this much of it only, so it takes no command-line types and the command line stays on top.
    """

    @property
    def host(self) -> HostRoot: ...

    @property
    def node_name(self) -> str | None: ...

    def nvml(self) -> AbstractContextManager[NvmlSession]:
        """An NVML session, opened for this call."""
        ...

    def require_node_name(self) -> str:
        """This node's name; raises (a usage error) when it is not known."""
        ...

    def node_api(self) -> NodeApi:
        """A fresh Node API client (a kept-alive connection to a hung API server would wait out a read)."""
        ...


class KubeNodeApi:
    """:class:`NodeApi` over :class:`node_agent.kube.transport.Kube`."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    @classmethod
    def connect(cls, kubeconfig: Path | None = None) -> KubeNodeApi:
        """``--kubeconfig``, the pod's ServiceAccount, or (a command run by hand) the default kubeconfig."""
        return cls(Kube.connect(kubeconfig))

    def read_node(self, node: str) -> dict[str, Any]:
        return nodes.get_node(self.kube, node)

    def patch_node(self, node: str, change: NodeChange, what: str = "patch") -> dict[str, Any]:
        return nodeowner.patch(self.kube, node, change, what=what)

    def labels(self, node: str) -> dict[str, str]:
        return nodes.labels_of(self.read_node(node))

    def patch_labels(self, node: str, changes: Mapping[str, str | None], *, writer: Writer) -> dict[str, str]:
        """Apply ``writer``'s label changes (``None`` deletes); returns the Node's labels afterwards."""
        if not changes:
            return self.labels(node)
        return nodes.labels_of(self.patch_node(node, NodeChange(writer, labels=changes), what="patch labels of"))

    def daemonset_retired(self, namespace: str, name: str) -> bool:
        """Whether the DaemonSet is gone or being deleted: its group was removed or its stack destroyed
        (the provider deletes in the foreground, so the object stays, marked, while its pods stop)."""
        path = f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/daemonsets/{quote(name, safe='')}"
        try:
            obj = self.kube.get_object(path, what=f"read daemonset {namespace}/{name}")
        except NotFound:
            return True
        return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


class WatchedNodeApi(KubeNodeApi):
    """:class:`KubeNodeApi` reading its own Node from an :class:`~node_agent.kube.ownnode.OwnNodeWatch`:
    a labeller that finds nothing to change makes no request at all. Its patches go to the API server
    as before, and their answers update the copy; a 409 (the copy was stale) makes the next read a GET."""

    def __init__(self, kube: Kube, watch: OwnNodeWatch) -> None:
        super().__init__(kube)
        self.watch = watch

    def read_node(self, node: str) -> dict[str, Any]:
        if node != self.watch.node_name:
            return super().read_node(node)
        return self.watch.current()

    def patch_node(self, node: str, change: NodeChange, what: str = "patch") -> dict[str, Any]:
        return nodeowner.patch(self.kube, node, change, what=what, cache=self.watch)


def snapshot(api: NodeApi, node: str) -> NodeSnapshot:
    """Labels, annotations, taints (raw) and resourceVersion of ``node``."""
    obj = api.read_node(node)
    return NodeSnapshot(
        labels=nodes.labels_of(obj),
        annotations=nodes.annotations_of(obj),
        taints=nodes.taints_of(obj),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


def change(plan: NodePlan, resource_version: str = "") -> NodeChange:
    """The labeller's plan as its change of the Node."""
    return NodeChange(LABELLER, labels=plan.labels, annotations=plan.annotations, taints=plan.taints,
                      taints_read=plan.taints_read, resource_version=resource_version)


def patch_body(plan: NodePlan, resource_version: str = "") -> dict[str, Any]:
    """The merge patch the plan is sent as."""
    return change(plan, resource_version).body()


def apply_plan(api: NodeApi, node: str, plan: NodePlan, resource_version: str = "") -> None:
    """One merge patch; ``resource_version`` (when the API server reported one) guards the taint list."""
    api.patch_node(node, change(plan, resource_version))
