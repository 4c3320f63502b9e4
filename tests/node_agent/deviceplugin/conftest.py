"""Fixtures: a fake host, and a running plugin supervisor wired to the kubelet stand-in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from node_agent.deviceplugin import config
from node_agent.deviceplugin.health import HealthBoard, HealthPolicy
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.plugin import NodePlugins
from node_agent.kubelet.deviceplugin.lifecycle import Supervisor
from tests.kit.fakehost import FakeHost
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet
from tests.node_agent.deviceplugin.builders import FakeNode


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host")


@pytest.fixture
def sock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Unix socket paths are limited to 107 bytes: keep the directory short.
    return tmp_path_factory.mktemp("k")


@dataclass
class Running:
    kubelet: DevicePluginKubelet
    supervisor: Supervisor
    thread: threading.Thread
    metrics: PluginMetrics
    result: list[int]

    def stop(self) -> int:
        self.supervisor.request_stop()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.result[0]


@pytest.fixture
def run_plugin(sock_dir: Path, host: FakeHost) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(node: FakeNode, text: str = "", env: dict[str, str] | None = None, *,
              policy: HealthPolicy | None = None, kubelet: bool = True,
              build: Callable[[], NodePlugins] | None = None, use_inotify: bool = True,
              init_retry_s: float = 30.0) -> Running:
        metrics = PluginMetrics()
        board = HealthBoard()  # like the command: one board for the process
        holder: dict[str, config.Settings] = {}

        def default_build() -> NodePlugins:
            settings = config.load(text, env or {})
            holder["settings"] = settings
            return NodePlugins(node, settings, host, metrics=metrics, board=board,
                               policy=policy or HealthPolicy(recovery_quiet_s=3600, recheck_interval_s=3600))

        k = DevicePluginKubelet(sock_dir)
        if kubelet:
            k.start()
        sup = Supervisor(sock_dir, build or default_build, metrics,
                         fail_on_init_error=lambda: config.load(text, env or {}).fail_on_init_error,
                         use_inotify=use_inotify, init_retry_s=init_retry_s)
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(sup.run()), daemon=True)
        t.start()
        r = Running(k, sup, t, metrics, result)
        started.append(r)
        return r

    yield start
    for r in started:
        if r.thread.is_alive():
            r.stop()
        r.kubelet.stop()
