"""Property: whatever a stack file holds, reading it ends in a config or a bounded :class:`StackConfigError`.

Generated inputs (:mod:`tests.kit.nastyyaml`): valid stack files with values replaced by huge integers,
long strings, control characters, trailing newlines, deep nesting, anchors and alias bombs, and plain
nonsense. None may raise anything but :class:`StackConfigError`, whose message stays within 2,000
characters with each problem at a path; none may take more than a second or much memory.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nvgpu.stackconfig import StackConfigError, load_stack_config, load_stack_text
from tests.kit import nastyyaml

#: A stack using most of the schema, so mutations reach its field and cross-field checks.
CLUSTER: dict[str, Any] = {
    "kubernetesVersion": "1.34",
    "namespace": "nvidia-gpu",
    "allocationMode": "devicePlugin",
    "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.4.0",
                   "digest": "sha256:" + "a" * 64},
    "priorityClassName": "system-node-critical",
    "monitoring": {"scrape": "serviceMonitor", "interval": "30s", "labels": {"release": "prom"},
                   "counters": "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization\n",
                   "dashboards": {"label": "grafana_dashboard", "labelValue": "1"}},
    "dra": {"driverName": "gpu.example.com", "claimQuotas": [{"namespace": "ml", "claims": 4,
                                                              "devices": {"gpu.nvidia.com": 2}}]},
    "runtimeClass": {"name": "nvidia"},
    "driverRoot": "/run/nvidia/driver",
}
GROUPS: list[dict[str, Any]] = [
    {"name": "a100-mig", "nodeSelector": {"matchLabels": {"pool": "a100"},
                                          "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
     "gpu": {"model": "A100-80GB", "sharing": "MIG",
             "mig": {"partedConfig": "custom", "strategy": "mixed",
                     "customConfigs": [{"index": 0, "slices": [{"profile": "1g.10gb", "count": 2},
                                                               {"profile": "3g.40gb"}]}]}},
     "extraTaints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
    {"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
     "gpu": {"model": "H100-80GB", "sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4},
             "driver": {"source": "container", "version": "550.90.07", "osReleases": ["ubuntu22.04"],
                        "upgrade": {"maxUnavailable": 1}}},
     "toolkit": {"source": "container", "installDir": "/usr/local/nvidia"}},
    {"name": "vms", "nodeSelector": {"matchLabels": {"pool": "vms"}}, "allocationMode": "dra", "passthrough": True,
     "gpu": {"model": "H100-80GB", "driver": {"version": "550.90.07"}}},
]
VALUES: dict[str, Any] = {"cluster": CLUSTER, "nodeGroups": GROUPS}
STACK_FILE: dict[str, Any] = {"config": {"nvidia-gpu:cluster": CLUSTER, "nvidia-gpu:nodeGroups": GROUPS,
                                         "other:key": "kept out"}}

#: A problem starts with its path (``nvidia-gpu:cluster.namespace: ``), the count of the ones left out, or,
#: for text that is not a stack file, the source and where in it.
LOCATED = re.compile(r"(nvidia-gpu:\S.*?: |nvidia-gpu: \.\.\. and \d+ more problems$"
                     r"|stack file: (cannot read stack file: |expected a mapping))")


def _problems(e: Exception) -> list[str]:
    assert isinstance(e, StackConfigError)
    return e.problems


def test_the_bases_are_valid() -> None:
    load_stack_config(copy.deepcopy(VALUES))
    load_stack_text(nastyyaml.render(STACK_FILE))


@nastyyaml.SETTINGS
@given(text=nastyyaml.documents([STACK_FILE]))
def test_any_stack_file_text_is_read_or_refused_within_bounds(text: str) -> None:
    nastyyaml.check_bounded(lambda: load_stack_text(text), StackConfigError, LOCATED, _problems)


def _python_values(value: Any) -> Any:
    """Generated data as a program passes it (no YAML): raw integers become real ones, other YAML-only
    scalars their text."""
    if isinstance(value, nastyyaml.Raw):
        return int(value.text[:4000]) * 10**1000 if value.text.isdigit() else value.text
    if isinstance(value, dict):
        return {_python_values(k): _python_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_python_values(v) for v in value]
    if isinstance(value, nastyyaml.Aliased):
        shared = _python_values(value.value)
        return [shared] * (value.copies + 1)
    if isinstance(value, nastyyaml.Bomb | nastyyaml.Deep):
        return [[["x"]]]
    return value


@nastyyaml.SETTINGS
@given(values=nastyyaml.mutated(VALUES).map(_python_values))
def test_any_values_are_validated_or_refused_within_bounds(values: Any) -> None:
    if not isinstance(values, dict):
        values = {"cluster": values}
    nastyyaml.check_bounded(lambda: load_stack_config(values), StackConfigError, LOCATED, _problems)


@nastyyaml.SETTINGS
@given(name=st.sampled_from(["a100-mig", "h100"]), suffix=st.sampled_from(nastyyaml.SUFFIXES))
def test_a_name_with_any_trailing_whitespace_is_refused(name: str, suffix: str) -> None:
    values = copy.deepcopy(VALUES)
    values["nodeGroups"][0]["name"] = name + suffix
    try:
        load_stack_config(values)
    except StackConfigError as e:
        assert any(p.startswith("nvidia-gpu:nodeGroups[0].name: ") for p in e.problems), e.problems
    else:
        raise AssertionError(f"{name + suffix!r} was accepted")
