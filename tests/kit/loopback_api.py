"""A scripted Kubernetes API stand-in on loopback, HTTP or HTTPS (optionally asking for a client certificate).

Each request is recorded (method, path, query, headers, the client certificate's subject) and answered by
the first handler registered for its method and path: a ``(status, body)`` pair, a list of them (one per
request, the last repeated), or a callable that writes the response itself (watch streams). For the unit
tests of ``node_agent.kube``: error mapping, credentials, watch behaviour, without a real API server.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from localcluster.pki import Pki, make_pki


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    client_subject: str = ""
    body: Any = None


Answer = tuple[int, Any]
Handler = Answer | list[Answer] | Callable[[BaseHTTPRequestHandler, Seen], None]


@dataclass
class LoopbackApi:
    tls: ssl.SSLContext | None = None
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        outer = self

        class Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                subject = ""
                if isinstance(self.connection, ssl.SSLSocket):
                    cert = self.connection.getpeercert()
                    if cert:
                        names = dict(rdn[0] for rdn in cert["subject"] if isinstance(rdn[0], tuple))
                        subject = str(names.get("commonName", ""))
                seen = Seen(self.command, url.path, dict(urllib.parse.parse_qsl(url.query)),
                            {k.lower(): v for k, v in self.headers.items()}, subject,
                            json.loads(raw) if raw else None)
                outer.seen.append(seen)
                handler = outer.routes.get((self.command, url.path))
                if handler is None:
                    self.answer(404, {"kind": "Status", "code": 404, "message": f"no route {url.path}"})
                elif callable(handler):
                    handler(self, seen)
                elif isinstance(handler, list):
                    self.answer(*(handler.pop(0) if len(handler) > 1 else handler[0]))
                else:
                    self.answer(*handler)

            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def do_PATCH(self) -> None:
                self._handle()

            def do_DELETE(self) -> None:
                self._handle()

            def answer(self, status: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def stream(self, lines: list[dict[str, Any]], hold: threading.Event | None = None) -> None:
                """A chunked watch response: each line, then (``hold``) stay open until it is set or the
                client goes away."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for line in lines:
                        data = json.dumps(line).encode() + b"\n"
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    if hold is not None:
                        hold.wait(30)
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    return

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Request)
        self.server.daemon_threads = True
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if self.tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requests(self, method: str, path: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path == path]


@dataclass(frozen=True)
class LoopbackPki:
    """The loopback control plane's CA and serving pair, plus a client certificate it signed."""

    pki: Pki
    client_cert: Path
    client_key: Path

    def server_context(self, require_client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.serving_cert), str(self.pki.serving_key))
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
        return ctx


def make_test_pki(directory: Path, client_cn: str = "system:node-agent") -> LoopbackPki:
    pki = make_pki(directory)
    cert, key, csr = directory / "client.crt", directory / "client.key", directory / "client.csr"
    if not cert.exists():
        ext = directory / "client.ext"
        ext.write_text("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
        for args in (["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={client_cn}", "-keyout", str(key),
                      "-out", str(csr)],
                     ["x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
                      "-CAcreateserial", "-days", "30", "-extfile", str(ext), "-out", str(cert)]):
            subprocess.run(["openssl", *args], check=True, capture_output=True)
    return LoopbackPki(pki, cert, key)
