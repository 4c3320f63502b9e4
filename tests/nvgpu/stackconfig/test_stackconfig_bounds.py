"""Stack configs that crashed the reader or slipped past it: huge integers, alias bombs, trailing newlines.

Each was found by fuzzing the parsers: a 5,000-digit integer gave a ``ValueError`` traceback (Python's
int-string limit) instead of a config error; a value ending in a newline passed every pattern
(``re.match`` with ``$``), so ``a100-mig`` and ``a100-mig\\n`` were two groups and the API server refused
the second one's objects halfway through ``up``. Each is now a :class:`StackConfigError` naming the
path, the value (cut) and what is allowed.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvgpu.stackconfig import StackConfigError, load_stack_config, load_stack_file

BIG = "1" * 5000
BASE: dict[str, Any] = {
    "cluster": {"kubernetesVersion": "1.34",
                "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.4.0"}},
    "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
                    "gpu": {"model": "H100-80GB"}}],
}


def _stack_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": {f"nvidia-gpu:{k}": v for k, v in values.items()}}))
    return path


def _problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(StackConfigError) as caught:
        load_stack_config(values)
    assert len(str(caught.value)) <= 2000
    return caught.value.problems


def _at(path: str, values: dict[str, Any]) -> str:
    """The one problem at ``path`` (``nvidia-gpu:<path>``)."""
    found = [p for p in _problems(values) if p.startswith(f"nvidia-gpu:{path}: ")]
    assert len(found) == 1, _problems(values)
    return found[0]


# --- huge integers ---------------------------------------------------------------------------------------


def test_a_5000_digit_integer_in_a_stack_file_is_a_config_error(tmp_path: Path) -> None:
    values = copy.deepcopy(BASE)
    values["nodeGroups"][0]["gpu"] = {"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": "BIG"}}
    path = _stack_file(tmp_path, values)
    path.write_text(path.read_text().replace("BIG", BIG))
    with pytest.raises(StackConfigError) as caught:
        load_stack_file(path)
    [problem] = caught.value.problems
    assert "config.nvidia-gpu:nodeGroups[0].gpu.timeSlicing.partitionCount (line" in problem
    assert "an integer of 5000 characters is out of range (at most 32 characters)" in problem
    assert len(str(caught.value)) <= 2000


def test_a_5000_digit_integer_given_as_data_is_shown_by_size() -> None:
    values = copy.deepcopy(BASE)
    values["nodeGroups"][0]["gpu"] = {"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 10**4999}}
    assert _at("nodeGroups[0].gpu.timeSlicing.partitionCount", values) == (
        "nvidia-gpu:nodeGroups[0].gpu.timeSlicing.partitionCount: Input should be less than or equal to 100 "
        "(got an integer of about 5000 digits)")


def test_a_5000_digit_kubernetes_version_number_is_a_config_error() -> None:
    values = copy.deepcopy(BASE)
    values["cluster"]["kubernetesVersion"] = 10**4999
    assert _at("cluster.kubernetesVersion", values).startswith(
        'nvidia-gpu:cluster.kubernetesVersion: must be a quoted string like "1.34", not a number')


def test_a_huge_integer_as_a_key_is_shown_by_size() -> None:
    values = copy.deepcopy(BASE)
    values["cluster"]["dra"] = {"claimQuotas": [{"namespace": "ml", "devices": {10**4999: 1}}]}
    problems = _problems(values)
    assert any("an integer of about 5000 digits" in p for p in problems), problems


# --- aliases ---------------------------------------------------------------------------------------------


def _bomb_stack(depth: int = 9) -> str:
    """A stack file whose ``nvidia-gpu:nodeGroups`` expands to 9**depth strings through nested aliases."""
    lines = ["config:", '  x0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, depth):
        lines.append(f"  x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"  nvidia-gpu:nodeGroups: *a{depth - 1}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_a_stack_file_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(_bomb_stack())
    started = time.monotonic()
    with pytest.raises(StackConfigError) as caught:
        load_stack_file(path)
    assert time.monotonic() - started < 1
    [problem] = caught.value.problems
    assert "expands to more than 200000 values through its aliases" in problem
    assert len(str(caught.value)) <= 2000


def test_aliases_that_share_a_block_in_a_stack_file_still_work(tmp_path: Path) -> None:
    """Pulumi reads anchors in a stack file: one shared between node groups stays allowed."""
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(
        "config:\n"
        "  nvidia-gpu:cluster:\n"
        "    kubernetesVersion: '1.34'\n"
        "    agentImage: {repository: registry.example.com/nvidia-gpu-agent, tag: 0.4.0}\n"
        "  nvidia-gpu:nodeGroups:\n"
        "  - name: a\n    nodeSelector: {matchLabels: {pool: a}}\n    gpu: &gpu {model: H100-80GB}\n"
        "  - name: b\n    nodeSelector: {matchLabels: {pool: b}}\n    gpu: *gpu\n")
    config = load_stack_file(path)
    assert [g.gpu.model for g in config.node_groups] == ["H100-80GB", "H100-80GB"]


# --- trailing newlines -------------------------------------------------------------------------------------


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    values = copy.deepcopy(BASE)
    node: Any = values
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[path[-1]] = value
    return values


TRAILING_NEWLINE = [
    (("nodeGroups", 0, "name"), "h100\n"),
    (("cluster", "namespace"), "nvidia-gpu\n"),
    (("cluster", "agentImage", "repository"), "registry.example.com/nvidia-gpu-agent\n"),
    (("cluster", "agentImage", "tag"), "0.4.0\n"),
    (("cluster", "agentImage", "digest"), "sha256:" + "a" * 64 + "\n"),
    (("cluster", "kubernetesVersion"), "1.34\n"),
    (("cluster", "priorityClassName"), "system-node-critical\n"),
    (("cluster", "monitoring", "interval"), "30s\n"),
    (("cluster", "dra", "driverName"), "gpu.example.com\n"),
    (("cluster", "runtimeClass", "name"), "nvidia\n"),
    (("nodeGroups", 0, "gpu", "driverVersion"), "550.90.07\n"),
]


@pytest.mark.parametrize(("path", "value"), TRAILING_NEWLINE, ids=lambda x: ".".join(map(str, x))
                         if isinstance(x, tuple) else None)
def test_a_value_ending_in_a_newline_is_refused(path: tuple[Any, ...], value: str) -> None:
    where = ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")
    problem = _at(where, _with(path, value))
    assert repr(value)[1:-1] in problem, problem  # the value is quoted with its newline written \n


def test_label_keys_values_and_taint_keys_ending_in_a_newline_are_refused() -> None:
    group = BASE["nodeGroups"][0]
    cases = [
        ({**group, "nodeSelector": {"matchLabels": {"pool\n": "h100"}}}, "nodeSelector.matchLabels"),
        ({**group, "nodeSelector": {"matchLabels": {"pool": "h100\n"}}}, "nodeSelector.matchLabels.pool"),
        ({**group, "extraTaints": [{"key": "dedicated\n", "effect": "NoSchedule"}]}, "extraTaints[0].key"),
        ({**group, "extraTaints": [{"key": "dedicated", "value": "ml\n", "effect": "NoSchedule"}]},
         "extraTaints[0].value"),
        ({**group, "gpu": {"model": "H100-80GB", "sharing": "MIG", "mig": {"partedConfig": "all-1g.10gb\n"}}},
         "gpu.mig.partedConfig"),
        ({**group, "gpu": {"driver": {"source": "container", "version": "550.90.07\n",
                                      "osReleases": ["ubuntu22.04"]}}}, "gpu.driver.version"),
        ({**group, "gpu": {"driver": {"source": "container", "version": "550.90.07",
                                      "osReleases": ["ubuntu22.04\n"]}}}, "gpu.driver.osReleases[0]"),
    ]
    for changed, where in cases:
        values = {**BASE, "nodeGroups": [changed]}
        problems = [p for p in _problems(values) if p.startswith(f"nvidia-gpu:nodeGroups[0].{where}")]
        assert problems and "\\n" in problems[0], (where, _problems(values))


def test_a_group_and_its_name_with_a_newline_are_not_two_groups() -> None:
    values = copy.deepcopy(BASE)
    second = copy.deepcopy(values["nodeGroups"][0])
    values["nodeGroups"][0]["name"] = "a100-mig"
    second["name"] = "a100-mig\n"
    second["nodeSelector"] = {"matchLabels": {"pool": "other"}}
    values["nodeGroups"].append(second)
    assert _at("nodeGroups[1].name", values).startswith(
        "nvidia-gpu:nodeGroups[1].name: 'a100-mig\\n' is not a lowercase DNS label")


# --- bounded messages -----------------------------------------------------------------------------------


def test_a_long_value_is_quoted_cut() -> None:
    problem = _at("cluster.namespace", _with(("cluster", "namespace"), "X" * 1_000_000))
    assert len(problem) < 600
    assert "(1000000 characters)" in problem


def test_many_problems_make_a_bounded_message_and_say_how_many_more() -> None:
    values = copy.deepcopy(BASE)
    values["nodeGroups"] = [{**copy.deepcopy(BASE["nodeGroups"][0]), "name": f"BAD_{i}"} for i in range(200)]
    with pytest.raises(StackConfigError) as caught:
        load_stack_config(values)
    assert len(str(caught.value)) <= 2000
    assert "more" in str(caught.value).splitlines()[-1]
    assert caught.value.problems[-1].startswith("nvidia-gpu: ... and ")


def test_a_key_with_a_newline_is_quoted_in_the_path() -> None:
    problems = _problems(_with(("cluster", "bad\nkey"), 1))
    assert any(p.startswith("nvidia-gpu:cluster.'bad\\nkey': unknown key") for p in problems), problems
