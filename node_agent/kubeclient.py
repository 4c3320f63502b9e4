"""Kubernetes credentials and the one API error type for the agent's long-running services.

The DRA driver, the MIG manager and the node commands (``node_agent.kube``) build an official-client
``ApiClient`` the same way: from ``--kubeconfig`` when given (tests, development), else from the pod's
ServiceAccount (the DaemonSets). They share this module instead of keeping a copy each, and report
failures as :class:`KubeError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

MERGE_PATCH = "application/merge-patch+json"


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


#: urllib3 retries each call up to three more times by default, so a stated timeout held per attempt:
#: against a frozen API server a 30 s read took 120 s. One more try for a connection that could not be
#: opened, none for a read: every caller has its own retry loop with backoff.
RETRIES = Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0)


def api_client(kubeconfig: str | Path | None = None, *, default_kubeconfig: bool = False) -> client.ApiClient:
    """A client from ``kubeconfig``, the default kubeconfig (``default_kubeconfig``), or else the pod's
    in-cluster ServiceAccount; with bounded retries (:data:`RETRIES`)."""
    loader: Any = config  # the kubernetes package ships no type hints for its loaders
    cfg = client.Configuration()
    try:
        if kubeconfig or default_kubeconfig:
            loader.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, client_configuration=cfg)
        else:
            loader.load_incluster_config(client_configuration=cfg)
    except (config.ConfigException, OSError) as e:
        raise KubeError(f"no Kubernetes access ({kubeconfig or 'in-cluster'}): {e}") from e
    cfg.retries = RETRIES
    return client.ApiClient(cfg)


def request_json(
    api: client.ApiClient,
    what: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    content_type: str = MERGE_PATCH,
    timeout: tuple[float, float] | float = (5.0, 30.0),
) -> Any:
    """One API call through ``api`` without the typed API classes, answering the decoded JSON.

    ``CoreV1Api`` alone costs about 0.3 s of import time and 20 MiB of RSS, more than a one-shot
    ``labels --patch-node`` needs for its two Node calls; the ``ApiClient`` still brings the
    credentials, TLS and retries. ``what`` names the call in errors.
    """
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type if method == "PATCH" else "application/json"
    try:
        request = api.param_serialize(method=method, resource_path=path, header_params=headers, body=body,
                                      auth_settings=["BearerToken"])
        resp = api.call_api(*request, _request_timeout=timeout)
        resp.read()  # type: ignore[no-untyped-call]
    except ApiException as e:
        raise KubeError(f"{what}: {e.status} {e.reason}", e.status) from e
    except (HTTPError, OSError) as e:
        raise KubeError(f"{what}: {e}") from e
    if resp.status >= 400:
        raise KubeError(f"{what}: {resp.status} {resp.reason}", resp.status)
    try:
        return json.loads(resp.data or b"null")
    except ValueError as e:
        raise KubeError(f"{what}: the API server sent no JSON ({e})") from e
