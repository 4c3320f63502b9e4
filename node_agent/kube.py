"""The agent's Kubernetes access: reading and patching its own Node's labels, over the official client.

A thin wrapper so commands deal in label dicts and one error type (``KubeError``), and tests can
point it at a fake API server. Calls go through the client's ``ApiClient`` as plain JSON
(:func:`~node_agent.kubeclient.request_json`), not ``CoreV1Api``, which would add 0.3 s and 20 MiB to
every one-shot command. Patches are JSON merge patches of ``metadata.labels``: a key set to
``None`` is deleted, keys not mentioned are left alone, so labels owned by others are never
clobbered by a read-modify-write.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kubernetes import client

from node_agent.kubeclient import KubeError, api_client, request_json

#: ``KubeError`` is re-exported: the commands catch ``kube.KubeError``.
__all__ = ["REQUEST_TIMEOUT", "KubeError", "NodeApi"]

#: Bounded API calls: (connect, read) seconds.
REQUEST_TIMEOUT = (5.0, 30.0)


def _api_client(kubeconfig: Path | None) -> client.ApiClient:
    """``--kubeconfig`` or the pod's ServiceAccount (:func:`~node_agent.kubeclient.api_client`); outside a
    pod without ``--kubeconfig``, the default kubeconfig, for commands run by hand."""
    if kubeconfig is not None or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return api_client(kubeconfig)
    return api_client(default_kubeconfig=True)


@dataclass
class NodeApi:
    api: client.ApiClient

    @classmethod
    def connect(cls, kubeconfig: Path | None = None) -> NodeApi:
        return cls(_api_client(kubeconfig))

    @classmethod
    def for_client(cls, api_client: client.ApiClient) -> NodeApi:
        return cls(api_client)

    def read_node(self, node: str) -> dict[str, Any]:
        """The Node as raw JSON (fields this client does not model, like taints' ``timeAdded``, kept)."""
        obj = request_json(self.api, f"read node {node}", "GET", f"/api/v1/nodes/{quote(node)}",
                           timeout=REQUEST_TIMEOUT)
        if not isinstance(obj, dict):
            raise KubeError(f"read node {node}: the API server sent no JSON object")
        return obj

    def patch_node(self, node: str, body: Mapping[str, Any], what: str = "patch") -> dict[str, Any]:
        """One JSON merge patch of the Node; answers the Node afterwards."""
        obj = request_json(self.api, f"{what} node {node}", "PATCH", f"/api/v1/nodes/{quote(node)}", dict(body),
                           timeout=REQUEST_TIMEOUT)
        return obj if isinstance(obj, dict) else {}

    def labels(self, node: str) -> dict[str, str]:
        return _labels(self.read_node(node))

    def daemonset_retired(self, namespace: str, name: str) -> bool:
        """Whether the DaemonSet is gone or being deleted: its group was removed or its stack destroyed
        (the provider deletes in the foreground, so the object stays, marked, while its pods stop)."""
        path = f"/apis/apps/v1/namespaces/{quote(namespace)}/daemonsets/{quote(name)}"
        try:
            obj = request_json(self.api, f"read daemonset {namespace}/{name}", "GET", path, timeout=REQUEST_TIMEOUT)
        except KubeError as e:
            if e.status == 404:
                return True
            raise
        return isinstance(obj, dict) and bool((obj.get("metadata") or {}).get("deletionTimestamp"))

    def patch_labels(self, node: str, changes: Mapping[str, str | None]) -> dict[str, str]:
        """Apply label changes (``None`` deletes); returns the Node's labels afterwards."""
        if not changes:
            return self.labels(node)
        return _labels(self.patch_node(node, {"metadata": {"labels": dict(changes)}}, what="patch labels of"))


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()}
