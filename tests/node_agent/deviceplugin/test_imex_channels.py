"""IMEX channels: ``imex.required`` is honoured and only channels with a device node are offered (NVIDIA's
``internal/imex.GetChannels``), each carrying its device node in Allocate and in the CDI spec."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import yaml

from node_agent.deviceplugin import cdi, config
from node_agent.deviceplugin.allocate import ContainerAllocation
from node_agent.deviceplugin.health import HealthPolicy
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.plugin import NodePlugins
from node_agent.deviceplugin.resources import ImexChannelError, select_imex_channels
from tests.kit.fakehost import FakeHost
from tests.node_agent.deviceplugin.builders import FakeNode, machine
from tests.node_agent.deviceplugin.conftest import Running

CHANNEL0 = "/dev/nvidia-caps-imex-channels/channel0"


def _plugins(node: FakeNode, host: FakeHost, text: str) -> NodePlugins:
    return NodePlugins(node, config.load(text), host, metrics=PluginMetrics(), policy=HealthPolicy())


def _allocate(plugins: NodePlugins) -> ContainerAllocation:
    [plugin] = plugins.plugins
    [alloc] = plugin.allocate([[plugin.resource.devices[0].id]])
    return alloc


def test_required_channel_without_device_node_is_a_start_up_error(host: FakeHost) -> None:
    settings = config.load("imex: {channelIDs: [0], required: true}")
    with pytest.raises(ImexChannelError, match=f"imex.required is true but IMEX channel 0 has no device node: "
                                               f"{CHANNEL0} does not exist on the host"):
        select_imex_channels(settings, host)
    under_dev_root = config.load("flags: {nvidiaDevRoot: /run/nvidia/driver}\nimex: {channelIDs: [0], required: true}")
    with pytest.raises(ImexChannelError, match=f"/run/nvidia/driver{CHANNEL0} does not exist"):
        select_imex_channels(under_dev_root, host)
    host.put(f"/run/nvidia/driver{CHANNEL0}", "")
    assert select_imex_channels(under_dev_root, host).imex_channel_ids == (0,)


def test_plugin_with_required_channel_missing_does_not_start(run_plugin: Callable[..., Running],
                                                             host: FakeHost) -> None:
    node = machine("l4x2", host)
    r = run_plugin(node, "imex: {channelIDs: [0], required: true}\n")
    r.thread.join(10)
    assert r.result == [1]  # failOnInitError (default true): the process exits with the error
    assert "IMEX channel 0 has no device node" in r.supervisor.state.build_error
    assert not list(r.kubelet.dir.glob("nvidia-*.sock"))


def test_optional_channel_without_device_node_is_not_advertised(host: FakeHost, caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    node = machine("l4x2", host)
    host.put(cdi.IMEX_SPEC_FILE, "stale: spec naming channel 0\n")
    with caplog.at_level(logging.WARNING):
        plugins = _plugins(node, host, "flags: {plugin: {deviceListStrategy: [envvar, cdi-cri], passDeviceSpecs: true}}"
                                       "\nimex: {channelIDs: [0]}\n")
    assert plugins.settings.imex_channel_ids == ()
    assert any("event=imex-channel-ignored channel=0" in r.getMessage() and CHANNEL0 in r.getMessage()
               for r in caplog.records)
    alloc = _allocate(plugins)
    assert "NVIDIA_IMEX_CHANNELS" not in alloc.envs
    assert not any("imex" in d for d in alloc.cdi_devices)
    assert CHANNEL0 not in [d.container_path for d in alloc.devices]
    assert not host.exists(cdi.IMEX_SPEC_FILE) and cdi.IMEX_SPEC_FILE in plugins.cdi_changed


@pytest.mark.parametrize("required", [False, True])
def test_present_channel_carries_its_device_node(host: FakeHost, required: bool) -> None:
    node = machine("l4x2", host)
    host.put(CHANNEL0, "")
    text = ("flags: {plugin: {deviceListStrategy: [envvar, cdi-cri], passDeviceSpecs: true}}\n"
            f"imex: {{channelIDs: [0], required: {str(required).lower()}}}\n")
    plugins = _plugins(node, host, text)
    assert plugins.settings.imex_channel_ids == (0,)
    alloc = _allocate(plugins)
    assert alloc.envs["NVIDIA_IMEX_CHANNELS"] == "0"
    assert "k8s.device-plugin.nvidia.com/imex-channel=0" in alloc.cdi_devices
    specs = {d.container_path: d.host_path for d in alloc.devices}
    assert specs[CHANNEL0] == CHANNEL0
    spec = yaml.safe_load(host.read_text_or_none(cdi.IMEX_SPEC_FILE) or "")
    assert spec["devices"] == [{"name": "0", "containerEdits": {"deviceNodes": [
        {"path": CHANNEL0, "hostPath": CHANNEL0, "permissions": "rw"}]}}]
