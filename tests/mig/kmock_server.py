"""A kmock Kubernetes emulator on loopback, in a background event loop, for the real-client tests.

kmock (see the offline-toolchain notes) serves Node reads, merge patches, pod lists and Event creation
over HTTP; it ignores field selectors (the wrapper filters again), has no eviction subresource (the
wrapper treats a 404 as "already gone") and answers 404 when listing a kind it never stored.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kmock
from kubernetes import client


@contextmanager
def kmock_server() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with kmock.KubernetesEmulator() as k, kmock.Server(k) as srv:
            box["url"] = str(srv.url).rstrip("/")
            box["stop"] = asyncio.Event()
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    assert ready.wait(10), "kmock did not start"
    try:
        yield box["url"]
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)
        loop.close()


def api(url: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    return client.ApiClient(cfg)


def kubeconfig(url: str, path: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: t, user: {}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}]\n"
    )
    return path
