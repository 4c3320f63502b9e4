"""The only paths between the host's loopback, where the control plane listens, and the real nodes' network
namespaces: no interface, route or address is ever added to the host's own namespace (DRAFT, issue 35).

- kube-apiserver -> kubelet (logs, exec, port-forward) and -> pods (a webhook or aggregated API behind a
  Service, which the API server resolves to an endpoint: ``--enable-aggregator-routing``): the API server's egress
  selector sends "cluster" traffic through an HTTP CONNECT proxy on a unix socket (this process). A CONNECT to
  a node's name or IP, or to an IP in a node's pod range, is dialled from inside that node's netns; one to a
  loopback address (a webhook a test serves on 127.0.0.1) from the host's; anything else is refused (502):
  nothing the cluster dials may leave this machine.
- node -> kube-apiserver: in each node's netns a listener on ``0.0.0.0:6443`` (the kubelet's kubeconfig
  names ``https://127.0.0.1:6443``; pods reach it through the node's DNAT of ``10.96.0.1:443``), forwarded
  to the API server on the host.

A socket belongs to the netns its creating thread was in: ``setns(2)`` into the node's netns, ``socket()``,
``setns`` back. Python 3.11 has no ``os.setns``, hence ctypes.

The nodes come and go: the proxy re-reads ``NODES_DIR/*/state.json`` (written by
:class:`localcluster.node.Node`) every :data:`RESCAN_S` seconds and on SIGHUP, opens the API listener in a new
node's netns and closes a removed node's (a listening socket would otherwise keep its netns alive).

    python -m localcluster.netproxy --uds EGRESS.sock --api 127.0.0.1:PORT --nodes-dir CLUSTER/nodes
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ipaddress
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

CLONE_NEWNET = 0x40000000
#: The port the API server is reachable on inside every node's netns.
NODE_API_PORT = 6443
#: Seconds between two reads of the nodes' state files.
RESCAN_S = 0.5
_libc = ctypes.CDLL(None, use_errno=True)
_ns_lock = threading.Lock()


@dataclass(frozen=True)
class NodeRoute:
    name: str
    ip: str
    netns: str
    pod_cidr: str = ""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def _in_netns(netns: str) -> Iterator[None]:
    """This thread in ``netns`` for the block; the lock keeps other threads' sockets out of it."""
    host = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        with _ns_lock:
            _setns(target)
            try:
                yield
            finally:
                _setns(host)
    finally:
        os.close(target)
        os.close(host)


def socket_in(netns: str | None) -> socket.socket:
    """A TCP socket of ``netns`` (the host's when None)."""
    if netns is None:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with _in_netns(netns):
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    def one(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                with contextlib.suppress(OSError):
                    s.shutdown(how)

    back = threading.Thread(target=one, args=(b, a), name="netproxy-pipe", daemon=True)
    back.start()
    one(a, b)
    back.join()
    a.close()
    b.close()


def _connect(conn: socket.socket, nodes: Nodes) -> None:
    """One CONNECT from the API server: answer 200 and splice, or 502 with the reason."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk:
            conn.close()
            return
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    parts = head.split(b"\r\n")[0].decode(errors="replace").split()
    if len(parts) < 2 or parts[0] != "CONNECT":
        conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
        conn.close()
        return
    host, port = parts[1].rsplit(":", 1)
    host = host.strip("[]")
    route, target = nodes.route(host)
    if route is None and not _is_loopback(host):
        conn.sendall(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{host} is no node, pod or loopback address".encode())
        conn.close()
        return
    try:
        upstream = socket_in(route.netns if route else None)
        upstream.settimeout(10)
        upstream.connect((target, int(port)))
        upstream.settimeout(None)
    except OSError as e:
        conn.sendall(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{e}".encode())
        conn.close()
        return
    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    if rest:
        upstream.sendall(rest)
    _pipe(conn, upstream)


def _is_loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return host == "localhost"


def serve_egress(uds: str, nodes: Nodes) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(uds)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(uds)
    os.chmod(uds, 0o600)
    server.listen(64)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_connect, args=(conn, nodes), name="netproxy-connect", daemon=True).start()


def listen_node_api(netns: str) -> socket.socket:
    """The listening socket for the API server inside ``netns`` on :data:`NODE_API_PORT`."""
    server = socket_in(netns)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", NODE_API_PORT))
    server.listen(64)
    return server


def serve_node_api(server: socket.socket, api: tuple[str, int]) -> None:
    """Forward every connection ``server`` accepts to the API server on the host, until it is shut down."""

    def forward(conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(api, timeout=10)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        _pipe(conn, upstream)

    while True:
        try:
            conn, _ = server.accept()
        except OSError:  # shut down by Nodes.rescan: the node is gone
            server.close()
            return
        threading.Thread(target=forward, args=(conn,), name="netproxy-api", daemon=True).start()


class Nodes:
    """The routes (by node name and by IP) and API listeners of the nodes under ``directory``."""

    def __init__(self, directory: Path, api: tuple[str, int]) -> None:
        self.directory = directory
        self.api = api
        self.routes: dict[str, NodeRoute] = {}
        self._listeners: dict[str, tuple[str, socket.socket]] = {}  # name -> (netns inode key, socket)
        self._lock = threading.Lock()

    def rescan(self) -> None:
        with self._lock:
            self._rescan()

    def _rescan(self) -> None:
        seen: dict[str, tuple[NodeRoute, str]] = {}
        for state_file in sorted(self.directory.glob("*/state.json")):
            netns = state_file.parent / "ns" / "net"
            try:
                state = json.loads(state_file.read_text())
                if state.get("removing") or not (state_file.parent / "ns" / "created").exists():
                    continue
                st = os.stat(netns)
            except (OSError, ValueError):
                continue
            name = str(state["name"])
            seen[name] = (NodeRoute(name, str(state["ip"]), str(netns), str(state.get("pod_cidr", ""))),
                          f"{st.st_dev}:{st.st_ino}")
        for name, (key, server) in list(self._listeners.items()):
            if name not in seen or seen[name][1] != key:
                with contextlib.suppress(OSError):
                    server.shutdown(socket.SHUT_RDWR)
                del self._listeners[name]
        for name, (route, key) in seen.items():
            if name in self._listeners:
                continue
            try:
                server = listen_node_api(route.netns)
            except OSError as e:
                print(f"netproxy: no API listener in {name}'s netns yet: {e}", flush=True)
                continue
            self._listeners[name] = (key, server)
            threading.Thread(target=serve_node_api, args=(server, self.api), name=f"netproxy-api-{name}",
                             daemon=True).start()
        routes: dict[str, NodeRoute] = {}
        for route, _ in seen.values():
            routes[route.name] = routes[route.ip] = route
        self.routes = routes

    def route(self, host: str) -> tuple[NodeRoute | None, str]:
        """The node whose netns ``host`` is dialled from and the address to dial: a node by name (the API
        server names a node by its Hostname address first, ``--kubelet-preferred-address-types``) or IP, or the
        node whose pod range holds ``host``; (None, host) for anything else."""
        routes = self.routes
        if host in routes:
            return routes[host], routes[host].ip
        with contextlib.suppress(ValueError):
            address = ipaddress.ip_address(host)
            for route in set(routes.values()):
                if route.pod_cidr and address in ipaddress.ip_network(route.pod_cidr):
                    return route, host
        return None, host

    def run(self) -> None:
        while True:
            self.rescan()
            time.sleep(RESCAN_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.netproxy", description=__doc__.splitlines()[0])
    parser.add_argument("--uds", required=True, help="the egress selector's unix socket")
    parser.add_argument("--api", required=True, help="the API server, HOST:PORT on the host")
    parser.add_argument("--nodes-dir", required=True, type=Path, help="the cluster's nodes/ directory")
    args = parser.parse_args(argv)
    host, port = args.api.rsplit(":", 1)
    nodes = Nodes(args.nodes_dir, (host, int(port)))
    nodes.rescan()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=nodes.rescan, name="netproxy-rescan", daemon=True).start()

    signal.signal(signal.SIGHUP, on_hup)
    threading.Thread(target=nodes.run, name="netproxy-rescan-loop", daemon=True).start()
    serve_egress(args.uds, nodes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
