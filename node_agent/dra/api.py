"""The driver's narrow view of the Kubernetes API: ResourceClaims to read, ResourceSlices to publish.

:class:`DraApi` is what the driver needs (a fake implements it in unit tests); :class:`KubeDraApi`
implements it over the agent's one Kubernetes layer (:mod:`node_agent.kube`): raw JSON, parsed once by the
driver's own pydantic models where the content matters, instead of the official client's typed
``ResourceV1Api`` and its slow model deserialisation (prepare latency is dominated by the claim read)
and 20 MiB of models. Errors are :mod:`node_agent.kube.errors` classes (``NotFound`` for a claim or slice
that is gone).
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import quote

from node_agent.kube import events, nodes, resource_v1
from node_agent.kube.errors import Gone, NotFound
from node_agent.kube.transport import Kube
from node_agent.kube.watch import resource_version as resource_version_of
from node_agent.kube.watch import watch_once

#: The Events' ``source.component``.
COMPONENT = "nvidia-gpu-dra-driver"


class DraApi(Protocol):
    """What the driver needs from the API server; every call raises ``node_agent.kube.errors.KubeError``."""

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

    def wait_config_map_change(self, namespace: str, name: str, resource_version: str,
                               timeout_s: float) -> str | None:
        """Block until the ConfigMap changes or ``timeout_s`` passes (a watch). Answers None when it changed
        (or may have: read it again), else the version the wait ended at, to resume from."""
        ...


class KubeDraApi:
    """:class:`DraApi` over :class:`node_agent.kube.transport.Kube`."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def get_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        return resource_v1.get_claim(self.kube, namespace, name, timeout_s=max(timeout, 0.05))

    def get_node_uid(self, name: str) -> str:
        return str((nodes.get_node(self.kube, name).get("metadata") or {}).get("uid") or "")

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        return resource_v1.list_slices(self.kube, driver, node)

    def create_slice(self, body: dict[str, Any]) -> None:
        resource_v1.create_slice(self.kube, body)

    def patch_slice(self, name: str, body: dict[str, Any]) -> None:
        resource_v1.patch_slice(self.kube, name, body)

    def delete_slice(self, name: str) -> None:
        resource_v1.delete_slice(self.kube, name)

    def list_driver_slices(self, driver: str) -> list[dict[str, Any]]:
        return resource_v1.list_slices(self.kube, driver)

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.get_object(_config_map(namespace, name), what=f"get ConfigMap {namespace}/{name}")
        except NotFound:
            return None

    def patch_config_map(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.kube.merge_patch(_config_map(namespace, name), body, what=f"patch ConfigMap {namespace}/{name}")

    def node_event(self, node: str, node_uid: str, *, reason: str, message: str, warning: bool) -> None:
        """A Node Event, so ``kubectl describe node`` shows what the driver did."""
        events.post_node_event(self.kube, node, node_uid, component=COMPONENT, reason=reason, message=message,
                               warning=warning)


    def wait_config_map_change(self, namespace: str, name: str, resource_version: str,
                               timeout_s: float) -> str | None:
        latest = resource_version
        try:
            for kind, obj in watch_once(self.kube, f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps",
                                        resource_version=resource_version, timeout_s=timeout_s, read_slack_s=10.0,
                                        query={"fieldSelector": f"metadata.name={name}"}):
                rv = resource_version_of(obj)
                if kind == "BOOKMARK":
                    latest = rv or latest
                elif not resource_version or rv != resource_version:
                    return None
        except Gone:
            return None
        return latest


def _config_map(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps/{quote(name, safe='')}"
