"""A kubelet stand-in that speaks the real device plugin protocol over unix sockets.

It serves ``Registration`` on ``kubelet.sock`` and, for every registration, does what kubelet's
device manager does: dial the plugin's endpoint, read its options, open ListAndWatch and keep the
latest device list. Tests then call GetPreferredAllocation and Allocate through it and can restart
it (new socket, plugin sockets wiped) to check re-registration.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from node_agent.kubelet.deviceplugin.api import grpc_api, pb
from tests.kit.kubelet.common import KUBELET_SOCKET, dial, remove_sockets


@dataclass
class Endpoint:
    """One registered resource as kubelet's device manager holds it: the plugin's socket and options, and
    the latest ListAndWatch answer (device health and NUMA topology), with a condition to wait on."""

    resource: str
    socket: Path
    options: Any
    channel: grpc.Channel
    stub: Any
    devices: dict[str, str] = field(default_factory=dict)  # id -> health
    topology: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0
    update_times: list[float] = field(default_factory=list)
    stream_ended: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)


class DevicePluginKubelet:
    """kubelet's device manager on ``directory`` (its ``device-plugins`` dir); ``reject`` may refuse a
    registration with a reason, as kubelet refuses a bad resource name or version."""

    def __init__(self, directory: Path, reject: Callable[[Any], str | None] | None = None):
        self.dir = directory
        self.socket = directory / KUBELET_SOCKET
        self.endpoints: dict[str, Endpoint] = {}
        self.registrations: list[tuple[str, str, str, float]] = []  # (version, endpoint, resource, time)
        self._reject = reject
        self._lock = threading.Condition()
        self._server: grpc.Server | None = None

    # -- Registration service --
    def Register(self, request: Any, context: Any) -> Any:  # noqa: N802
        if self._reject is not None:
            reason = self._reject(request)
            if reason:
                context.abort(grpc.StatusCode.UNKNOWN, reason)
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.UNKNOWN, f"unsupported version {request.version!r}")
        with self._lock:
            self.registrations.append((request.version, request.endpoint, request.resource_name, time.monotonic()))
            self._lock.notify_all()
        # kubelet connects back asynchronously after answering.
        threading.Thread(target=self._connect, args=(request.resource_name, request.endpoint), daemon=True).start()
        return pb.Empty()

    def _connect(self, resource: str, endpoint: str) -> None:
        path = self.dir / endpoint
        channel = dial(path)
        stub = grpc_api.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        except grpc.RpcError:  # the plugin restarted meanwhile; its next registration reconnects
            channel.close()
            return
        ep = Endpoint(resource, path, options, channel, stub)
        old = self.endpoints.get(resource)
        with self._lock:
            self.endpoints[resource] = ep
            self._lock.notify_all()
        if old is not None:
            old.channel.close()
        try:
            for resp in stub.ListAndWatch(pb.Empty()):
                with ep.changed:
                    ep.devices = {d.ID: d.health for d in resp.devices}
                    ep.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in resp.devices}
                    ep.updates += 1
                    ep.update_times.append(time.monotonic())
                    ep.changed.notify_all()
        except grpc.RpcError:
            pass
        finally:
            ep.stream_ended.set()
            with ep.changed:
                ep.changed.notify_all()

    # -- lifecycle --
    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        grpc_api.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self, wipe: bool = True) -> None:
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None
        self.socket.unlink(missing_ok=True)
        for ep in self.endpoints.values():
            ep.channel.close()
        if wipe:  # kubelet removes the plugins' sockets when it restarts
            remove_sockets(self.dir)

    def restart(self, wipe: bool = True) -> float:
        """Stop and start again, forgetting every endpoint (``wipe``: and the plugins' sockets, as kubelet
        does); the time of the restart, for :meth:`wait_registered`'s ``after``."""
        self.stop(wipe)
        with self._lock:
            self.endpoints.clear()
        self.start()
        return time.monotonic()

    # -- kubelet-side calls --
    def wait_registered(self, resources: set[str], timeout: float = 5.0, after: float = 0.0) -> None:
        """Until every resource registered (at or after ``after``) and kubelet has dialed it back."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                done = {r for _, _, r, t in self.registrations if t >= after}
                if resources <= done and resources <= set(self.endpoints):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"not registered in {timeout}s: {resources - done}; got {done}")
                self._lock.wait(left)

    def wait_devices(self, resource: str, predicate: Callable[[dict[str, str]], bool],
                     timeout: float = 5.0) -> Endpoint:
        deadline = time.monotonic() + timeout
        while True:
            ep = self.endpoints[resource]  # re-read: a re-registration replaces the endpoint
            with ep.changed:
                if predicate(ep.devices):
                    return ep
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{resource}: devices never matched; last {ep.devices}")
                ep.changed.wait(min(left, 0.05))

    def allocate(self, resource: str, *containers: list[str]) -> Any:
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers])
        return self.endpoints[resource].stub.Allocate(req, timeout=5)

    def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        req = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)])
        resp = self.endpoints[resource].stub.GetPreferredAllocation(req, timeout=5)
        return list(resp.container_responses[0].deviceIDs)

    def prestart(self, resource: str, ids: list[str]) -> Any:
        return self.endpoints[resource].stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=5)

