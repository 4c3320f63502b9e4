"""A kubelet PodResources API stand-in: ``List`` on a unix socket answers the containers it is given.

Kubelet's own answer is built from its device manager's checkpoint and its DRA manager's claim cache; the
stand-in answers what a test says those hold, over the same gRPC service (``/v1.PodResourcesLister/List``)
with the same messages (``node_agent/kubelet/podresources/podresources_v1.proto``, checked against
kubelet's ``api.proto`` in ``tests/node_agent/exporter/test_pod_resources.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from node_agent.kubelet.podresources.client import grpc_api, pb


@dataclass
class Container:
    name: str
    #: resource name to device IDs (the device plugins' allocations).
    devices: dict[str, list[str]] = field(default_factory=dict)
    #: (claim name, claim namespace, [(driver, pool, device)]) per DRA claim.
    claims: list[tuple[str, str, list[tuple[str, str, str]]]] = field(default_factory=list)


@dataclass
class Pod:
    name: str
    namespace: str
    containers: list[Container]


def response(pods: Sequence[Pod]) -> Any:
    out = pb.ListPodResourcesResponse()
    for p in pods:
        pr = out.pod_resources.add(name=p.name, namespace=p.namespace)
        for c in p.containers:
            cr = pr.containers.add(name=c.name, cpu_ids=[2, 3])  # CPUs too, as kubelet reports them
            for resource, ids in c.devices.items():
                cr.devices.add(resource_name=resource, device_ids=ids)
            for claim, ns, devices in c.claims:
                dyn = cr.dynamic_resources.add(claim_name=claim, claim_namespace=ns)
                for driver, pool, device in devices:
                    dyn.claim_resources.add(driver_name=driver, pool_name=pool, device_name=device,
                                            cdi_devices=[pb.CDIDevice(name=f"k8s.{driver}/claim={device}")])
    return out


class _Lister(grpc_api.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, stand_in: PodResourcesStandIn) -> None:
        self._stand_in = stand_in

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        self._stand_in.calls += 1
        if self._stand_in.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
        return response(self._stand_in.pods)


@dataclass
class PodResourcesStandIn:
    socket: Path
    pods: list[Pod] = field(default_factory=list)
    down: bool = False
    calls: int = 0


@contextmanager
def pod_resources(socket: Path, pods: Sequence[Pod] = ()) -> Iterator[PodResourcesStandIn]:
    """Serve ``List`` on ``socket`` until the block ends; change ``.pods`` to change the answer."""
    stand_in = PodResourcesStandIn(socket, list(pods))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    grpc_api.add_PodResourcesListerServicer_to_server(_Lister(stand_in), server)
    socket.parent.mkdir(parents=True, exist_ok=True)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield stand_in
    finally:
        server.stop(grace=None)
