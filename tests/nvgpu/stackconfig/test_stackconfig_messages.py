"""What a user who mistypes the stack config reads (issue 34): a number YAML made of a version or a tag, a key
outside the ``nvidia-gpu:`` namespace, an image written as one reference, two groups on one NodeGroup, and a
"did you mean" for a mistyped key or model. Each message names the path, the value and what to write."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from nvgpu.stackconfig import StackConfigError, load_namespaced_config, load_stack_config, load_stack_text
from nvidia_gpu.components.program import decode_config_value

CLUSTER: dict[str, Any] = {
    "kubernetesVersion": "1.34",
    "nodeSetup": "deckhouse",
    "agentImage": {"repository": "registry.example.com/agent", "tag": "0.1.0"},
}
GROUP: dict[str, Any] = {"name": "l4", "nodeGroup": "gpu-l4", "gpu": {"sharing": "Exclusive"}}


def _values(**groups_and_cluster: Any) -> dict[str, Any]:
    cluster = {**copy.deepcopy(CLUSTER), **groups_and_cluster.pop("cluster", {})}
    return {"cluster": cluster, "nodeGroups": groups_and_cluster.pop("nodeGroups", [copy.deepcopy(GROUP)])}


def _problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(StackConfigError) as err:
        load_stack_config(values)
    return err.value.problems


@pytest.mark.parametrize(("text", "path", "value"), [
    ("driverVersion: 550", "nvidia-gpu:nodeGroups[0].gpu.driverVersion", "550"),
    ("driverVersion: 550.54", "nvidia-gpu:nodeGroups[0].gpu.driverVersion", "550.54"),
])
def test_a_version_yaml_read_as_a_number_says_to_quote_it(text: str, path: str, value: str) -> None:
    stack = f"""config:
  nvidia-gpu:cluster:
    kubernetesVersion: "1.34"
    nodeSetup: deckhouse
    agentImage: {{repository: registry.example.com/agent, tag: "0.1.0"}}
  nvidia-gpu:nodeGroups:
    - name: l4
      nodeGroup: gpu-l4
      gpu:
        sharing: Exclusive
        {text}
"""
    with pytest.raises(StackConfigError) as err:
        load_stack_text(stack)
    (line,) = err.value.problems
    assert line.startswith(f"{path}: must be text, and YAML reads an unquoted {value}") and "quote it" in line, line
    assert f'"{value}"' in line


def test_an_image_tag_read_as_a_number_says_to_quote_it() -> None:
    (line,) = _problems(_values(cluster={"agentImage": {"repository": "registry.example.com/agent", "tag": 1.0}}))
    assert line.startswith("nvidia-gpu:cluster.agentImage.tag: must be text") and '"1.0"' in line, line


@pytest.mark.parametrize(("ref", "expected"), [
    ("registry.example.com/agent:1.2.0", ("registry.example.com/agent", "1.2.0", None)),
    ("registry.example.com:5000/platform/agent:1.2.0", ("registry.example.com:5000/platform/agent", "1.2.0", None)),
    ("registry.example.com/agent@sha256:" + "a" * 64, ("registry.example.com/agent", None, "sha256:" + "a" * 64)),
    ("registry.example.com/agent:1.2.0@sha256:" + "b" * 64,
     ("registry.example.com/agent", "1.2.0", "sha256:" + "b" * 64)),
])
def test_the_agent_image_may_be_one_reference(ref: str, expected: tuple[str, str | None, str | None]) -> None:
    image = load_stack_config(_values(cluster={"agentImage": ref})).cluster.agent_image
    assert (image.repository, image.tag, image.digest) == expected
    assert image.ref == ref


@pytest.mark.parametrize(("ref", "fragment"), [
    ("registry.example.com:5000/agent", "nvidia-gpu:cluster.agentImage.tag: set tag or digest"),
    ("registry.example.com/agent:latest", "nvidia-gpu:cluster.agentImage.tag: 'latest' is not allowed"),
    ("registry.example.com/Agent:1.0", "nvidia-gpu:cluster.agentImage.repository: must be an image repository"),
])
def test_a_bad_image_reference_names_its_part(ref: str, fragment: str) -> None:
    assert any(p.startswith(fragment) for p in _problems(_values(cluster={"agentImage": ref}))), ref


def test_two_groups_on_one_deckhouse_node_group_are_a_config_error() -> None:
    second = {**copy.deepcopy(GROUP), "name": "l4-b"}
    (line,) = _problems(_values(nodeGroups=[copy.deepcopy(GROUP), second]))
    assert line.startswith("nvidia-gpu:nodeGroups[1].nodeGroup: 'gpu-l4' is the Deckhouse NodeGroup of "
                           "nodeGroups[0] ('l4') already"), line


def test_a_mistyped_key_gets_a_suggestion() -> None:
    values = _values()
    values["nodeGroups"][0]["gpu"]["sharng"] = "Exclusive"
    (line,) = _problems(values)
    assert line.startswith("nvidia-gpu:nodeGroups[0].gpu.sharng: unknown key (did you mean 'sharing'?)"), line


def test_a_wrongly_cased_key_gets_a_suggestion() -> None:
    values = _values()
    values["cluster"]["kubernetesversion"] = values["cluster"].pop("kubernetesVersion")
    assert any("kubernetesversion: unknown key (did you mean 'kubernetesVersion'?)" in p for p in _problems(values))


def test_a_key_far_from_any_gets_no_guess() -> None:
    values = _values()
    values["cluster"]["zzzz"] = 1
    (line,) = _problems(values)
    assert "did you mean" not in line and "allowed keys:" in line


@pytest.mark.parametrize(("model", "key"), [("h100-80gb", "H100-80GB"), ("H100_80GB", "H100-80GB"), ("b200", "B200")])
def test_a_catalogue_model_spelled_differently_is_refused_with_its_spelling(model: str, key: str) -> None:
    values = _values()
    values["nodeGroups"][0]["gpu"]["model"] = model
    (line,) = _problems(values)
    assert line.startswith(f"nvidia-gpu:nodeGroups[0].gpu.model: {model!r} is the catalogue model {key!r}"), line


def test_a_model_the_catalogue_lacks_is_still_accepted() -> None:
    values = _values()
    values["nodeGroups"][0]["gpu"]["model"] = "Z100-80GB"
    assert load_stack_config(values).node_groups[0].gpu.model_unlisted


@pytest.mark.parametrize("key", ["cluster", "gpu-platform:cluster"])
def test_our_key_in_another_namespace_is_named(key: str) -> None:
    """Pulumi gives an unprefixed key the project's namespace: a project named otherwise loses it."""
    config = {key: copy.deepcopy(CLUSTER), "nvidia-gpu:nodeGroups": [copy.deepcopy(GROUP)]}
    with pytest.raises(StackConfigError) as err:
        load_namespaced_config(config)
    (line,) = err.value.problems
    assert line.startswith(f"nvidia-gpu:cluster: missing, but the config has {key!r}"), line
    assert "write nvidia-gpu:cluster" in line


def test_the_engines_encoded_values_are_decoded() -> None:
    """The engine hands structured values as JSON text; ``decode`` undoes that before validation."""
    config = {"nvidia-gpu:cluster": json.dumps(CLUSTER), "nvidia-gpu:nodeGroups": json.dumps([GROUP])}
    assert load_namespaced_config(config, decode_config_value).node_groups[0].name == "l4"
