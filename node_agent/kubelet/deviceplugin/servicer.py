"""Thin gRPC servicers: protobuf in, domain call, protobuf out (nothing else lives here).

:class:`DevicePluginServicer` serves one resource's
:class:`~node_agent.deviceplugin.plugin.ResourcePlugin`; domain errors become gRPC statuses whose
details carry NVIDIA's wording (kubelet shows them in the pod's events).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from node_agent.deviceplugin.allocate import AllocationError, ContainerAllocation
from node_agent.deviceplugin.plugin import DeviceStatus, ResourcePlugin
from node_agent.deviceplugin.preferred import PreferenceError, Request
from node_agent.kubelet.deviceplugin.api import grpc_api, pb

log = logging.getLogger(__name__)


def device_message(d: DeviceStatus) -> Any:
    topology = None if d.numa_node is None else pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)])
    return pb.Device(ID=d.id, health=d.health, topology=topology)


def allocation_message(a: ContainerAllocation) -> Any:
    return pb.ContainerAllocateResponse(
        envs=dict(a.envs),
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in a.mounts],
        devices=[pb.DeviceSpec(container_path=s.container_path, host_path=s.host_path, permissions=s.permissions)
                 for s in a.devices],
        annotations=dict(a.annotations),
        cdi_devices=[pb.CDIDevice(name=n) for n in a.cdi_devices],
    )


class DevicePluginServicer(grpc_api.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: ResourcePlugin):
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802
        o = self.plugin.options()
        return pb.DevicePluginOptions(pre_start_required=o.pre_start_required,
                                      get_preferred_allocation_available=o.get_preferred_allocation_available)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        active = threading.Event()
        active.set()

        def closed() -> None:
            active.clear()
            self.plugin.board.wake()

        context.add_callback(closed)
        for devices in self.plugin.watch(active):
            yield pb.ListAndWatchResponse(devices=[device_message(d) for d in devices])

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        reqs = [Request(tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs), r.allocation_size)
                for r in request.container_requests]
        try:
            answers = self.plugin.preferred(reqs)
        except PreferenceError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in answers]
        )

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            allocations = self.plugin.allocate([list(r.devices_ids) for r in request.container_requests])
        except AllocationError as e:
            # UNKNOWN, as NVIDIA's Go plugin answers: the pod event then reads exactly as users know it.
            log.warning("event=allocate-rejected resource=%s error=%s", self.plugin.name, e)
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        return pb.AllocateResponse(container_responses=[allocation_message(a) for a in allocations])

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.PreStartContainerResponse()
