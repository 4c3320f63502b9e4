"""Serving, registering and re-registering the device plugins: NVIDIA's restart loop, made explicit.

Start order per resource: remove a stale socket, serve on ``<dir>/nvidia-<name>.sock``, dial our own
socket until it answers, then ``Register`` with kubelet. The :class:`Supervisor` then waits for one
of: kubelet's socket recreated or our socket deleted (kubelet restarted: restart everything, which
re-registers well within a second), a reload request (SIGHUP, the node's named config changed),
or stop (SIGTERM: stop the servers and remove the sockets).

Failures are sorted by kind. Kubelet not (yet) listening is transient: servers stay up and
registration is retried with backoff or as soon as ``kubelet.sock`` appears. A build failure (no
NVML, devices that cannot be advertised) is fatal with ``failOnInitError`` and otherwise leaves the
node advertising nothing until the next reload. Kubelet refusing a registration is fatal, as in NVIDIA's plugin.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.plugin import NodePlugins, ResourcePlugin
from node_agent.kubelet.deviceplugin.api import KUBELET_SOCKET_NAME, VERSION, grpc_api, pb
from node_agent.kubelet.deviceplugin.dirwatch import DirWatcher
from node_agent.kubelet.deviceplugin.servicer import DevicePluginServicer

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT_S = 5.0
#: One confirm attempt; between attempts the socket's existence is checked again.
CONFIRM_ATTEMPT_S = 0.25
REGISTER_TIMEOUT_S = 5.0
MAX_RETRY_S = 30.0
#: With failOnInitError off, a failed init is retried this often (NVIDIA's plugin waits 30 s too).
INIT_RETRY_S = 30.0
#: The loop's wait while registered: a kubelet restart (inotify on its socket), a reload and a stop end it at
#: once, so this only paces the heartbeat the liveness check reads (``live``: 30 s).
IDLE_WAIT_S = 10.0
#: Unix sockets on this node: reconnect every 100-250 ms while waiting for ready. gRPC's default backoff
#: (1 s, 1.6 s, 2.6 s, ...) held a registration for seconds after a restarting kubelet's new socket
#: appeared, so a refusal (or success) arrived late on a busy node.
_LOCAL_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                          ("grpc.max_reconnect_backoff_ms", 250)]
_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


class PermanentError(RuntimeError):
    """A failure that retrying cannot fix (the process should exit non-zero)."""


class TransientError(RuntimeError):
    """A failure worth retrying (kubelet not listening yet)."""


class ResourceServer:
    """One gRPC server on one unix socket for one resource."""

    def __init__(self, plugin: ResourcePlugin, socket_dir: Path, max_workers: int = 8):
        self.plugin = plugin
        self.socket_path = socket_dir / plugin.resource.socket_name
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self.registered = False

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers,
                                                        thread_name_prefix=f"dp-{self.plugin.resource.socket_name}"))
        grpc_api.add_DevicePluginServicer_to_server(DevicePluginServicer(self.plugin), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        self._confirm()
        log.info("event=serving resource=%s socket=%s", self.plugin.name, self.socket_path)

    def _confirm(self) -> None:
        """Confirm with a real call, like NVIDIA's blocking dial but stronger: the servicer answers.

        Short attempts, each checking the socket still exists: a restarting kubelet may delete it
        right after we created it, and waiting out the whole confirm timeout on a socket nobody can
        reach delayed the restart (and a refused registration) by seconds."""
        deadline = time.monotonic() + CONFIRM_TIMEOUT_S
        with grpc.insecure_channel(f"unix://{self.socket_path}", options=_LOCAL_CHANNEL_OPTIONS) as ch:
            stub = grpc_api.DevicePluginStub(ch)
            while True:
                if not self.socket_path.exists():
                    raise TransientError(f"{self.plugin.name}: own socket {self.socket_path} was removed")
                left = deadline - time.monotonic()
                try:
                    stub.GetDevicePluginOptions(pb.Empty(), timeout=max(0.01, min(CONFIRM_ATTEMPT_S, left)),
                                                wait_for_ready=True)
                    return
                except grpc.RpcError as e:
                    if left <= CONFIRM_ATTEMPT_S:
                        raise TransientError(
                            f"{self.plugin.name}: own socket {self.socket_path} does not answer") from e

    def register(self, kubelet_socket: Path) -> None:
        o = self.plugin.options()
        req = pb.RegisterRequest(
            version=VERSION, endpoint=self.socket_path.name, resource_name=self.plugin.name,
            options=pb.DevicePluginOptions(pre_start_required=o.pre_start_required,
                                           get_preferred_allocation_available=o.get_preferred_allocation_available),
        )
        if not kubelet_socket.exists():
            raise TransientError(f"kubelet socket {kubelet_socket} does not exist")
        with grpc.insecure_channel(f"unix://{kubelet_socket}", options=_LOCAL_CHANNEL_OPTIONS) as ch:
            try:
                grpc_api.RegistrationStub(ch).Register(req, timeout=REGISTER_TIMEOUT_S, wait_for_ready=True)
            except grpc.RpcError as e:
                code = e.code()
                if code in _TRANSIENT:
                    raise TransientError(f"{self.plugin.name}: kubelet unavailable: {e.details()}") from e
                raise PermanentError(f"{self.plugin.name}: kubelet refused registration: {e.details()}") from e
        self.registered = True
        log.info("event=registered resource=%s endpoint=%s", self.plugin.name, self.socket_path.name)

    def stop(self) -> None:
        self.plugin.stop()
        if self._server is not None:
            self._server.stop(grace=0.05).wait(2)
            self._server = None
        self.socket_path.unlink(missing_ok=True)
        self.registered = False


@dataclass
class SupervisorState:
    started: bool = False
    registered: bool = False
    last_beat: float = 0.0
    restarts: int = 0
    build_error: str = ""


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Supervisor:
    """Runs the plugins until stopped; see the module docstring for the restart rules."""

    def __init__(self, socket_dir: Path, build: Callable[[], NodePlugins], metrics: PluginMetrics, *,
                 fail_on_init_error: Callable[[], bool] = lambda: True, use_inotify: bool = True,
                 init_retry_s: float = INIT_RETRY_S, clock: Callable[[], float] = time.monotonic):
        self.socket_dir = socket_dir
        self.kubelet_socket = socket_dir / KUBELET_SOCKET_NAME
        self._build = build
        self.metrics = metrics
        self._fail_on_init_error = fail_on_init_error
        self._use_inotify = use_inotify
        self._init_retry_s = init_retry_s
        self._init_retry_at = 0.0
        self._clock = clock
        self.events: queue.Queue[str] = queue.Queue()
        # A request also writes a byte here, which ends the loop's one wait (with the socket directory's).
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self.state = SupervisorState()
        self.plugins: NodePlugins | None = None
        self.servers: list[ResourceServer] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._registered_with: tuple[int, int] | None = None  # identity of the kubelet.sock we registered with

    # -- requests from other threads (signal handlers, config watchers) --
    def request_reload(self, cause: str = "reload") -> None:
        self.events.put(cause)
        self._wake()

    def request_stop(self) -> None:
        self._stop.set()
        self.events.put("stop")
        self._wake()

    def _wake(self) -> None:
        """Ends the loop's wait (safe in a signal handler: one non-blocking write; a full pipe is awake)."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _woken(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 4096):
                pass

    def live(self, max_age_s: float = 30.0) -> bool:
        return self._clock() - self.state.last_beat <= max_age_s

    def ready(self) -> bool:
        return self.state.registered

    # -- start / stop --
    def _start(self) -> None:
        """Build, serve, confirm, register. Raises PermanentError/TransientError."""
        try:
            plugins = self._build()
        except PermanentError:
            raise
        except Exception as e:
            self.state.build_error = str(e)
            if self._fail_on_init_error():
                raise PermanentError(f"device plugin init failed: {e}") from e
            log.error("event=init-failed error=%s fail_on_init_error=false action=advertise-nothing retry_in_s=%.0f",
                      e, self._init_retry_s)
            self._init_retry_at = self._clock() + self._init_retry_s
            self.plugins, self.servers = None, []
            self.state.started = True
            self.state.registered = True  # nothing to register: ready, but empty
            return
        self.state.build_error = ""
        self.plugins = plugins
        plugins.start()
        self.servers = [ResourceServer(p, self.socket_dir) for p in plugins.plugins]
        try:
            for s in self.servers:
                s.start()
        except BaseException:
            self._stop_all()  # nothing half-started is left behind for the retry
            raise
        self.state.started = True
        self._register_all()

    def _kubelet_inode(self) -> tuple[int, int] | None:
        """The kubelet socket's identity (inode numbers are reused, so the change time too)."""
        try:
            st = self.kubelet_socket.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def _register_all(self) -> None:
        pending = [s for s in self.servers if not s.registered]
        inode = self._kubelet_inode()
        for s in pending:
            s.register(self.kubelet_socket)
            self.metrics.registered.labels(resource=s.plugin.name).set(1)
            self.metrics.registrations.labels(resource=s.plugin.name).inc()
        self.state.registered = all(s.registered for s in self.servers)
        if pending:
            self._registered_with = inode

    def _stop_all(self, final: bool = False) -> None:
        """Stop the servers and plugins; only a ``final`` stop waits for the health monitor (a restart
        re-registers within a second: NVIDIA's plugin does not wait for its health goroutine either)."""
        for s in self.servers:
            s.stop()
            self.metrics.registered.labels(resource=s.plugin.name).set(0)
        if self.plugins is not None:
            self.plugins.stop(wait=final)
        self.servers, self.plugins = [], None
        self.state.started = False
        self.state.registered = False

    def _watched(self) -> list[str]:
        return [KUBELET_SOCKET_NAME, *(s.socket_path.name for s in self.servers)]

    # -- main loop --
    def run(self) -> int:
        """Returns the exit code: 0 after a requested stop, 1 after a permanent failure."""
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        watcher = DirWatcher(self.socket_dir, [KUBELET_SOCKET_NAME], use_inotify=self._use_inotify)
        retry_s = 1.0
        next_retry = 0.0
        try:
            while not self._stop.is_set():
                self.state.last_beat = self._clock()
                self.metrics.heartbeat.set(self.state.last_beat)
                try:
                    with self._lock:
                        if not self.state.started:
                            self._start()
                            watcher.watch_names(self._watched())
                        elif not self.state.registered and self._clock() >= next_retry:
                            self._register_all()
                    retry_s = 1.0
                except TransientError as e:
                    log.warning("event=start-retry error=%s retry_in_s=%.1f", e, retry_s)
                    watcher.watch_names(self._watched())
                    next_retry = self._clock() + retry_s
                    retry_s = min(retry_s * 2, MAX_RETRY_S)
                if self.state.build_error and self.plugins is None and self._clock() >= self._init_retry_at:
                    log.info("event=init-retry")
                    with self._lock:
                        self._stop_all()
                    continue
                cause = self._wait(watcher, self._wait_s(next_retry))
                if cause is None:
                    continue
                if cause == "stop":
                    break
                if cause == "kubelet-socket" and not self.state.registered:
                    next_retry = 0.0  # kubelet is back: register now
                    if self.state.started and not any(s.registered for s in self.servers):
                        continue
                log.info("event=restart cause=%s", cause)
                self.metrics.restarts.labels(cause=cause).inc()
                self.state.restarts += 1
                with self._lock:
                    self._stop_all()
                next_retry = 0.0
        except PermanentError as e:
            log.error("event=fatal error=%s", e)
            with self._lock:
                self._stop_all(final=True)
            return 1
        finally:
            watcher.close()
        with self._lock:
            self._stop_all(final=True)
        log.info("event=stopped")
        return 0

    def _wait_s(self, next_retry: float) -> float:
        """How long the loop may sleep: until the next registration or init retry, else :data:`IDLE_WAIT_S`."""
        if not self.state.registered:
            return max(0.05, next_retry - self._clock())
        if self.state.build_error and self.plugins is None:
            return max(0.05, min(IDLE_WAIT_S, self._init_retry_at - self._clock()))
        return IDLE_WAIT_S

    def _wait(self, watcher: DirWatcher, timeout_s: float) -> str | None:
        """The next cause to act on: a queued request or a socket change (coalesced)."""
        try:
            return self._drain(self.events.get_nowait())
        except queue.Empty:
            pass
        changed = watcher.wait(timeout_s, wake_fd=self._wake_r)
        self._woken()
        if changed:
            own = {s.socket_path.name for s in self.servers}
            if changed & own and any(not s.socket_path.exists() for s in self.servers):
                return self._drain("socket-removed")
            if KUBELET_SOCKET_NAME in changed:
                inode = self._kubelet_inode()
                if inode is None:
                    return None  # kubelet went away; its new socket will come as a create
                if self.state.registered and inode == self._registered_with:
                    return None  # we already registered with this kubelet instance
                return self._drain("kubelet-socket")
            return None
        try:
            return self._drain(self.events.get_nowait())
        except queue.Empty:
            return None

    def _drain(self, first: str | None) -> str | None:
        if first is None:
            return None
        cause = first
        while True:
            try:
                nxt = self.events.get_nowait()
            except queue.Empty:
                return cause
            if nxt == "stop":
                return "stop"
