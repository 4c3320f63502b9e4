"""``gpu.driver``: who installs a group's driver, which one, how it upgrades; the combinations that cannot
work are refused with the field named (``nvgpu.driver`` holds the rules' facts)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nvgpu import driver, toolkit
from nvgpu.stackconfig import StackConfigError, load_stack_config

BASE: dict[str, Any] = {
    "cluster": {"kubernetesVersion": "1.34",
                "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.4.0"}},
    "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
                    "gpu": {"model": "H100-80GB"}}],
}
CONTAINER = {"source": "container", "version": "550.90.07", "osReleases": ["ubuntu22.04"]}
PRECOMPILED = {"source": "container", "version": "535", "precompiled": True, "osReleases": ["ubuntu22.04"],
               "kernels": ["5.15.0-105-generic"]}


def _load(gpu: dict[str, Any]) -> Any:
    values = copy.deepcopy(BASE)
    values["nodeGroups"][0]["gpu"].update(gpu)
    return load_stack_config(values)


def _problems(gpu: dict[str, Any]) -> list[str]:
    with pytest.raises(StackConfigError) as caught:
        _load(gpu)
    return caught.value.problems


def test_the_default_is_a_preinstalled_driver_the_agent_verifies() -> None:
    d = _load({}).node_groups[0].gpu.driver
    assert (d.source, d.driver_type, d.version, d.kernel_modules) == (
        driver.DriverSource.PREINSTALLED, driver.DriverType.GPU, None, driver.KernelModules.AUTO)


@pytest.mark.parametrize("spec", [CONTAINER, PRECOMPILED,
                                  {"source": "gpuOperator", "version": "550.90.07", "kernelModules": "open"},
                                  {"source": "gpuOperator", "version": "550", "precompiled": True},
                                  {"version": "550"}, {"version": "550.90.07", "kernelModules": "proprietary"},
                                  {"source": "gpuOperator", "type": "vgpu", "version": "550.90.07"}],
                         ids=["container", "precompiled", "operator-open", "operator-precompiled", "branch",
                              "release", "vgpu-guest"])
def test_combinations_that_work_are_accepted(spec: dict[str, Any]) -> None:
    assert _load({"driver": spec}).node_groups[0].gpu.driver.source.value == spec.get("source", "preinstalled")


@pytest.mark.parametrize(("spec", "gpu", "path", "says"), [
    ({**PRECOMPILED, "version": "535.161.08"}, {}, "gpu.driver.version",
     "535.161.08 is a release; precompiled drivers are chosen by branch and kernel: write the branch (535)"),
    ({**CONTAINER, "version": "550"}, {}, "gpu.driver.version", "550 is a branch; a driver compiled on the node"),
    ({"source": "container", "osReleases": ["ubuntu22.04"]}, {}, "gpu.driver.version",
     "source container deploys a driver"),
    ({"version": "550", "precompiled": True}, {}, "gpu.driver.precompiled",
     "only with source container or gpuOperator"),
    ({**PRECOMPILED, "kernels": []}, {}, "gpu.driver.kernels", "a precompiled driver image is per kernel"),
    ({**CONTAINER, "osReleases": []}, {}, "gpu.driver.osReleases", "one driver DaemonSet per OS release"),
    ({**CONTAINER, "osReleases": ["ubuntu22"]}, {}, "gpu.driver.osReleases[0]", "'ubuntu22' is not an OS release"),
    ({**CONTAINER, "kernels": ["5.15.0-105-generic"]}, {}, "gpu.driver.kernels", "only used by a precompiled driver"),
    ({"version": "550.90.07", "osReleases": ["ubuntu22.04"]}, {}, "gpu.driver.osReleases",
     "only used with source container (source is preinstalled)"),
    ({"version": "550", "image": {"name": "driver"}}, {}, "gpu.driver.image", "only used when the stack deploys"),
    ({"source": "gpuOperator", "version": "510.47.03", "kernelModules": "open"}, {"model": "A100-80GB"},
     "gpu.driver.kernelModules", "the open kernel modules exist from the 515 branch on"),
    ({"source": "gpuOperator", "version": "550", "precompiled": True, "type": "vgpu"}, {}, "gpu.driver.precompiled",
     "NVIDIA builds precompiled drivers for type gpu only, not vgpu"),
    ({"source": "gpuOperator", "version": "550.90.07", "type": "vgpu-host-manager"},
     {"sharing": "TimeSlicing"}, "gpu.sharing", "TimeSlicing is decided by the vGPU profiles"),
    ({"source": "gpuOperator", "version": "550.90.07", "type": "vgpu"}, {"sharing": "MIG"}, "gpu.sharing",
     "a vGPU guest cannot partition its GPU"),
    ({"version": "520"}, {}, "gpu.driver.version", "520 is below the H100-80GB minimum, 525.60.13"),
    ({"source": "container", "version": "525.60.13", "osReleases": ["ubuntu22.04"]},
     {"model": "H200-141GB"}, "gpu.driver.version", "525.60.13 is below the H200-141GB minimum, 550.54.14"),
    ({"version": "550"}, {"driverVersion": "550.90.07"}, "gpu.driverVersion",
     "both gpu.driverVersion and gpu.driver.version are set"),
    ({**CONTAINER, "type": "vgpu"}, {}, "gpu.driver.type", "source container runs NVIDIA's data-center driver"),
    ({**CONTAINER, "type": "vgpu-host-manager"}, {}, "gpu.driver.type", "not vgpu-host-manager"),
    ({**CONTAINER, "upgrade": {"validationTimeoutSeconds": 300}}, {}, "gpu.driver.upgrade.validationTimeoutSeconds",
     "greater than or equal to 1260"),
    ({"kernelModules": "open"}, {"model": "T4", "driverVersion": "470.82.01"}, "gpu.driver.kernelModules",
     "the open kernel modules exist from the 515 branch on (version is 470.82.01)"),
], ids=["precompiled-release", "compiled-branch", "no-version", "precompiled-preinstalled", "no-kernels",
        "no-os", "bad-os", "kernels-not-precompiled", "os-preinstalled", "image-preinstalled", "open-too-old",
        "precompiled-vgpu", "host-manager-sharing", "vgpu-guest-mig", "branch-below-model", "release-below-model",
        "both-versions", "container-vgpu", "container-host-manager", "validation-below-startup",
        "open-too-old-legacy-version"])
def test_combinations_that_cannot_work_name_the_field(spec: dict[str, Any], gpu: dict[str, Any], path: str,
                                                     says: str) -> None:
    problems = _problems({**gpu, "driver": spec})
    assert any(p.startswith(f"nvidia-gpu:nodeGroups[0].{path}: ") and says in p for p in problems), problems


def test_versions_branches_and_images() -> None:
    branch, release = driver.parse_version("550"), driver.parse_version("550.90.07")
    assert branch.is_branch and not release.is_branch
    assert branch.matches("550.90.07") and branch.matches("550.54.14") and not branch.matches("535.161.08")
    assert release.matches("550.90.07") and not release.matches("550.90.12")
    assert driver.parse_version("550.67").matches("550.67.0")
    with pytest.raises(ValueError, match="neither a driver branch"):
        driver.parse_version("550.x")
    assert driver.image_tag(release, "ubuntu22.04") == "550.90.07-ubuntu22.04"
    assert driver.image_tag(driver.parse_version("535"), "ubuntu22.04", "5.15.0-105-generic") == \
        "535-5.15.0-105-generic-ubuntu22.04"
    assert driver.os_release("ubuntu", "22.04") == "ubuntu22.04"
    assert driver.open_modules_supported((7, 5)) and not driver.open_modules_supported((7, 0))


def test_the_loaded_modules_are_read_from_the_nvrm_line() -> None:
    open_text = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build  "
                 "(dvs-builder@U16-I3-B03-4-3)  Fri May 31 09:35:42 UTC 2024\n")
    closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:42:18 UTC 2024\n"
    assert driver.loaded_modules(open_text) is driver.KernelModules.OPEN
    assert driver.loaded_modules(closed) is driver.KernelModules.PROPRIETARY


def test_each_group_reads_its_driver_where_it_is() -> None:
    """Pre-installed groups at cluster.driverRoot, groups whose driver a container installs (the stack's or
    NVIDIA's operator's) under /run/nvidia/driver: one stack may mix them."""
    values = copy.deepcopy(BASE)
    values["nodeGroups"][0]["gpu"]["driver"] = {"source": "gpuOperator", "version": "550.90.07"}
    values["nodeGroups"].append({"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"}}, "gpu": {"model": "L4"}})
    cfg = load_stack_config(values)
    assert [cfg.cluster.driver_root_for(g) for g in cfg.node_groups] == ["/run/nvidia/driver", "/"]


def test_what_node_setup_and_the_driver_pod_verify() -> None:
    """A declared type is verified (against the GPUs' virtualization mode, by the node check's plan:
    tests/nvgpu/nodescripts/test_plan_interpreters.py); the default type is not. Node
    setup verifies a pre-installed driver; a container-installed one is verified by its driver pod's check,
    whose template follows every version change (node setup's pods are OnDelete)."""
    plain = _load({}).node_groups[0].gpu
    assert plain.driver_expectation.args() == [] and plain.node_setup_expectation.empty
    guest = _load({"driver": {"type": "vgpu", "version": "550.90.07"}}).node_groups[0].gpu
    assert guest.node_setup_expectation.args() == ["--expect-driver", "550.90.07", "--expect-driver-type", "vgpu"]
    contained = _load({"driver": {**CONTAINER, "kernelModules": "open"}}).node_groups[0].gpu
    assert contained.node_setup_expectation.empty
    assert contained.driver_expectation.args() == ["--expect-driver", "550.90.07", "--expect-kernel-modules", "open"]


def test_the_toolkit_container_installs_where_it_is_told_and_only_on_the_daemonset_backend() -> None:
    g = _load({}).node_groups[0]
    assert g.toolkit.source.value == "preinstalled" and not g.toolkit.container
    values = copy.deepcopy(BASE)
    values["nodeGroups"][0]["toolkit"] = {"source": "container", "image": {"digest": "sha256:" + "a" * 64}}
    cfg = load_stack_config(values)
    t = cfg.node_groups[0].toolkit
    assert t.image.ref == f"nvcr.io/nvidia/k8s/container-toolkit:v1.20.2@sha256:{'a' * 64}"
    assert toolkit.runtime_binary(t.install_dir) == "/usr/local/nvidia/toolkit/nvidia-container-runtime"
    assert cfg.cluster.cdi_hook_for(cfg.node_groups[0]) == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    cases = [
        ({"source": "container", "installDir": "/usr"}, "nodeGroups[0].toolkit.installDir", "system directory"),
        ({"installDir": "/opt/nvidia"}, "nodeGroups[0].toolkit.installDir", "only used with source container"),
        ({"source": "shipped"}, "nodeGroups[0].toolkit.source", "preinstalled"),
    ]
    for spec, path, words in cases:
        values = copy.deepcopy(BASE)
        values["nodeGroups"][0]["toolkit"] = spec
        with pytest.raises(StackConfigError) as caught:
            load_stack_config(values)
        assert any(path in p and words in p for p in caught.value.problems), caught.value.problems
    deckhouse = copy.deepcopy(BASE)
    deckhouse["cluster"]["nodeSetup"] = "deckhouse"
    deckhouse["nodeGroups"][0] = {"name": "h100", "nodeGroup": "h100", "gpu": {"model": "H100-80GB"},
                                  "toolkit": {"source": "container"}}
    with pytest.raises(StackConfigError) as caught:
        load_stack_config(deckhouse)
    assert any("nodeGroups[0].toolkit.source" in p and "nodeSetup 'daemonset'" in p for p in caught.value.problems)


@pytest.mark.parametrize(("tag", "refused"), [("v1.19.1", True), ("v1.17.8-ubi8", True), ("1.20.0", True),
                                              ("v1.20.1", False), ("v1.20.2", False), ("v2.0.0", False),
                                              ("latest", False)])
def test_a_mig_group_refuses_a_toolkit_container_that_withholds_the_monitor_capability(tag: str,
                                                                                       refused: bool) -> None:
    """Toolkits before 1.20.1 in their default jit-cdi mode do not give the device plugin, labeller and exporter
    the MIG monitor capability (NVIDIA/nvidia-container-toolkit#1740), so on MIG GPUs NVML refuses them; a tag
    that names no release (``latest``) cannot be judged and is left to the image's pin."""
    values = copy.deepcopy(BASE)
    group = values["nodeGroups"][0]
    group["toolkit"] = {"source": "container", "image": {"tag": tag}}
    group["gpu"].update({"sharing": "MIG", "mig": {"partedConfig": "all-1g.10gb"}})
    if not refused:
        assert load_stack_config(values).node_groups[0].toolkit.image.tag == tag
        return
    with pytest.raises(StackConfigError) as caught:
        load_stack_config(values)
    [problem] = caught.value.problems
    assert "nodeGroups[0].toolkit.image.tag" in problem and repr(tag) in problem and "v1.20.1" in problem, problem
    group["gpu"] = {"model": "H100-80GB"}  # not a MIG group: the old release serves whole GPUs
    assert load_stack_config(values).node_groups[0].toolkit.image.tag == tag
