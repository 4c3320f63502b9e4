"""Prometheus metrics of the device plugin, plus the liveness and readiness endpoints.

One registry per plugin process (tests create their own): allocations and their failures, health
transitions, devices by health and whether each resource is registered with kubelet. The HTTP server
serves ``/metrics``, ``/healthz`` (the supervisor loop is alive) and ``/readyz`` (every resource is
registered), which the DaemonSet's probes use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

NAMESPACE = "nvidia_gpu_device_plugin"


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.allocations = Counter(f"{NAMESPACE}_allocations_total", "Container allocations answered.",
                                   ["resource"], registry=r)
        self.allocated_devices = Counter(f"{NAMESPACE}_allocated_devices_total", "Devices handed to containers.",
                                         ["resource"], registry=r)
        self.allocation_errors = Counter(f"{NAMESPACE}_allocation_errors_total", "Allocate requests rejected.",
                                         ["resource"], registry=r)
        self.allocate_seconds = Histogram(f"{NAMESPACE}_allocate_duration_seconds", "Allocate handling time.",
                                          ["resource"], registry=r,
                                          buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05))
        self.preferred = Counter(f"{NAMESPACE}_preferred_allocations_total", "Preferred allocations answered.",
                                 ["resource"], registry=r)
        self.health_transitions = Counter(f"{NAMESPACE}_health_transitions_total", "Device health changes.",
                                          ["device", "to", "reason"], registry=r)
        self.devices = Gauge(f"{NAMESPACE}_devices", "Advertised devices by health.", ["resource", "health"],
                             registry=r)
        self.registered = Gauge(f"{NAMESPACE}_registered", "1 while the resource is registered with kubelet.",
                                ["resource"], registry=r)
        self.registrations = Counter(f"{NAMESPACE}_registrations_total", "Registrations with kubelet.",
                                     ["resource"], registry=r)
        self.restarts = Counter(f"{NAMESPACE}_restarts_total", "Plugin restarts by cause.", ["cause"], registry=r)
        self.heartbeat = Gauge(f"{NAMESPACE}_loop_heartbeat_seconds", "Last supervisor loop pass (monotonic).",
                               registry=r)

    def on_transition(self, uuid: str, healthy: bool, reason: str) -> None:
        self.health_transitions.labels(device=uuid, to="Healthy" if healthy else "Unhealthy", reason=reason).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


class Renders(Protocol):
    """What ``/metrics`` serves: the Prometheus text format, rendered per scrape."""

    def render(self) -> bytes: ...


class StatusServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port (a daemon thread); the device plugin's, and
    the metrics exporter's (``node_agent.exporter``)."""

    def __init__(self, metrics: Renders, live: Callable[[], bool], ready: Callable[[], bool],
                 host: str = "0.0.0.0", port: int = 0):
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
                    self._reply(200 if ok else 503, b"ok\n" if ok else b"not registered\n")
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

