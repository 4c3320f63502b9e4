"""Host files the plugin may not or cannot read are never taken for absent ones.

The plugin is handed the agent's ``HostRoot`` itself. A missing file stays "absent" (NVML's NUMA answer,
an optional device node left out); one the host layer refuses (``..`` in the path) or cannot read (a
directory, bytes that are not text, a permission error) is either an init error naming the path and the
reason, or logged once as ``event=host-read-refused path=... reason=...`` and left out. Tests run as root,
so permission errors come from :class:`RefusingHost`; the other refusals are real ones of ``HostRoot``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from node_agent.deviceplugin import cdi, config, devices
from node_agent.deviceplugin.allocate import Allocator
from node_agent.deviceplugin.devices import DeviceError, numa_node, sysfs_bus_id
from node_agent.deviceplugin.resources import ImexChannelError, build_resources, select_imex_channels
from node_agent.host import HostError
from node_agent.host.proc import MIG_MINORS_PATH
from nvgpu import catalogue
from tests.kit.fakehost import FakeHost
from tests.node_agent.deviceplugin.builders import full_gpu, machine, mig_gpu

CHANNEL0 = "/dev/nvidia-caps-imex-channels/channel0"


@pytest.fixture(autouse=True)
def refusals(monkeypatch: pytest.MonkeyPatch) -> devices.RefusalLog:
    """A fresh once-only log per test: the process-wide one remembers what earlier tests were refused."""
    fresh = devices.RefusalLog()
    monkeypatch.setattr(devices, "REFUSALS", fresh)
    return fresh


@dataclass
class RefusingHost:
    """``host``, except that ``refused`` paths fail as a permission error does in ``HostRoot``."""

    host: FakeHost
    refused: set[str] = field(default_factory=set)

    def _check(self, host_path: str) -> None:
        if host_path in self.refused:
            try:
                raise PermissionError(13, "Permission denied", host_path)
            except PermissionError as e:
                raise HostError(f"cannot read {host_path}: Permission denied", host_path) from e

    def read_text_or_none(self, host_path: str) -> str | None:
        self._check(host_path)
        return self.host.read_text_or_none(host_path)

    def exists(self, host_path: str) -> bool:
        self._check(host_path)
        return self.host.exists(host_path)

    def write_atomic(self, host_path: str, data: str) -> bool:
        return self.host.write_atomic(host_path, data)

    def remove(self, host_path: str) -> bool:
        return self.host.remove(host_path)


def _refused(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "event=host-read-refused" in r.getMessage()]


def test_missing_numa_file_uses_nvml_and_logs_nothing(host: FakeHost, caplog: pytest.LogCaptureFixture) -> None:
    gpu = full_gpu(0, catalogue.H100_80GB)
    gpu = type(gpu)(**{**gpu.__dict__, "numa_node": 1})
    with caplog.at_level(logging.WARNING):
        assert numa_node(host, gpu) == 1
    assert _refused(caplog) == []


def test_unreadable_numa_file_means_no_topology_and_is_logged_once(host: FakeHost,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    gpu = full_gpu(0, catalogue.H100_80GB)
    gpu = type(gpu)(**{**gpu.__dict__, "numa_node": 1})
    path = f"/sys/bus/pci/devices/{sysfs_bus_id(gpu.pci_bus_id)}/numa_node"
    host.put(path, "")
    host.path(path).write_bytes(b"\xff\xfe\n")  # not text: HostRoot refuses to decode it
    with caplog.at_level(logging.WARNING):
        assert numa_node(host, gpu) is None  # not NVML's 1, as if the file were absent
        assert numa_node(host, gpu) is None  # the plugin rebuilds on every reload: still one line
    assert _refused(caplog) == [f"event=host-read-refused path={path} reason='{path} is not UTF-8 text'"]


def test_permission_denied_numa_file_names_the_os_reason(host: FakeHost, caplog: pytest.LogCaptureFixture) -> None:
    gpu = full_gpu(0, catalogue.H100_80GB)
    path = f"/sys/bus/pci/devices/{sysfs_bus_id(gpu.pci_bus_id)}/numa_node"
    host.put(path, "0\n")
    with caplog.at_level(logging.WARNING):
        assert numa_node(RefusingHost(host, {path}), gpu) is None
    assert _refused(caplog) == [f"event=host-read-refused path={path} reason='Permission denied'"]


def test_unreadable_mig_minors_is_an_init_error_naming_path_and_reason(host: FakeHost) -> None:
    gpus = [mig_gpu(0, catalogue.A100_40GB, ["1g.5gb"])]
    settings = config.load("flags: {migStrategy: mixed}")
    with pytest.raises(DeviceError, match=r"capability 'gpu0/gi1/access' is missing from "):
        build_resources(gpus, settings, host)  # absent table: the capability is missing, as before
    host.path(MIG_MINORS_PATH).mkdir(parents=True)  # there, but not a readable file
    with pytest.raises(DeviceError, match=f"^cannot read {MIG_MINORS_PATH}: Is a directory$"):
        build_resources(gpus, settings, host)
    host.path(MIG_MINORS_PATH).rmdir()
    host.put(MIG_MINORS_PATH, "gpu0/gi1/access 21\ngpu0/gi1/ci0/access 22\n")
    with pytest.raises(DeviceError, match=f"^cannot read {MIG_MINORS_PATH}: Permission denied$"):
        build_resources(gpus, settings, RefusingHost(host, {MIG_MINORS_PATH}))
    [resource] = build_resources(gpus, settings, host)
    assert resource.devices[0].paths == ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21",
                                         "/dev/nvidia-caps/nvidia-cap22")


def test_refused_required_imex_channel_is_a_start_up_error_with_the_reason(host: FakeHost) -> None:
    host.put(CHANNEL0, "")
    settings = config.load("imex: {channelIDs: [0], required: true}")
    with pytest.raises(ImexChannelError, match=f"IMEX channel 0's device node {CHANNEL0} cannot be checked: "
                                               "Permission denied"):
        select_imex_channels(settings, RefusingHost(host, {CHANNEL0}))
    assert select_imex_channels(settings, host).imex_channel_ids == (0,)


def test_refused_optional_imex_channel_is_not_offered_and_is_logged(host: FakeHost,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    host.put(CHANNEL0, "")
    with caplog.at_level(logging.WARNING):
        chosen = select_imex_channels(config.load("imex: {channelIDs: [0]}"), RefusingHost(host, {CHANNEL0}))
    assert chosen.imex_channel_ids == ()
    assert _refused(caplog) == [f"event=host-read-refused path={CHANNEL0} reason='Permission denied'"]
    assert any("event=imex-channel-ignored channel=0" in r.getMessage() and "reason=device-node-refused"
               in r.getMessage() for r in caplog.records)


def test_control_node_under_an_escaping_dev_root_is_left_out_and_logged_once(
        host: FakeHost, caplog: pytest.LogCaptureFixture) -> None:
    node = machine("l4x2", host)
    settings = config.load("flags: {nvidiaDevRoot: /run/nvidia/../../etc, "
                           "plugin: {deviceListStrategy: [envvar, cdi-cri], passDeviceSpecs: true}}")
    with caplog.at_level(logging.WARNING):
        [resource] = build_resources(node.gpus(), settings, host)
        allocator = Allocator(resource, settings, host)
        spec = cdi.build_spec([resource], settings, host)
    refused = _refused(caplog)
    uvm = "/run/nvidia/../../etc/dev/nvidia-uvm"
    # Each optional node once, although both the allocator and the CDI spec looked for it.
    assert refused.count(f"event=host-read-refused path={uvm} reason=\"host path '{uvm}' may not contain '..'\"") == 1
    assert len(refused) == len(set(refused)) == 3
    alloc = allocator.allocate([resource.devices[0].id])
    assert [d.container_path for d in alloc.devices if "uvm" in d.container_path] == []
    assert "/dev/nvidia-uvm" not in str(spec)
