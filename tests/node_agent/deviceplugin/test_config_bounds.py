"""Device-plugin configs that crashed or exhausted the plugin, and values that slipped past its patterns.

Found by fuzzing: a 5,000-digit integer gave a ``ValueError`` traceback (Python's int-string limit);
``replicas: 1000000000`` was accepted and the plugin built a device object per replica (278 MiB at
100,000 on an 8-GPU node, against a 192 MiB limit); YAML aliases expanded without limit; a resource
name ending in a newline passed ``re.match(...$)``. Each is now a :class:`ConfigError` naming the path,
the value (cut) and what is allowed.
"""

from __future__ import annotations

import time

import pytest

from node_agent.deviceplugin.config import MAX_REPLICAS, ConfigError, parse_config_text


def _refused(text: str) -> list[str]:
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text)
    assert time.monotonic() - started < 1
    assert len(str(caught.value)) <= 2000
    return caught.value.problems


def _time_slicing(replicas: str, name: str = "nvidia.com/gpu") -> str:
    return f"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: {name}\n      replicas: {replicas}\n"


def test_a_5000_digit_integer_is_a_config_error() -> None:
    assert _refused(_time_slicing("1" * 5000)) == [
        "sharing.timeSlicing.resources[0].replicas (line 6, column 17): an integer of 5000 characters is out of "
        "range (at most 32 characters)"]


def test_a_billion_replicas_are_refused_with_the_allowed_range() -> None:
    assert _refused(_time_slicing("1000000000")) == [
        f"sharing.timeSlicing.resources[0].replicas: must be from 2 to {MAX_REPLICAS}: each replica is a device the "
        "plugin builds and advertises to the kubelet, and more than a node's pods could use cost memory only "
        "(got 1000000000)"]


@pytest.mark.parametrize("replicas", [2, 10, MAX_REPLICAS])
def test_replicas_within_the_range_pass(replicas: int) -> None:
    cfg = parse_config_text(_time_slicing(str(replicas)))
    assert cfg.sharing.time_slicing is not None
    assert cfg.sharing.time_slicing.resources[0].replicas == replicas


def test_one_replica_is_refused_with_the_allowed_range() -> None:
    [problem] = _refused(_time_slicing("1"))
    assert problem.startswith(f"sharing.timeSlicing.resources[0].replicas: must be from 2 to {MAX_REPLICAS}")


def test_aliases_are_refused() -> None:
    text = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - &r {name: nvidia.com/gpu, replicas: 2}\n"
            "    - *r\n")
    assert _refused(text) == [
        "sharing.timeSlicing.resources[1] (line 6, column 7): aliases (*r) are not allowed in this format: write "
        "the value out in full"]


def test_an_alias_bomb_is_refused_quickly() -> None:
    anchors = ["&a0 [x,x,x,x,x,x,x,x,x]"] + [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    [problem] = _refused("version: v1\nflags:\n  plugin:\n    cdiFeatureFlags: [" + ", ".join(anchors) + "]\n")
    assert "aliases (*a0) are not allowed in this format" in problem


def test_a_resource_name_ending_in_a_newline_is_refused() -> None:
    [problem] = _refused(_time_slicing('"gpu\\n"', name='"gpu\\n"').replace('replicas: "gpu\\n"', "replicas: 2"))
    assert problem.startswith("sharing.timeSlicing.resources[0].name: resource name 'nvidia.com/gpu\\n' must be at "
                              "most 63 characters and a DNS subdomain")


def test_a_long_value_is_quoted_cut() -> None:
    [problem] = _refused("version: " + "v" * 1_000_000 + "\n")
    assert "(1000000 characters)" in problem
    assert len(problem) < 600
