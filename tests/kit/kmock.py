"""One kmock Kubernetes emulator on loopback, in a background event loop, for the tests with real clients.

kmock (see the offline-toolchain notes) serves Node reads, merge patches, pod lists, Event creation and the
``resource.k8s.io/v1`` kinds the DRA tests store; it ignores field selectors (callers filter again), has no
eviction subresource (callers treat a 404 as "already gone") and answers 404 when listing a kind it never
stored. :func:`fake_api_server` gives the emulator itself (the DRA tests read its objects);
:func:`kmock_server` only its URL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
from kubernetes import client

from node_agent.kube.transport import Kube


@dataclass
class FakeApiServer:
    url: str
    emulator: Any
    loop: asyncio.AbstractEventLoop

    def api_client(self) -> client.ApiClient:
        """The official client, typed, for tests seeding and reading the emulator."""
        return api(self.url)

    def kube(self) -> Kube:
        """The agent's own connection (``node_agent.kube``) to the emulator."""
        return kube(self.url)

    def slices(self) -> list[dict[str, Any]]:
        out = []
        for (resource, _ns, _name), obj in list(self.emulator.objects.items()):
            if resource.plural == "resourceslices" and not obj.deleted:
                out.append(dict(obj.raw))
        return out


@contextmanager
def fake_api_server() -> Iterator[FakeApiServer]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop: asyncio.Event | None = None
    box: dict[str, Any] = {}

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            for plural in ("resourceslices", "resourceclaims", "deviceclasses"):
                emulator.resources[f"resource.k8s.io/v1/{plural}"] = kmock.ResourceInfo()
            box["server"] = FakeApiServer(str(server.url).rstrip("/"), emulator, loop)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), name="kmock", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("kmock did not start")
    try:
        yield box["server"]
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        if not thread.is_alive():
            loop.close()


@contextmanager
def kmock_server() -> Iterator[str]:
    """The emulator's URL only."""
    with fake_api_server() as server:
        yield server.url


def api(url: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url.rstrip("/")
    return client.ApiClient(cfg)


def kube(url: str) -> Kube:
    return Kube.for_url(url.rstrip("/"))


def kubeconfig(url: str, path: Path) -> Path:
    """A kubeconfig naming the emulator (no credentials: kmock asks for none)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: t, user: {}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}]\n"
    )
    return path
