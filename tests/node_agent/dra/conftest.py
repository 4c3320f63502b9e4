"""Fixtures for the DRA tests: a short host root (unix socket paths are limited to 107 bytes), a fake
API server, and a running plugin with its kubelet stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import kmock
import pytest
from kubernetes import client

from node_agent.dra.api import KubeDraApi
from node_agent.dra.claims import ClaimRef
from node_agent.dra.driver import DraDriver, DriverSettings
from node_agent.dra.nvml_source import NvmlInventorySource
from node_agent.dra.sharing import NvidiaSmiSharing
from node_agent.host import HostRoot
from node_agent.kubelet.dra.server import PluginServer
from tests.kit.dra_builders import DRIVER, NODE, FakeSource, RecordingSharing, machine, populate_dev
from tests.kit.kmock import FakeApiServer, fake_api_server
from tests.kit.kubelet.common import short_root
from tests.kit.kubelet.dra import DraKubelet
from tests.kit.recording_exec import RecordingExec

BOOT_ID = "11111111-2222-3333-4444-555555555555"


@pytest.fixture
def host_root() -> Iterator[Path]:
    with short_root("dra-") as root:
        boot = root / "proc/sys/kernel/random/boot_id"
        boot.parent.mkdir(parents=True)
        boot.write_text(BOOT_ID + "\n")
        yield root


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        server.emulator.objects[kmock.resource("", "v1", "nodes"), None, NODE] = {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}}
        yield server


@dataclass
class Env:
    root: Path
    server: FakeApiServer
    source: FakeSource
    sharing: RecordingSharing
    driver: DraDriver

    def new_driver(self, **settings: object) -> DraDriver:
        """A fresh driver process on the same host (a plugin restart)."""
        return make_driver(self.root, self.server, self.source, self.sharing, **settings)


def make_driver(root: Path, server: FakeApiServer, source: FakeSource, sharing: RecordingSharing,
                **settings: object) -> DraDriver:
    cfg = DriverSettings(driver=DRIVER, node=NODE, **settings)  # type: ignore[arg-type]
    return DraDriver(cfg, api=KubeDraApi(server.kube()), source=source, host=HostRoot(root), backend=sharing)


@pytest.fixture
def env(host_root: Path, api_server: FakeApiServer) -> Env:
    source = FakeSource(machine(gpus=2, mig_on=(1,), vfio=1))
    populate_dev(host_root, source.snapshot())
    sharing = RecordingSharing()
    return Env(host_root, api_server, source, sharing, make_driver(host_root, api_server, source, sharing))


@dataclass
class Node:
    root: Path
    server: FakeApiServer
    exec: RecordingExec
    driver: DraDriver
    uuids: list[str]

    def put(self, body: dict[str, Any]) -> ClaimRef:
        meta = body["metadata"]
        claims = client.ResourceV1Api(self.server.api_client())
        claims.create_namespaced_resource_claim(meta["namespace"], cast(Any, body))
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


@pytest.fixture
def node(host_root: Path, api_server: FakeApiServer) -> Iterator[Node]:
    """A simulated DGX H100 whose sharing commands run through the production backend and a recorder."""
    rec = RecordingExec()
    host = HostRoot(host_root, executor=rec)
    source = NvmlInventorySource("simulated:dgx-h100", HostRoot(host_root))
    inventory = source.snapshot()
    populate_dev(host_root, inventory)
    driver = DraDriver(DriverSettings(driver=DRIVER, node=NODE), api=KubeDraApi(api_server.kube()),
                       source=source, host=host, backend=NvidiaSmiSharing(host))
    driver.start()
    try:
        yield Node(host_root, api_server, rec, driver, [g.uuid for g in inventory.gpus])
    finally:
        driver.close()
        source.close()


@pytest.fixture
def plugin(env: Env) -> Iterator[tuple[PluginServer, DraKubelet]]:
    """The DRA plugin's gRPC server on ``env``'s driver, registered with a test kubelet."""
    env.driver.start()
    server = PluginServer(env.driver, HostRoot(env.root))
    server.start(watch_interval=0.05)
    kubelet = DraKubelet(env.root)
    kubelet.register()
    yield server, kubelet
    kubelet.close()
    server.stop(grace=0.1)
