"""The driver's narrow view of the Kubernetes API: ResourceClaims to read, ResourceSlices to publish.

ResourceClaims and ResourceSlices go through the official client's typed ``ResourceV1Api``, with
``_preload_content=False`` so responses are parsed once as JSON (by our own pydantic models where the
content matters) instead of through the client's slow model deserialisation: prepare latency is
dominated by this read. The three core calls (read the Node, get and patch the uninstall marker) use
the same ``ApiClient`` directly: importing ``CoreV1Api`` alone costs 20 MiB of RSS, a quarter of the
plugin's budget. Errors become :class:`ApiError` with the HTTP status kept.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from node_agent.kubeclient import MERGE_PATCH, KubeError, request_json


class ApiError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404


class DraApi(Protocol):
    """What the driver needs from the API server (a fake implements it in unit tests)."""

    def get_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]: ...

    def get_node_uid(self, name: str) -> str: ...

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]: ...

    def create_slice(self, body: dict[str, Any]) -> None: ...

    def patch_slice(self, name: str, body: dict[str, Any]) -> None: ...

    def delete_slice(self, name: str) -> None: ...

    def list_driver_slices(self, driver: str) -> list[dict[str, Any]]: ...

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def patch_config_map(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...

    def node_event(self, node: str, node_uid: str, *, reason: str, message: str, warning: bool) -> None: ...


def _json(resp: Any) -> Any:
    return json.loads(resp.data or b"null")


class KubeDraApi:
    """:class:`DraApi` over the official ``kubernetes`` client."""

    def __init__(self, api_client: client.ApiClient, timeout: float = 10.0) -> None:
        self._client = api_client
        self._resource = client.ResourceV1Api(api_client)
        self._timeout = timeout

    def _core(self, what: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return request_json(self._client, what, method, path, body, timeout=self._timeout)
        except KubeError as e:
            raise ApiError(str(e), e.status or 0) from e

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as e:
            raise ApiError(f"{what}: HTTP {e.status} {e.reason}", e.status or 0) from e
        except (HTTPError, OSError) as e:
            raise ApiError(f"{what}: {e}") from e

    def get_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        resp = self._call(f"get ResourceClaim {namespace}/{name}", self._resource.read_namespaced_resource_claim,
                          name, namespace, _request_timeout=max(timeout, 0.05))
        data: dict[str, Any] = _json(resp)
        return data

    def get_node_uid(self, name: str) -> str:
        data = self._core(f"get Node {name}", "GET", f"/api/v1/nodes/{quote(name)}")
        return str((data or {}).get("metadata", {}).get("uid") or "")

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        data = _json(self._call(
            "list ResourceSlices", self._resource.list_resource_slice,
            field_selector=f"spec.driver={driver},spec.nodeName={node}", _request_timeout=self._timeout,
        ))
        items = (data or {}).get("items") or []
        # Filter again: the selector is an optimisation, the ownership rule is ours.
        return [s for s in items
                if s.get("spec", {}).get("driver") == driver and s.get("spec", {}).get("nodeName") == node]

    def create_slice(self, body: dict[str, Any]) -> None:
        self._call(f"create ResourceSlice {body['metadata']['name']}", self._resource.create_resource_slice, body,
                   _request_timeout=self._timeout)

    def patch_slice(self, name: str, body: dict[str, Any]) -> None:
        self._call(f"patch ResourceSlice {name}", self._resource.patch_resource_slice, name, body,
                   _content_type=MERGE_PATCH, _request_timeout=self._timeout)

    def delete_slice(self, name: str) -> None:
        self._call(f"delete ResourceSlice {name}", self._resource.delete_resource_slice, name,
                   _request_timeout=self._timeout)

    def list_driver_slices(self, driver: str) -> list[dict[str, Any]]:
        data = _json(self._call("list ResourceSlices", self._resource.list_resource_slice,
                                field_selector=f"spec.driver={driver}", _request_timeout=self._timeout))
        return [s for s in (data or {}).get("items") or [] if s.get("spec", {}).get("driver") == driver]

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = self._core(f"get ConfigMap {namespace}/{name}", "GET",
                                              f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}")
        except ApiError as e:
            if e.not_found:
                return None
            raise
        return data

    def patch_config_map(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._core(f"patch ConfigMap {namespace}/{name}", "PATCH",
                   f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}", body)

    def node_event(self, node: str, node_uid: str, *, reason: str, message: str, warning: bool) -> None:
        """Record a core/v1 Event on the Node, so ``kubectl describe node`` shows what the driver did."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{node}.{reason.lower()}.{time.time_ns():x}"[:253], "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "source": {"component": "nvidia-gpu-dra-driver", "host": node},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        self._core(f"create Event {reason} on Node {node}", "POST", "/api/v1/namespaces/default/events", body)
