"""kmock's Kubernetes emulator on a loopback port, run in a background event loop for sync clients."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import kmock
from kubernetes import client


@dataclass
class FakeApiServer:
    url: str
    emulator: Any
    loop: asyncio.AbstractEventLoop

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.url.rstrip("/")
        return client.ApiClient(cfg)

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
                emulator.resources[f"resource.k8s.io/v1/{plural}"] = {}
            box["server"] = FakeApiServer(str(server.url), emulator, loop)
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
        loop.close()
