"""Property: whatever a mig-parted config holds, parsing it ends in a config or a bounded :class:`MigPartedError`.

Generated inputs (:mod:`tests.kit.nastyyaml`): NVIDIA's shipped ``config-default.yaml`` and a small
config with a custom layout, with values replaced by huge integers, long strings, control characters,
trailing newlines, deep nesting, anchors and alias bombs (the format refuses aliases), and plain
nonsense. None may raise anything but :class:`MigPartedError`, whose message stays within 2,000
characters with each problem at a path; none may take more than a second or much memory. A config
that parses is also checked against every catalogue model (:func:`fit_problems`), as the stack config
and the policies do, with the same bounds.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given

from nvgpu import catalogue
from nvgpu.migparted import MigPartedError, fit_problems, load_config_text
from tests.kit import nastyyaml

NVIDIA_FILE = Path(__file__).with_name("nvidia-mig-parted-config-default.yaml")
SMALL: dict[str, Any] = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "custom": [{"device-filter": ["0x233010DE", "0x20B510DE:0x153310DE"], "devices": [0, 1],
                    "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "3g.40gb": 1, "1g.10gb+me": 1}},
                   {"devices": [2], "mig-enabled": True, "mig-devices": {}}],
    },
}
BASES = [SMALL, yaml.safe_load(NVIDIA_FILE.read_text())]
#: ``<source>: <path>: why``, the path being keys and indices, ``<root>``, or a line and column.
LOCATED = re.compile(r"mig\.yaml: (<root>|line \d+, column \d+|character \d+|\S.*?): \S")


def _problems(e: Exception) -> list[str]:
    assert isinstance(e, MigPartedError)
    return e.problems


def _parse_and_fit(text: str) -> None:
    cfg = load_config_text(text, "mig.yaml")
    for name in list(cfg.mig_configs)[:3]:
        for model in (None, catalogue.H100_80GB, catalogue.A100_40GB):
            for problem in fit_problems(cfg, name, model):
                assert len(problem) <= nastyyaml.MAX_MESSAGE, problem[:300]


def test_the_bases_are_valid() -> None:
    for base in BASES:
        load_config_text(nastyyaml.render(base), "mig.yaml")


@nastyyaml.SETTINGS
@given(text=nastyyaml.documents(BASES))
def test_any_config_text_is_parsed_or_refused_within_bounds(text: str) -> None:
    nastyyaml.check_bounded(lambda: _parse_and_fit(text), MigPartedError, LOCATED, _problems)
