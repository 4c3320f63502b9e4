"""Test kit for the node-agent tests: in-process CLI runs and a kmock API server (used by conftest)."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
from kubernetes import client

from node_agent.cli import main

Cli = Callable[..., tuple[int, Any]]


def run_cli(root: Path | str, nvml: str, *args: str, node: str | None = None,
            kubeconfig: Path | None = None) -> tuple[int, Any]:
    """``python -m node_agent --json ...`` in-process: (exit code, parsed JSON output)."""
    argv = ["--host-root", str(root), "--host-exec", "direct", "--nvml", nvml, "--json"]
    if node:
        argv += ["--node-name", node]
    if kubeconfig:
        argv += ["--kubeconfig", str(kubeconfig)]
    out = io.StringIO()
    with redirect_stdout(out):
        code = main([*argv, *args])
    text = out.getvalue()
    return code, json.loads(text) if text.strip() else None


@dataclass
class ApiServer:
    url: str
    kubeconfig: Path

    def core(self) -> Any:
        cfg = client.Configuration()
        cfg.host = self.url
        return client.CoreV1Api(client.ApiClient(cfg))

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.core().read_node(node).metadata.labels or {})

    def set_labels(self, node: str, labels: dict[str, str | None]) -> None:
        self.core().patch_node(node, {"metadata": {"labels": labels}},
                               _content_type="application/merge-patch+json")


@contextmanager
def kmock_api_server(workdir: Path) -> Iterator[ApiServer]:
    """kmock's Kubernetes emulator on a loopback port, with Node ``gpu-node-1``, and a kubeconfig for it."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        box["stop"] = asyncio.Event()
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            box["url"] = str(server.url).rstrip("/")
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="kmock", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("kmock did not start")
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": box["url"]}}],
        "users": [{"name": "test", "user": {"token": "test"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    server = ApiServer(box["url"], kubeconfig)
    server.core().create_node({"apiVersion": "v1", "kind": "Node",
                               "metadata": {"name": "gpu-node-1", "labels": {"kubernetes.io/hostname": "gpu-node-1"}}})
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)
        loop.close()
