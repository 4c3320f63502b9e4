"""The agent's Kubernetes access: reading and patching its own Node's labels, over the official client.

A thin wrapper so commands deal in label dicts and one error type (``KubeError``), and tests can
point it at a fake API server. Patches are JSON merge patches of ``metadata.labels``: a key set to
``None`` is deleted, keys not mentioned are left alone, so labels owned by others are never
clobbered by a read-modify-write.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from node_agent.kubeclient import KubeError, api_client

#: ``KubeError`` is re-exported: the commands catch ``kube.KubeError``.
__all__ = ["REQUEST_TIMEOUT", "KubeError", "NodeApi"]

#: Bounded API calls: (connect, read) seconds.
REQUEST_TIMEOUT = (5.0, 30.0)


def _api_client(kubeconfig: Path | None) -> client.ApiClient:
    """``--kubeconfig`` or the pod's ServiceAccount (:func:`~node_agent.kubeclient.api_client`); outside a
    pod without ``--kubeconfig``, the default kubeconfig, for commands run by hand."""
    if kubeconfig is not None or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return api_client(kubeconfig)
    loader: Any = config  # the kubernetes package ships no type hints for its loaders
    try:
        default: client.ApiClient = loader.new_client_from_config()
        return default
    except (config.ConfigException, OSError) as e:
        raise KubeError(f"cannot load Kubernetes credentials: {e}") from e


@dataclass
class NodeApi:
    core: Any  #: kubernetes.client.CoreV1Api

    @classmethod
    def connect(cls, kubeconfig: Path | None = None) -> NodeApi:
        return cls(client.CoreV1Api(_api_client(kubeconfig)))

    @classmethod
    def for_client(cls, api_client: client.ApiClient) -> NodeApi:
        return cls(client.CoreV1Api(api_client))

    def labels(self, node: str) -> dict[str, str]:
        try:
            obj = self.core.read_node(node, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as e:
            raise KubeError(f"read node {node}: {e.status} {e.reason}", e.status) from e
        except HTTPError as e:
            raise KubeError(f"read node {node}: {e}") from e
        return dict(obj.metadata.labels or {})

    def patch_labels(self, node: str, changes: Mapping[str, str | None]) -> dict[str, str]:
        """Apply label changes (``None`` deletes); returns the Node's labels afterwards."""
        if not changes:
            return self.labels(node)
        body = {"metadata": {"labels": dict(changes)}}
        try:
            obj = self.core.patch_node(node, body, _content_type="application/merge-patch+json",
                                       _request_timeout=REQUEST_TIMEOUT)
        except ApiException as e:
            raise KubeError(f"patch node {node} labels: {e.status} {e.reason}", e.status) from e
        except HTTPError as e:
            raise KubeError(f"patch node {node} labels: {e}") from e
        return dict(obj.metadata.labels or {})
