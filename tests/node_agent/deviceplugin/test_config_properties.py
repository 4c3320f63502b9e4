"""Property: whatever a device-plugin config holds, parsing it ends in a config or a bounded :class:`ConfigError`.

Generated inputs (:mod:`tests.kit.nastyyaml`): NVIDIA's example configs and a config using every section,
with values replaced by huge integers, long strings, control characters, trailing newlines, deep
nesting, anchors and alias bombs, and plain nonsense. None may raise anything but :class:`ConfigError`
(the plugin's and the labeller's one failure mode for a bad ConfigMap), whose message stays within
2,000 characters with each problem at a path; none may take more than a second or much memory.
Resolving the parsed config (:func:`config.resolve`, where replicas become devices' settings) is
bounded the same way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given

from node_agent.deviceplugin import config
from tests.kit import nastyyaml

DATA = Path(__file__).with_name("data")
EVERYTHING: dict[str, Any] = {
    "version": "v1",
    "flags": {"migStrategy": "mixed", "failOnInitError": True, "nvidiaDriverRoot": "/run/nvidia/driver",
              "plugin": {"passDeviceSpecs": True, "deviceListStrategy": ["volume-mounts", "cdi-annotations"],
                         "deviceIDStrategy": "uuid", "cdiAnnotationPrefix": "cdi.k8s.io/",
                         "sharedDevicesAllocationPolicy": "packed"},
              "gfd": {"oneshot": False, "sleepInterval": "60s"}},
    "resources": {"gpus": [{"pattern": "*", "name": "gpu"}]},
    "sharing": {"timeSlicing": {"renameByDefault": True, "failRequestsGreaterThanOne": True,
                                "resources": [{"name": "nvidia.com/gpu", "replicas": 4},
                                              {"name": "mig-1g.10gb", "replicas": 2, "devices": "all"}]}},
    "imex": {"channelIDs": [0], "required": False},
}
BASES = [yaml.safe_load(p.read_text()) for p in sorted(DATA.glob("nvidia-device-plugin-config-*.yaml"))]
BASES.append(EVERYTHING)

#: ``path: why``, the path ``<root>``, dotted keys (quoted when odd), ``[i]``, or a line and column.
LOCATED = re.compile(r"(<root>|line \d+, column \d+|character \d+|\S.*?(\(line \d+, column \d+\))?): \S")


def _problems(e: Exception) -> list[str]:
    assert isinstance(e, config.ConfigError)
    return e.problems


def test_the_bases_are_valid() -> None:
    for base in BASES:
        config.resolve(config.parse_config_text(nastyyaml.render(base)))


def _parse_and_resolve(text: str) -> None:
    config.resolve(config.parse_config_text(text))


@nastyyaml.SETTINGS
@given(text=nastyyaml.documents(BASES))
def test_any_config_text_is_parsed_or_refused_within_bounds(text: str) -> None:
    nastyyaml.check_bounded(lambda: _parse_and_resolve(text), config.ConfigError, LOCATED, _problems)
