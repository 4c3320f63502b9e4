"""A kubelet stand-in for DRA: discovers the plugin in the registry dir, registers it through the real
``pluginregistration`` protocol, then calls NodePrepareResources/NodeUnprepareResources over the
plugin's socket exactly as kubelet does (version negotiation, 45 s call deadline)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from node_agent.kubelet.dra.server import reg_grpc, reg_pb, v1_grpc, v1_pb, v1beta1_grpc, v1beta1_pb
from tests.kit.kubelet.common import PLUGINS_REGISTRY_DIR, dial, wait_for_sockets

KUBELET_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
CALL_TIMEOUT = 45.0


@dataclass
class Registered:
    """A plugin kubelet accepted: its name, endpoint, the DRA version both sides speak, and a stub for it."""

    name: str
    endpoint: str
    version: str
    channel: grpc.Channel
    stub: Any
    pb: Any


class DraKubelet:
    """kubelet's plugin watcher and DRA manager for the node under ``host_root`` (``registry_dir`` is where
    it looks for registration sockets, a host path; ``known_versions`` the DRA versions this kubelet
    speaks, newest first)."""

    def __init__(self, host_root: Path, registry_dir: str = PLUGINS_REGISTRY_DIR,
                 known_versions: Sequence[str] = KUBELET_VERSIONS) -> None:
        self.root = host_root
        self.registry = host_root / registry_dir.lstrip("/")
        self.known = tuple(known_versions)
        self.plugins: dict[str, Registered] = {}

    def discover(self, timeout: float = 5.0) -> list[Path]:
        return wait_for_sockets(self.registry, "*-reg.sock", timeout)

    def register(self, timeout: float = 5.0) -> Registered:
        socket = self.discover(timeout)[0]
        with dial(socket) as channel:
            reg = reg_grpc.RegistrationStub(channel)
            info = reg.GetInfo(reg_pb.InfoRequest(), timeout=timeout)
            if info.type != "DRAPlugin":
                raise AssertionError(f"unexpected plugin type {info.type}")
            version = next((v for v in info.supported_versions if v in self.known), None)
            if version is None:
                reg.NotifyRegistrationStatus(reg_pb.RegistrationStatus(
                    plugin_registered=False, error=f"none of {list(info.supported_versions)} is supported"))
                raise AssertionError("no common version")
            reg.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True), timeout=timeout)
        endpoint = self.root / info.endpoint.lstrip("/")
        channel = dial(endpoint)
        grpc_mod, pb = (v1_grpc, v1_pb) if version == "v1.DRAPlugin" else (v1beta1_grpc, v1beta1_pb)
        plugin = Registered(info.name, info.endpoint, version, channel, grpc_mod.DRAPluginStub(channel), pb)
        self.plugins[info.name] = plugin
        return plugin

    def register_when_served(self, timeout: float) -> Registered:
        """:meth:`register`, retried while the registration socket exists but does not answer yet (a plugin
        may create the socket file before it serves on it, as NVIDIA's does): kubelet's plugin watcher
        retries such a plugin too."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.register(timeout=max(1.0, deadline - time.monotonic()))
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _claims(self, plugin: Registered, claims: Sequence[tuple[str, str, str]]) -> list[Any]:
        return [plugin.pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]

    def prepare(self, driver: str, claims: Sequence[tuple[str, str, str]], timeout: float = CALL_TIMEOUT) -> Any:
        plugin = self.plugins[driver]
        request = plugin.pb.NodePrepareResourcesRequest(claims=self._claims(plugin, claims))
        return plugin.stub.NodePrepareResources(request, timeout=timeout)

    def unprepare(self, driver: str, claims: Sequence[tuple[str, str, str]], timeout: float = CALL_TIMEOUT) -> Any:
        plugin = self.plugins[driver]
        request = plugin.pb.NodeUnprepareResourcesRequest(claims=self._claims(plugin, claims))
        return plugin.stub.NodeUnprepareResources(request, timeout=timeout)

    def close(self) -> None:
        for p in self.plugins.values():
            p.channel.close()
        self.plugins.clear()
