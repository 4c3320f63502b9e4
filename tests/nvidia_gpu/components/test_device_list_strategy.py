"""``gpu.deviceListStrategy`` from the stack config to the node: the device plugin's config, the toolkit config node
setup writes (both backends) and the labeller's own request for GPUs, which must work under that toolkit config."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from nvgpu import devicelist
from nvgpu.nodescripts import facts
from nvgpu.stackconfig import StackConfigError
from nvidia_gpu.components.program import build_stack
from tests.nvidia_gpu.components.component_helpers import Engine, engine, group, of_kind, stack_config  # noqa: F401

SAFE_LINE = f"{facts.TOOLKIT_ENVVAR_KEY} = false"
OPEN_LINE = f"{facts.TOOLKIT_ENVVAR_KEY} = true"


def _component(resources: Any, kind: str, component: str) -> list[dict[str, Any]]:
    return [r.inputs for r in of_kind(resources, kind)
            if r.inputs["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]


def _plugin_strategies(resources: Any) -> set[tuple[str, ...]]:
    out = set()
    for cm in of_kind(resources, "ConfigMap"):
        if not cm.inputs["metadata"]["name"].startswith("device-plugin-config"):
            continue
        for text in (cm.inputs.get("data") or {}).values():  # the content is on the ConfigMap's data patch
            out.add(tuple(yaml.safe_load(text)["flags"]["plugin"]["deviceListStrategy"]))
    return out


def _setup_args(resources: Any) -> list[str]:
    """Every group's setup container's arguments, one after another."""
    return [a for ds in _component(resources, "DaemonSet", "gpu-setup")
            for init in ds["spec"]["template"]["spec"]["initContainers"] for a in init["args"]]


def _runtime_script(resources: Any) -> str:
    """Every group's gpu-runtime.sh, one after another."""
    scripts = [str(r.inputs["spec"]["content"]) for r in of_kind(resources, "NodeGroupConfiguration")
               if r.inputs["metadata"]["name"].endswith("gpu-runtime.sh")]
    assert scripts
    return "\n".join(scripts)


@pytest.mark.parametrize("node_setup", ["daemonset", "deckhouse"])
def test_default_is_volume_mounts_and_the_toolkit_refuses_the_envvar(engine: Engine, node_setup: str) -> None:  # noqa: F811
    resources = engine.run(lambda: build_stack(stack_config([group("a"), group("t", "TimeSlicing")],
                                                            node_setup=node_setup)))
    assert _plugin_strategies(resources) == {("volume-mounts",)}
    if node_setup == "daemonset":
        assert "--accept-envvar-when-unprivileged" not in _setup_args(resources)
    else:
        assert SAFE_LINE in _runtime_script(resources) and OPEN_LINE not in _runtime_script(resources)


@pytest.mark.parametrize("node_setup", ["daemonset", "deckhouse"])
def test_an_explicit_envvar_group_gets_a_toolkit_that_honours_it(engine: Engine, node_setup: str) -> None:  # noqa: F811
    cfg = stack_config([group("e", deviceListStrategy="envvar")], node_setup=node_setup)
    resources = engine.run(lambda: build_stack(cfg))
    assert _plugin_strategies(resources) == {("envvar",)}
    if node_setup == "daemonset":
        assert "--accept-envvar-when-unprivileged" in _setup_args(resources)
    else:
        assert OPEN_LINE in _runtime_script(resources)


def test_cdi_strategies_pass_through(engine: Engine) -> None:  # noqa: F811
    cfg = stack_config([group("c", deviceListStrategy="cdi-cri, volume-mounts")], node_setup="daemonset")
    resources = engine.run(lambda: build_stack(cfg))
    assert _plugin_strategies(resources) == {("cdi-cri", "volume-mounts")}
    assert "--accept-envvar-when-unprivileged" not in _setup_args(resources)


def test_the_labeller_asks_for_its_gpus_as_a_volume_mount_list(engine: Engine) -> None:  # noqa: F811
    resources = engine.run(lambda: build_stack(stack_config([group("a")])))
    (ds,) = _component(resources, "DaemonSet", "gpu-labeller")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == devicelist.VOLUME_MOUNT_ROOT  # not "all": the toolkit ignores that
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"].startswith(devicelist.VOLUME_MOUNT_ROOT)]
    assert (mount["mountPath"], mount.get("readOnly")) == (f"{devicelist.VOLUME_MOUNT_ROOT}/all", True)
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
    assert c["securityContext"]["privileged"] is False


@pytest.mark.parametrize(("value", "says"), [
    (["volume-mounts", "nvlink"], "nodeGroups[0].gpu.deviceListStrategy[1]"),
    ("volume-mounts,volume-mounts", "names volume-mounts twice"),
    ([], "must name at least one of envvar, volume-mounts, cdi-annotations, cdi-cri"),
])
def test_bad_strategies_are_refused_with_the_field(value: object, says: str) -> None:
    with pytest.raises(StackConfigError) as caught:
        stack_config([group("a", deviceListStrategy=value)])
    assert any(says in p and "deviceListStrategy" in p for p in caught.value.problems), caught.value.problems


def test_a_dra_group_cannot_set_a_device_list_strategy() -> None:
    with pytest.raises(StackConfigError) as caught:
        stack_config([{"name": "d", "nodeGroup": "ng-d", "allocationMode": "dra",
                       "gpu": {"deviceListStrategy": ["cdi-cri"]}}])
    assert caught.value.problems == [
        "nvidia-gpu:nodeGroups[0].gpu.deviceListStrategy: only for allocationMode 'devicePlugin': under DRA the "
        "kubelet plugin hands out GPUs as CDI devices; remove it"]
