"""The eviction guard's HTTPS server: ``POST /validate-eviction`` for the API server, probes for the kubelet.

One thread per connection, at most :data:`MAX_CONNECTIONS` at once: a further connection is closed at
once (the API server retries; its webhook calls are few and short), so a flood of slow clients cannot
take the guard past its memory limit (2,000 held connections took it to 172 MiB against 128). The TLS
handshake runs in the connection's thread, bounded by :data:`HANDSHAKE_TIMEOUT_S`, and a connection that
sends nothing for :data:`IDLE_TIMEOUT_S` (between requests, or mid-request) is closed. A client that
goes away mid-request is logged at debug level, never as a traceback. A request body over
:data:`MAX_BODY` or a review that is not ``admission.k8s.io/v1`` is answered 400, which the API server
treats as a webhook failure, so with ``failurePolicy: Fail`` the eviction is refused, never let through.

``/readyz`` turns 200 once the webhook configuration trusts this process's CA: the stack orders the MIG
manager after the guard's Deployment, so the manager never starts while its evictions would be refused
for an untrusted certificate. ``/healthz`` is 200 while the server runs and its certificate is not due
for renewal (then the kubelet restarts the guard, which makes a new one).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import socket
import ssl
import sys
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from node_agent.admission import certificates
from node_agent.admission.eviction import PodNode, Verdict, judge, pod_node_from
from node_agent.admission.review import AdmissionReview, answer
from node_agent.kube.errors import KubeError
from node_agent.kube.transport import Kube
from nvgpu.evictionguard import WEBHOOK_PATH

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
HANDSHAKE_TIMEOUT_S = 10.0
#: A kept-alive connection the API server no longer uses, or a client that stalls mid-request.
IDLE_TIMEOUT_S = 30.0
#: Connections served at once; one API server keeps a few, a handful of them a few dozen.
MAX_CONNECTIONS = 64


@dataclass(frozen=True)
class GuardSettings:
    namespace: str
    configuration: str
    hosts: tuple[str, ...]
    listen: tuple[str, int]
    #: CA-bundle checks: every ``retry_s`` until the configuration trusts the CA, then every ``recheck_s``.
    retry_s: float = 5.0
    recheck_s: float = 60.0
    max_connections: int = MAX_CONNECTIONS
    idle_timeout_s: float = IDLE_TIMEOUT_S


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 context: ssl.SSLContext, max_connections: int = MAX_CONNECTIONS,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.context = context
        self._open: set[Any] = set()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.refused = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection while a slot is free; otherwise the connection is closed at once."""
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            log.warning("event=connection-refused client=%s reason=too-many-connections limit=%d", client_address,
                        self.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or stalled is routine for a server on a network: one debug line."""
        log.debug("event=connection-ended client=%s error=%r", client_address, sys.exc_info()[1])

    def close_connections(self) -> None:
        """End the API server's kept-alive connections too: a stopped guard answers nothing."""
        with self._lock:
            for conn in list(self._open):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The handshake in the connection's own thread (``process_request_thread`` calls this)."""
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log.debug("event=tls-handshake-failed client=%s error=%s", client_address, e)
            return
        tls.settimeout(self.idle_timeout_s)
        with self._lock:
            self._open.add(tls)
        try:
            super().finish_request(tls, client_address)
        finally:
            with self._lock:
                self._open.discard(tls)
            tls.close()


def tls_context(cert: certificates.ServingCertificate) -> ssl.SSLContext:
    """TLS 1.2+ with the serving certificate (ssl loads a chain only from files: a private temp dir)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="eviction-guard-") as tmp:
        chain, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        chain.write_bytes(cert.cert)
        key.touch(mode=0o600)
        key.write_bytes(cert.key)
        context.load_cert_chain(chain, key)
    return context


class EvictionGuard:
    """The server, its CA-bundle keeper and its readiness, started and stopped together."""

    def __init__(self, settings: GuardSettings, kube: Kube, *, pod_node: PodNode | None = None,
                 cert: certificates.ServingCertificate | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.cert = cert or certificates.generate(settings.hosts)
        self.pod_node = pod_node or pod_node_from(kube)
        self.trusted = threading.Event()
        self._stop = threading.Event()
        self.decisions = 0
        self._server = _TLSServer(settings.listen, self._handler(), tls_context(self.cert),
                                  settings.max_connections, settings.idle_timeout_s)
        self._threads = [threading.Thread(target=self._server.serve_forever, name="eviction-guard", daemon=True),
                         threading.Thread(target=self._keep_ca_bundle, name="ca-bundle", daemon=True)]

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        for t in self._threads:
            t.start()
        log.info("event=eviction-guard-serving address=%s:%d configuration=%s", self.settings.listen[0], self.port,
                 self.settings.configuration)

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        for t in self._threads:
            t.join(timeout=5)

    def _keep_ca_bundle(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                certificates.sync_ca_bundle(self.kube, self.settings.configuration, self.cert.ca)
                self.trusted.set()
                failures = 0
            except KubeError as e:
                failures += 1
                # The first failure is normal (the stack creates the configuration next); repeats are not.
                level = logging.INFO if failures == 1 else logging.WARNING
                log.log(level, "event=ca-bundle-not-set configuration=%s failures=%d error=%s",
                        self.settings.configuration, failures, e)
            self._stop.wait(self.settings.recheck_s if self.trusted.is_set() and not failures
                            else self.settings.retry_s)

    def decide(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """HTTP status and JSON answer for one webhook call."""
        try:
            review = AdmissionReview.model_validate_json(body)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return 400, {"error": f"not an admission.k8s.io/v1 AdmissionReview: {where}: {first['msg']}"}
        req = review.request
        verdict: Verdict = judge(req, self.pod_node)
        self.decisions += 1
        if verdict.allowed:
            log.debug("event=eviction-allowed user=%s pod=%s/%s", req.user_info.username, req.namespace, req.name)
        else:
            log.warning("event=eviction-refused user=%s pod=%s/%s dry_run=%s reason=%r", req.user_info.username,
                        req.namespace, req.name, req.dry_run, verdict.message)
        return 200, answer(req.uid, verdict.allowed, code=verdict.code, message=verdict.message)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        guard = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] != WEBHOOK_PATH:
                    return self._reply(404, {"error": f"no webhook at {self.path}"})
                try:
                    length = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    return self._reply(411, {"error": "Content-Length required"})
                if not 0 < length <= MAX_BODY:
                    return self._reply(413, {"error": f"body of {length} bytes; at most {MAX_BODY}"})
                self._reply(*guard.decide(self.rfile.read(length)))

            def do_GET(self) -> None:
                if self.path == "/healthz":
                    due = guard.cert.due(dt.datetime.now(dt.UTC))
                    self._reply(503 if due else 200, {"status": "certificate due for renewal" if due else "ok"})
                elif self.path == "/readyz":
                    ready = guard.trusted.is_set()
                    self._reply(200 if ready else 503, {"status": "ok" if ready else "CA bundle not set yet"})
                else:
                    self._reply(404, {"error": f"nothing at {self.path}"})

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # quiet: decisions are logged above
                return

        return Handler


def serve(settings: GuardSettings, kube: Kube, stopped: threading.Event) -> None:
    """Serve until ``stopped`` is set (the CLI sets it on SIGTERM/SIGINT)."""
    guard = EvictionGuard(settings, kube)
    guard.start()
    try:
        stopped.wait()
    finally:
        guard.stop()
