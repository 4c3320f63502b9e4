"""One HTTP server per agent process: ``/metrics``, ``/healthz`` and ``/readyz`` on one port.

Every long-running agent (device plugin, DRA plugin, MIG manager, node setup's monitor, the metrics
exporter) serves its Prometheus metrics and its probes here, so one scrape object and one probe shape fit
them all. The server renders per request (no caching: a scrape sees the state of that moment) from a
daemon thread, and is quiet: requests are not logged.

A port that cannot be bound is fatal only where the port is the agent's product (the exporter, the
eviction guard's webhook) or where the stack says so (``cluster.monitoring.requireStatusPort``). The
plugins serve the kubelet over unix sockets: a taken status port must not take the node's GPUs away, so
they log it once, serve without the endpoint and bind it as soon as it is free (``required=False``). The
pod's readiness probe, which asks this port, then shows the pod NotReady until it is bound. NVIDIA's
device plugin serves no port at all; its DRA plugin exits when its health port is taken (see
``docs/compatibility.md``): we keep the device plugin's availability and the DRA plugin's visibility.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

#: How often an optional endpoint whose port was taken tries again.
RETRY_S = 15.0


class StatusPortError(OSError):
    """A required status endpoint could not bind its address; the message names it."""


class Renders(Protocol):
    """What ``/metrics`` serves: the Prometheus text format, rendered per scrape."""

    def render(self) -> bytes: ...


class StatusServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port (a daemon thread). ``ready`` false answers
    503 with ``not_ready`` (what the process waits for: registration with kubelet, a first pass).

    The port is bound on construction. ``required`` (the default) lets the ``OSError`` of a taken port
    through; otherwise the failure is logged once (``event=status-port-unavailable``) and :meth:`start`
    keeps trying every ``retry_s`` until the port is free (``event=status-port-bound``)."""

    def __init__(self, metrics: Renders, live: Callable[[], bool], ready: Callable[[], bool],
                 host: str = "0.0.0.0", port: int = 0, *, not_ready: bytes = b"not registered\n",
                 required: bool = True, retry_s: float = RETRY_S):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._reply(200, outer.metrics.render(), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    ok = outer.live()
                    self._reply(200 if ok else 503, b"ok\n" if ok else b"stalled\n")
                elif self.path == "/readyz":
                    ok = outer.ready()
                    self._reply(200 if ok else 503, b"ok\n" if ok else outer.not_ready)
                else:
                    self._reply(404, b"not found\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # quiet by default
                return

        self.metrics = metrics
        self.not_ready = not_ready
        self.live = live
        self.ready = ready
        self.address = (host, port)
        self.required = required
        self.retry_s = retry_s
        self._handler = Handler
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._serving = False
        #: Why the port could not be bound (empty once it is).
        self.error = ""
        if not self._bind():
            log.warning("event=status-port-unavailable address=%s port=%d error=%s action=serve-without-status "
                        "retry_s=%g", host, port, self.error, retry_s)

    def _bind(self) -> bool:
        """Bind the port; ``False`` (and :attr:`error` set) when it is taken and not required."""
        try:
            server = ThreadingHTTPServer(self.address, self._handler)
        except OSError as e:
            self.error = f"{e.strerror or e} (errno {e.errno})"
            if self.required:
                host, port = self.address
                err = StatusPortError(f"status endpoint {host}:{port}: {self.error}")
                err.errno = e.errno
                raise err from e
            return False
        server.daemon_threads = True
        self._server = server
        self.error = ""
        return True

    @property
    def bound(self) -> bool:
        """Whether the endpoint has its port (an optional one may still be waiting for it)."""
        return self._server is not None

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the kernel's pick for 0); 0 while not bound."""
        server = self._server
        return int(server.server_address[1]) if server is not None else 0

    def start(self) -> None:
        with self._lock:
            if self._server is not None:
                self._serve()
            else:
                self._thread = threading.Thread(target=self._retry, name="status-bind", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        assert self._server is not None
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True)
        self._thread.start()
        self._serving = True

    def _retry(self) -> None:
        while not self._stopping.wait(self.retry_s):
            with self._lock:
                if self._stopping.is_set():
                    return
                if self._bind():
                    log.info("event=status-port-bound address=%s port=%d", self.address[0], self.port)
                    self._serve()
                    return
                log.debug("event=status-port-unavailable port=%d error=%s", self.address[1], self.error)

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            server, serving = self._server, self._serving
            self._server, self._serving = None, False
        if server is not None:
            if serving:
                server.shutdown()
            server.server_close()


class RegistryRenderer:
    """A prometheus_client registry as :class:`Renders` (the agents' own metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
