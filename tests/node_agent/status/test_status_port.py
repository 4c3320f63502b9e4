"""The status endpoint when another process holds its port: optional (the plugins keep serving the kubelet
and bind it once it is free) or required (the agent stops with one line naming the address)."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from node_agent.kubelet.deviceplugin.process import Watchdog
from node_agent.status.server import StatusPortError, StatusServer


class _Text:
    def render(self) -> bytes:
        return b"up 1\n"


@pytest.fixture
def held() -> Iterator[socket.socket]:
    """A loopback port another process would hold (listening, as a server does)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s
    finally:
        s.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return int(r.status), r.read()


def test_a_required_port_that_is_taken_fails_naming_the_address(held: socket.socket) -> None:
    port = held.getsockname()[1]
    with pytest.raises(StatusPortError, match=rf"^status endpoint 127\.0\.0\.1:{port}: Address already in use "
                                              r"\(errno 98\)$"):
        StatusServer(_Text(), lambda: True, lambda: True, "127.0.0.1", port)


def test_an_optional_port_is_logged_once_then_bound_when_free(held: socket.socket,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    port = held.getsockname()[1]
    caplog.set_level(logging.DEBUG, "node_agent.status.server")
    server = StatusServer(_Text(), lambda: True, lambda: True, "127.0.0.1", port, required=False, retry_s=0.05)
    try:
        assert (server.bound, server.port) == (False, 0)
        server.start()
        time.sleep(0.3)  # several retries while the port is held
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [f"event=status-port-unavailable address=127.0.0.1 port={port} error=Address already "
                            "in use (errno 98) action=serve-without-status retry_s=0.05"]
        held.close()
        deadline = time.monotonic() + 5
        while not server.bound and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.port == port
        assert _get(port, "/metrics") == (200, b"up 1\n")
        assert any(r.getMessage() == f"event=status-port-bound address=127.0.0.1 port={port}"
                   for r in caplog.records)
    finally:
        server.stop()


def test_stopping_an_endpoint_that_never_got_its_port_returns_at_once(held: socket.socket) -> None:
    server = StatusServer(_Text(), lambda: True, lambda: True, "127.0.0.1", held.getsockname()[1], required=False)
    server.start()
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 1.0
    assert not server.bound


def test_the_device_plugins_watchdog_ends_a_stalled_process_and_spares_a_live_one() -> None:
    exits: list[int] = []
    beats = {"live": True}
    dog = Watchdog(lambda max_age: beats["live"], stall_s=0.05, every_s=0.02, exit_process=exits.append)
    dog.start()
    try:
        time.sleep(0.2)
        assert exits == []
        beats["live"] = False
        deadline = time.monotonic() + 2
        while not exits and time.monotonic() < deadline:
            time.sleep(0.01)
        assert exits == [1]
    finally:
        dog.stop()
