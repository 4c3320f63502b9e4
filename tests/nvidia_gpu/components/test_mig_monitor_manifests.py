"""The labeller and the agent's exporter get the MIG monitor capability on MIG groups, in the narrowest form
NVIDIA's runtime honours, and the policy pack accepts exactly that (issue 33, item 1).

Without the capability NVML refuses a GPU in MIG mode's memory and MIG devices to the process
(NVML_ERROR_NO_PERMISSION: NVIDIA/gpu-feature-discovery#6, NVIDIA/k8s-device-plugin#399); NVIDIA's charts set
``NVIDIA_MIG_MONITOR_DEVICES=all`` on GFD and the plugin, and nvidia-container-toolkit honours it only in a
container with CAP_SYS_ADMIN (``TestMigCapsValidate``: "errors when requested in a non-privileged container").
"""

from __future__ import annotations

from typing import Any

import pytest

from nvgpu.stackconfig import GroupPlan
from nvidia_gpu.components.manifests import monitoring, workloads
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvidia_gpu.components.program import build_stack
from nvidia_gpu.policies.k8s_security import DEFAULT_PRIVILEGED_ROLES, privileged_problems
from nvidia_gpu.policies.manifests import Kind
from tests.nvidia_gpu.components.component_helpers import (
    H100_CUSTOM,
    MIG_STACK_GROUPS,
    Engine,
    engine,
    group,
    of_kind,
    stack_config,
)

__all__ = ["engine"]  # the fixture, imported for pytest

MONITOR = {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}
DAEMONSET = Kind("apps/v1", "DaemonSet")


def _ctx(g: dict[str, Any]) -> GroupContext:
    cfg = stack_config([g], monitoring={"enabled": True})
    (group,) = cfg.node_groups
    return GroupContext(cfg.cluster.namespace, cfg.cluster, group, GroupPlan.of(cfg.cluster, group))


def _readers(ctx: GroupContext) -> dict[str, dict[str, Any]]:
    """The labeller's and the agent exporter's DaemonSets, by component."""
    return {"gpu-labeller": workloads.labeller_daemonset(ctx), "gpu-exporter": monitoring.exporter_daemonset(ctx)}


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return c  # type: ignore[no-any-return]


@pytest.mark.parametrize("g", [H100_CUSTOM, group("a100", "MIG", model="A100-40GB", mig={"partedConfig": "all-1g.5gb"}),
                               {**group("d", "MIG", model="A100-80GB"), "allocationMode": "dra"}])
def test_mig_groups_readers_ask_for_the_monitor_capability_with_sys_admin_only(g: dict[str, Any]) -> None:
    for role, ds in _readers(_ctx(g)).items():
        c = _container(ds)
        assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == role
        assert MONITOR in c["env"], role
        sc = c["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, role
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False, role
        assert privileged_problems(DAEMONSET, ds, DEFAULT_PRIVILEGED_ROLES) == [], role


@pytest.mark.parametrize("sharing", ["Exclusive", "TimeSlicing", "MPS"])
def test_other_groups_readers_stay_without_capabilities(sharing: str) -> None:
    for role, ds in _readers(_ctx(group("g", sharing))).items():
        c = _container(ds)
        assert all(e.get("name") != "NVIDIA_MIG_MONITOR_DEVICES" for e in c["env"]), role
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, role


def test_the_policy_allows_sys_admin_only_with_the_monitor_request_and_nothing_more() -> None:
    ds = workloads.labeller_daemonset(_ctx(H100_CUSTOM))
    c = _container(ds)

    def problems(**container: Any) -> list[str]:
        changed = {**ds, "spec": {**ds["spec"], "template": {**ds["spec"]["template"], "spec": {
            **ds["spec"]["template"]["spec"], "containers": [{**c, **container}]}}}}
        return privileged_problems(DAEMONSET, changed, DEFAULT_PRIVILEGED_ROLES)

    assert problems() == []
    assert problems(env=[e for e in c["env"] if e != MONITOR])  # SYS_ADMIN without asking for the capability
    assert problems(env=[*[e for e in c["env"] if e != MONITOR], {**MONITOR, "value": "0"}])  # not "all"
    assert problems(securityContext={**c["securityContext"],
                                     "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "NET_ADMIN"]}})
    assert problems(securityContext={**c["securityContext"], "privileged": True})
    other = {**ds, "metadata": {**ds["metadata"], "labels": {**ds["metadata"]["labels"],
                                                             "app.kubernetes.io/component": "eviction-guard"}}}
    other["spec"] = {**ds["spec"], "template": {**ds["spec"]["template"], "metadata": {"labels": {
        "app.kubernetes.io/component": "eviction-guard"}}}}
    assert privileged_problems(DAEMONSET, other, DEFAULT_PRIVILEGED_ROLES)  # another role: refused


def test_the_stack_renders_it_for_each_mig_group_and_only_those(engine: Engine) -> None:
    """Through the components (``build_stack``): every labeller and agent exporter DaemonSet of a MIG group
    asks for the capability with SYS_ADMIN alone; the others ask for nothing; the policy accepts them all."""
    cfg = stack_config(MIG_STACK_GROUPS, monitoring={"enabled": True})
    resources = engine.run(lambda: build_stack(cfg))
    seen: dict[tuple[str, str], bool] = {}
    for r in of_kind(resources, "DaemonSet"):
        role = r.inputs["metadata"]["labels"]["app.kubernetes.io/component"]
        if role not in ("gpu-labeller", "gpu-exporter"):
            continue
        c = _container(r.inputs)
        group_name = r.inputs["metadata"]["labels"]["app.kubernetes.io/instance"]
        asks = MONITOR in c["env"]
        seen[(role, group_name)] = asks
        assert (c["securityContext"]["capabilities"].get("add") == ["SYS_ADMIN"]) is asks
        assert privileged_problems(DAEMONSET, r.inputs, DEFAULT_PRIVILEGED_ROLES) == []
    assert seen == {(role, g): g in ("h100", "a100") for role in ("gpu-labeller", "gpu-exporter")
                    for g in ("h100", "a100", "l4", "any")}
