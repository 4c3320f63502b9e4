"""A minimal Kubernetes API stand-in for benchmarks: the few endpoints the DRA plugin calls, served from
dicts by a threaded stdlib HTTP server on loopback, so the measured latency is the plugin's, not an
emulator's (kmock scans every stored object and keeps every request, which grows with the run)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)")
_SLICE = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices/([^/?]+)")
_SLICES = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices/?(\?.*)?$")
_NODE = re.compile(r"^/api/v1/nodes/([^/?]+)")


class LocalApi:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def _send(self, code: int, body: Any) -> None:
                # One write for status, headers and body: two small writes meet Nagle's algorithm and the
                # client's delayed ACK, which adds 40 ms to every call (a real API server writes once).
                data = json.dumps(body).encode()
                head = (f"HTTP/1.1 {code} {'OK' if code < 300 else 'Not Found'}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n").encode()
                self.wfile.write(head + data)

            def _body(self) -> Any:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")

            def do_GET(self) -> None:
                with api.lock:
                    if m := _CLAIM.match(self.path):
                        obj = api.claims.get((m.group(1), m.group(2)))
                    elif _SLICES.match(self.path):
                        obj = {"items": list(api.slices.values())}
                    elif m := _NODE.match(self.path):
                        obj = api.nodes.get(m.group(1))
                    else:
                        obj = None
                self._send(200, obj) if obj is not None else self._send(404, {"kind": "Status", "code": 404})

            def do_POST(self) -> None:
                body = self._body()
                with api.lock:
                    api.slices[body["metadata"]["name"]] = body
                self._send(201, body)

            def do_PATCH(self) -> None:
                body = self._body()
                m = _SLICE.match(self.path)
                with api.lock:
                    if m and m.group(1) in api.slices:
                        api.slices[m.group(1)] = {**api.slices[m.group(1)], **body}
                        found = api.slices[m.group(1)]
                    else:
                        found = None
                self._send(200, found) if found else self._send(404, {"kind": "Status", "code": 404})

            def do_DELETE(self) -> None:
                m = _SLICE.match(self.path)
                with api.lock:
                    gone = api.slices.pop(m.group(1), None) if m else None
                self._send(200, gone) if gone else self._send(404, {"kind": "Status", "code": 404})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="local-api", daemon=True)

    def __enter__(self) -> LocalApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
