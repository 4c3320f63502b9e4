"""After a reconfiguration, the device plugin advertises exactly the new MIG resources, none stale.

The MIG manager reconfigures a simulated machine; then the device plugin's own enumeration (its
public ``NvmlNodeDevices`` + ``build_resources``, as a plugin pod restarted after the deploy labels
come back would run it) is compared with the layout: ``nvidia.com/mig-<profile>`` per profile in mixed
strategy, ``nvidia.com/gpu`` for MIG devices in single strategy, whole GPUs again after all-disabled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.deviceplugin import config
from node_agent.deviceplugin.nvml_devices import NvmlNodeDevices
from node_agent.deviceplugin.resources import build_resources
from node_agent.mig.nvmlbackend import NvmlMigBackend, SimulatedReset
from node_agent.nvml import NvmlBackend, NvmlSession, open_nvml
from nvgpu import labels
from tests.kit.fakehost import FakeHost
from tests.kit.migcaps import write_mig_minors
from tests.node_agent.mig.harness import Rig, mig_node

MIXED = "flags: {migStrategy: mixed}"
SINGLE = "flags: {migStrategy: single}"


@pytest.fixture
def a100(tmp_path: Path) -> Iterator[tuple[NvmlSession, Rig]]:
    state = tmp_path / "sim.json"
    with open_nvml(NvmlBackend("simulated", "dgx-a100-40gb", state)) as nvml:
        rig = mig_node(Rig(NvmlMigBackend(nvml, SimulatedReset("dgx-a100-40gb", state))), "all-1g.5gb")  # type: ignore[arg-type]
        yield nvml, rig


def advertised(nvml: NvmlSession, host: FakeHost, flags: str) -> dict[str, int]:
    node = NvmlNodeDevices(nvml)  # a fresh plugin start
    try:
        write_mig_minors(host.root, [g.minor for g in node.gpus()])
        return {r.name: len(r.devices) for r in build_resources(node.gpus(), config.load(flags), host)}
    finally:
        node.close()


def reconfigure(rig: Rig, name: str, sharing: str = "MIG") -> None:
    rig.node.labels.update({labels.MIG_CONFIG: name, labels.DEVICE_GPU_CONFIG: sharing})
    rig.converge()


def test_mixed_strategy_follows_each_layout(tmp_path: Path, a100: tuple[NvmlSession, Rig]) -> None:
    nvml, rig = a100
    host = FakeHost(tmp_path / "host")
    assert advertised(nvml, host, MIXED) == {"nvidia.com/gpu": 8}
    rig.converge()
    assert advertised(nvml, host, MIXED) == {"nvidia.com/mig-1g.5gb": 56}
    reconfigure(rig, "all-balanced")
    assert advertised(nvml, host, MIXED) == {
        "nvidia.com/mig-1g.5gb": 16, "nvidia.com/mig-2g.10gb": 8, "nvidia.com/mig-3g.20gb": 8}
    reconfigure(rig, "all-1g.5gb.me")
    assert advertised(nvml, host, MIXED) == {"nvidia.com/mig-1g.5gb.me": 8}
    reconfigure(rig, "all-disabled", sharing="Exclusive")
    assert advertised(nvml, host, MIXED) == {"nvidia.com/gpu": 8}
    assert labels.MIG_CONFIG not in rig.node.labels


def test_single_strategy_replaces_whole_gpus(tmp_path: Path, a100: tuple[NvmlSession, Rig]) -> None:
    nvml, rig = a100
    host = FakeHost(tmp_path / "host")
    reconfigure(rig, "all-3g.20gb")
    assert advertised(nvml, host, SINGLE) == {"nvidia.com/gpu": 16}
    reconfigure(rig, "all-7g.40gb")
    assert advertised(nvml, host, SINGLE) == {"nvidia.com/gpu": 8}
