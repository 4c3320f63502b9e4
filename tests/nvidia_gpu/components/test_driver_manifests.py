"""``gpu.driver.source: gpuOperator``: one NVIDIADriver per group, valid against NVIDIA's CRD (vendored for the
offline preview), carrying the group's driver, nodes, tolerations and upgrade policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvgpu import labels
from nvgpu.driver import DRIVER_SPEC_ANNOTATION, UPGRADE_POLICY_ANNOTATION, UPGRADE_TAINT_KEY, UpgradePolicy
from nvgpu.stackconfig import load_stack_config
from nvidia_gpu.components.manifests import driver
from nvidia_gpu.preview import crds
from tests.nvidia_gpu.policies.policy_fixtures import DS_TYPE, check

CLUSTER = {"kubernetesVersion": "1.34", "driverRoot": "/run/nvidia/driver",
           "agentImage": {"repository": "registry.example.com/agent", "tag": "1.0.0"}}


def _group(selector: dict[str, Any], spec: dict[str, Any]) -> Any:
    cfg = load_stack_config({"cluster": CLUSTER, "nodeGroups": [
        {"name": "h100", "nodeSelector": selector, "gpu": {"model": "H100-80GB", "driver": spec},
         "extraTaints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}]})
    return cfg.cluster, cfg.node_groups[0]


def _valid(obj: dict[str, Any]) -> None:
    validator = crds.validator(obj["apiVersion"], obj["kind"], False)
    assert validator is not None, "the NVIDIADriver CRD is vendored"
    errors = sorted(str(e.message) for e in validator.iter_errors(obj))
    assert errors == [], errors


def test_a_precompiled_open_driver_for_a_labelled_group() -> None:
    cluster, group = _group({"matchLabels": {"pool": "h100"}},
                            {"source": "gpuOperator", "version": "550", "precompiled": True, "kernelModules": "open",
                             "upgrade": {"maxUnavailable": 2, "drain": False}})
    obj = driver.nvidia_driver("nvidia-gpu", cluster, group)
    _valid(obj)
    spec = obj["spec"]
    assert obj["metadata"]["name"] == "nvidia-gpu-driver-h100" and "namespace" not in obj["metadata"]
    assert (spec["driverType"], spec["version"], spec["usePrecompiled"], spec["kernelModuleType"]) == (
        "gpu", "550", True, "open")
    assert spec["nodeSelector"] == {"pool": "h100"} and spec["default"] is False
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
    up = spec["upgradePolicy"]
    assert (up["maxParallelUpgrades"], up["maxUnavailable"], up["drain"]["enable"]) == (2, 2, False)


def test_a_group_chosen_by_expressions_gets_node_affinity() -> None:
    cluster, group = _group({"matchLabels": {"pool": "gpu"},
                             "matchExpressions": [{"key": "gpu-type", "operator": "In", "values": ["h100"]}]},
                            {"source": "gpuOperator", "version": "550.90.07", "type": "vgpu"})
    obj = driver.nvidia_driver("nvidia-gpu", cluster, group)
    _valid(obj)
    assert "nodeSelector" not in obj["spec"]
    (term,) = obj["spec"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "gpu-type", "operator": "In", "values": ["h100"]} in term["matchExpressions"]
    assert obj["spec"]["driverType"] == "vgpu"


DIGEST = "sha256:" + "ab" * 32


def test_one_driver_daemonset_per_os_release_and_per_kernel_when_precompiled() -> None:
    spec = {"source": "container", "version": "535", "precompiled": True, "osReleases": ["ubuntu22.04", "rhel9.4"],
            "kernels": ["5.15.0-105-generic", "5.14.0-427.13.1.el9_4.x86_64"],
            "image": {"digests": {"535-5.15.0-105-generic-ubuntu22.04": DIGEST}}}
    cluster, group = _group({"matchLabels": {"pool": "h100"}}, spec)
    sets = driver.driver_daemonsets("nvidia-gpu", cluster, group)
    assert len(sets) == 4 and len({d["metadata"]["name"] for d in sets}) == 4
    assert all(len(d["metadata"]["name"]) <= 63 for d in sets)
    images = sorted(d["spec"]["template"]["spec"]["containers"][0]["image"] for d in sets)
    assert images == sorted([
        f"nvcr.io/nvidia/driver:535-5.15.0-105-generic-ubuntu22.04@{DIGEST}",
        "nvcr.io/nvidia/driver:535-5.14.0-427.13.1.el9_4.x86_64-ubuntu22.04",
        "nvcr.io/nvidia/driver:535-5.15.0-105-generic-rhel9.4",
        "nvcr.io/nvidia/driver:535-5.14.0-427.13.1.el9_4.x86_64-rhel9.4"])
    rhel = next(d for d in sets if d["spec"]["template"]["spec"]["containers"][0]["image"].endswith(
        "el9_4.x86_64-rhel9.4"))
    pod = rhel["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "pool", "operator": "In", "values": ["h100"]},
        {"key": labels.OS_RELEASE_ID, "operator": "In", "values": ["rhel"]},
        {"key": labels.OS_RELEASE_VERSION_ID, "operator": "In", "values": ["9.4"]},
        {"key": labels.GPU_DEPLOY_DRIVER, "operator": "NotIn", "values": [labels.DRIVER_PREINSTALLED]},
        {"key": labels.KERNEL_VERSION_FULL, "operator": "In", "values": ["5.14.0-427.13.1.el9_4.x86_64"]}]
    assert labels.GPU_SETUP_COMPLETE not in str(term)  # the driver comes before setup's check can pass
    c, check_ctr = pod["containers"]
    assert check_ctr["name"] == "driver-check" and check_ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert check_ctr["args"][-2:] == ["--expect-driver", "535"]  # the branch this template declares
    assert c["command"] == ["nvidia-driver"] and c["args"] == ["init"] and c["securityContext"]["privileged"]
    assert {"name": "run-nvidia", "mountPath": "/run/nvidia", "mountPropagation": "Bidirectional"} in c["volumeMounts"]
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
    assert rhel["spec"]["updateStrategy"] == {"type": "OnDelete"}
    annotations = rhel["metadata"]["annotations"]
    assert annotations["pulumi.com/skipAwait"] == "true"
    # The group's upgrade policy, for the upgrade controller.

    assert UpgradePolicy.from_annotation(annotations[UPGRADE_POLICY_ANNOTATION]) == UpgradePolicy(
        max_unavailable=1, drain=True, drain_timeout_s=1800, validation_timeout_s=1800)
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]


def test_a_compiled_driver_has_one_daemonset_per_os_and_the_policy_pack_allows_it() -> None:
    cluster, group = _group({"matchLabels": {"pool": "h100"}},
                            {"source": "container", "version": "550.90.07", "kernelModules": "open",
                             "osReleases": ["ubuntu22.04", "ubuntu24.04"]})
    sets = driver.driver_daemonsets("nvidia-gpu", cluster, group)
    assert [d["spec"]["template"]["spec"]["containers"][0]["image"] for d in sets] == [
        "nvcr.io/nvidia/driver:550.90.07-ubuntu22.04", "nvcr.io/nvidia/driver:550.90.07-ubuntu24.04"]
    env = {e["name"]: e.get("value") for e in sets[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KERNEL_MODULE_TYPE"] == "open"
    # The pack as the README runs it (policies/config.json) and with its own defaults: privileged, host paths
    # and the host's PID namespace are allowed to the driver container's role, pinned by tag.
    shipped = json.loads((Path(__file__).resolve().parents[3] / "policies" / "config.json").read_text())
    configs: tuple[dict[str, Any], ...] = (shipped["host-access-allow-listed"], {})
    for ds in sets:
        for config in configs:
            assert check("host-access-allow-listed", DS_TYPE, ds, config) == []
        assert check("pinned-images", DS_TYPE, ds) == []
        other = {**ds, "metadata": {**ds["metadata"], "labels": {**ds["metadata"]["labels"],
                                                                 "app.kubernetes.io/component": "gpu-labeller"}}}
        assert any("hostPID" in m for m in check("host-access-allow-listed", DS_TYPE, other))


def test_only_a_change_of_the_driver_outdates_a_driver_pod() -> None:
    """The pod template's ``driver-spec`` hash, which the upgrade compares: a new release, image or module
    type changes it; a new agent image (the check's container) or another interval does not, so an agent
    release restarts no driver."""
    def spec_hash(agent_tag: str = "1.0.0", **driver_spec: Any) -> str:
        cfg = load_stack_config({
            "cluster": {**CLUSTER, "agentImage": {"repository": "registry.example.com/agent", "tag": agent_tag}},
            "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
                            "gpu": {"model": "H100-80GB", "driver": {
                                "source": "container", "version": "550.90.07", "osReleases": ["ubuntu22.04"],
                                **driver_spec}}}]})
        (ds,) = driver.driver_daemonsets("nvidia-gpu", cfg.cluster, cfg.node_groups[0])
        return str(ds["spec"]["template"]["metadata"]["annotations"][DRIVER_SPEC_ANNOTATION])

    base = spec_hash()
    assert spec_hash(agent_tag="1.0.1") == base
    assert spec_hash(version="550.127.05") != base
    assert spec_hash(kernelModules="open") != base
    assert spec_hash(image={"digests": {"550.90.07-ubuntu22.04": "sha256:" + "a" * 64}}) != base
    cluster, group = _group({"matchLabels": {"pool": "h100"}},
                            {"source": "container", "version": "550.90.07", "osReleases": ["ubuntu22.04"]})
    (ds,) = driver.driver_daemonsets("nvidia-gpu", cluster, group)
    pod = ds["spec"]["template"]["spec"]
    # The new driver pod starts where the upgrade's taint keeps the GPU agents away.
    assert {"key": UPGRADE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    probe = pod["containers"][0]["startupProbe"]
    assert "mkdir -p /run/nvidia/validations" in probe["exec"]["command"][-1]
    allowance = probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"]
    assert allowance <= group.gpu.driver.upgrade.validation_timeout_seconds
