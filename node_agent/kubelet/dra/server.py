"""The DRA plugin's gRPC side: the DRAPlugin services (v1 and v1beta1) and kubelet plugin registration.

Servicers only translate protobuf to :class:`node_agent.dra.driver.DraDriver` calls and back; each claim
gets its own entry in the response (an error string, never a gRPC error, which would make the kubelet
discard the answers for every claim in the call). The remaining gRPC deadline is passed down so the
driver answers before the kubelet gives up (45 s by default).

Lifecycle (:class:`PluginServer`): serve the DRA socket ``<plugins>/<driver>/dra.sock`` first, then the
registration socket ``<plugins_registry>/<driver>-reg.sock`` that the kubelet's plugin watcher discovers;
``GetInfo`` answers ``DRAPlugin`` with ``v1.DRAPlugin`` listed first (kubelet 1.34+ picks the first version
it knows) and ``v1beta1.DRAPlugin`` for older kubelets. If the registration socket disappears (the kubelet
wipes its registry on some restarts) it is served again within one watch interval.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from node_agent.dra.claims import ClaimRef
from node_agent.dra.driver import DraDriver
from node_agent.dra.hostfs import HostPaths
from node_agent.kubelet.dra import protos
from nvgpu import hostpaths

log = logging.getLogger(__name__)

_reg_pb, _reg_grpc = protos.load("pluginregistration")
_v1_pb, _v1_grpc = protos.load("dra_v1")
_v1beta1_pb, _v1beta1_grpc = protos.load("dra_v1beta1")

reg_pb: Any = _reg_pb
reg_grpc: Any = _reg_grpc
v1_pb: Any = _v1_pb
v1_grpc: Any = _v1_grpc
v1beta1_pb: Any = _v1beta1_pb
v1beta1_grpc: Any = _v1beta1_grpc

PLUGIN_TYPE = "DRAPlugin"
#: gRPC service names as kubelet knows them (``DRAPluginService`` in kubelet's dra/v1 and v1beta1).
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
PLUGINS_DIR = hostpaths.KUBELET_PLUGINS_DIR
REGISTRY_DIR = hostpaths.KUBELET_PLUGINS_REGISTRY_DIR


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _remaining(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else float(remaining)


class _DraServicer:
    """One servicer body for both API versions; ``pb`` is that version's message module."""

    def __init__(self, driver: DraDriver, pb: Any) -> None:
        self._driver = driver
        self._pb = pb

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        pb = self._pb
        outcomes = self._driver.prepare(_refs(request), _remaining(context))
        response = pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for d in outcome.devices:
                entry.devices.append(pb.Device(request_names=list(d.requests), pool_name=d.pool,
                                               device_name=d.device, cdi_device_ids=list(d.cdi_device_ids)))
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        pb = self._pb
        errors = self._driver.unprepare(_refs(request), _remaining(context))
        response = pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class _V1Servicer(_DraServicer, v1_grpc.DRAPluginServicer):  # type: ignore[misc]
    pass


class _V1beta1Servicer(_DraServicer, v1beta1_grpc.DRAPluginServicer):  # type: ignore[misc]
    pass


@dataclass
class RegistrationState:
    registered: bool = False
    error: str = ""
    event: threading.Event = field(default_factory=threading.Event)


class _RegistrationServicer(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: DraDriver, endpoint: str, state: RegistrationState) -> None:
        self._info = reg_pb.PluginInfo(type=PLUGIN_TYPE, name=driver.settings.driver, endpoint=endpoint,
                                       supported_versions=list(SUPPORTED_VERSIONS))
        self._driver = driver
        self._state = state

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        return self._info

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._state.registered = bool(request.plugin_registered)
        self._state.error = str(request.error)
        self._driver.metrics.registration(self._state.registered)
        if self._state.registered:
            log.info("event=registered driver=%s", self._info.name)
            # A (re)starting kubelet deletes this node's slices: check them on the next inventory tick.
            self._driver.resync()
        else:
            log.error("event=registration-failed driver=%s error=%s", self._info.name, request.error)
        self._state.event.set()
        return reg_pb.RegistrationStatusResponse()


def _serve(socket: Path, workers: int) -> grpc.Server:
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra-grpc"))
    return server


class PluginServer:
    """Serves the DRA and registration sockets for one driver; ``stop`` removes both sockets."""

    def __init__(self, driver: DraDriver, host: HostPaths, *, plugins_dir: str = PLUGINS_DIR,
                 registry_dir: str = REGISTRY_DIR, workers: int = 8) -> None:
        name = driver.settings.driver
        self.driver = driver
        self.endpoint = f"{plugins_dir}/{name}/dra.sock"
        self.registration_endpoint = f"{registry_dir}/{name}-reg.sock"
        self._dra_socket = host.path(self.endpoint)
        self._reg_socket = host.path(self.registration_endpoint)
        self._workers = workers
        self._dra: grpc.Server | None = None
        self._reg: grpc.Server | None = None
        self.registration = RegistrationState()
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def start(self, watch_interval: float = 0.5) -> None:
        self._dra = _serve(self._dra_socket, self._workers)
        v1_grpc.add_DRAPluginServicer_to_server(_V1Servicer(self.driver, v1_pb), self._dra)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1Servicer(self.driver, v1beta1_pb), self._dra)
        self._dra.add_insecure_port(f"unix://{self._dra_socket}")
        self._dra.start()
        self._start_registration()
        self._watch = threading.Thread(target=self._watch_loop, args=(watch_interval,), name="dra-registration-watch",
                                       daemon=True)
        self._watch.start()

    def _start_registration(self) -> None:
        self.registration.registered = False
        # Bind under a hidden name and rename once serving: the kubelet's watcher dials a socket as soon
        # as it appears, and a socket that exists but does not accept yet is refused.
        staging = self._reg_socket.with_name(f".{self._reg_socket.name}.starting")
        self._reg = _serve(staging, 2)
        reg_grpc.add_RegistrationServicer_to_server(
            _RegistrationServicer(self.driver, self.endpoint, self.registration), self._reg)
        self._reg.add_insecure_port(f"unix://{staging}")
        self._reg.start()
        os.replace(staging, self._reg_socket)
        log.info("event=serving dra_socket=%s registration_socket=%s", self.endpoint, self.registration_endpoint)

    def _watch_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            if not os.path.exists(self._reg_socket) and self._reg is not None:
                log.warning("event=registration-socket-gone path=%s action=re-serve", self.registration_endpoint)
                self._reg.stop(grace=None)
                self._start_registration()

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        for server, socket in ((self._reg, self._reg_socket), (self._dra, self._dra_socket)):
            if server is not None:
                server.stop(grace=grace).wait(timeout=grace + 1)
            socket.unlink(missing_ok=True)
