"""One HTTP server per agent process: ``/metrics``, ``/healthz`` and ``/readyz`` on one port.

Every long-running agent (device plugin, DRA plugin, MIG manager, node setup's monitor, the metrics
exporter) serves its Prometheus metrics and its probes here, so one scrape object and one probe shape fit
them all. The server renders per request (no caching: a scrape sees the state of that moment) from a
daemon thread, and is quiet: requests are not logged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Renders(Protocol):
    """What ``/metrics`` serves: the Prometheus text format, rendered per scrape."""

    def render(self) -> bytes: ...


class StatusServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port (a daemon thread). ``ready`` false answers
    503 with ``not_ready`` (what the process waits for: registration with kubelet, a first pass)."""

    def __init__(self, metrics: Renders, live: Callable[[], bool], ready: Callable[[], bool],
                 host: str = "0.0.0.0", port: int = 0, *, not_ready: bytes = b"not registered\n"):
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
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()



class RegistryRenderer:
    """A prometheus_client registry as :class:`Renders` (the agents' own metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
