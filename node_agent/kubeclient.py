"""Kubernetes credentials and the one API error type for the agent's long-running services.

The DRA driver, the MIG manager and the node commands (``node_agent.kube``) build an official-client
``ApiClient`` the same way: from ``--kubeconfig`` when given (tests, development), else from the pod's
ServiceAccount (the DaemonSets). They share this module instead of keeping a copy each, and report
failures as :class:`KubeError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client, config


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def api_client(kubeconfig: str | Path | None) -> client.ApiClient:
    """A client from ``kubeconfig``, or the pod's in-cluster ServiceAccount when None."""
    loader: Any = config  # the kubernetes package ships no type hints for its loaders
    try:
        if kubeconfig:
            api: client.ApiClient = loader.new_client_from_config(config_file=str(kubeconfig))
            return api
        cfg = client.Configuration()
        loader.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except (config.ConfigException, OSError) as e:
        raise KubeError(f"no Kubernetes access ({kubeconfig or 'in-cluster'}): {e}") from e
