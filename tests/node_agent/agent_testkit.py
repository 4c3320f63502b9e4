"""Helpers of the node-agent tests: in-process CLI runs, and the kit's kmock API server with the Node they
label (used by conftest)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from node_agent.cli import main
from tests.kit.kmock import api, fake_api_server, kubeconfig

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
        return client.CoreV1Api(api(self.url))

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.core().read_node(node).metadata.labels or {})

    def set_labels(self, node: str, labels: dict[str, str | None]) -> None:
        self.core().patch_node(node, {"metadata": {"labels": labels}},
                               _content_type="application/merge-patch+json")


@contextmanager
def kmock_api_server(workdir: Path) -> Iterator[ApiServer]:
    """The kit's kmock emulator (:func:`tests.kit.kmock.fake_api_server`) with Node ``gpu-node-1``, and a
    kubeconfig for it in ``workdir``."""
    with fake_api_server() as emulator:
        server = ApiServer(emulator.url, kubeconfig(emulator.url, workdir / "kubeconfig"))
        server.core().create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "gpu-node-1", "labels": {"kubernetes.io/hostname": "gpu-node-1"}}})
        yield server
