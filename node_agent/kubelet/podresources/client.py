"""A client of kubelet's PodResources ``List`` on its unix socket.

One channel for the life of the exporter (kubelet restarts are reconnects, grpc does them); each call has
a deadline, so a hung kubelet costs a scrape its pod labels, not the scrape. Kubelet limits ``List`` calls
per second (``podResourcesEndpointRateLimit``, qps 100): a scrape makes one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from node_agent.exporter.holders import ContainerDevices
from node_agent.kubelet import codegen
from nvgpu import hostpaths

_pb2, _pb2_grpc = codegen.load("podresources_v1", Path(__file__).resolve().parent)
pb: Any = _pb2
grpc_api: Any = _pb2_grpc

DEFAULT_SOCKET = f"{hostpaths.KUBELET_POD_RESOURCES_DIR}/kubelet.sock"
#: Kubelet's answer can be large on a busy node (every container's CPUs and memory too).
MAX_MESSAGE_BYTES = 16 << 20


class PodResourcesError(RuntimeError):
    """Kubelet's PodResources API did not answer (the message says why)."""


def containers(response: Any) -> list[ContainerDevices]:
    """A ``ListPodResourcesResponse`` as one entry per container that holds any device."""
    out: list[ContainerDevices] = []
    for pod in response.pod_resources:
        for c in pod.containers:
            ids = tuple((d.resource_name, i) for d in c.devices for i in d.device_ids)
            dra = tuple((r.driver_name, r.pool_name, r.device_name) for dyn in c.dynamic_resources
                        for r in dyn.claim_resources)
            if ids or dra:
                out.append(ContainerDevices(pod.name, pod.namespace, c.name, ids, dra))
    return out


class PodResourcesClient:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                              ("grpc.max_reconnect_backoff_ms", 1000)])
        self._stub = grpc_api.PodResourcesListerStub(self._channel)

    def list(self) -> list[ContainerDevices]:
        try:
            response = self._stub.List(pb.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            raise PodResourcesError(f"PodResources List on {self.socket_path}: {code}: "
                                    f"{e.details() if hasattr(e, 'details') else e}") from e
        return containers(response)

    def close(self) -> None:
        self._channel.close()
