"""The pure manifest builders: sharing configs, scheduling, RBAC, security contexts, Deckhouse objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from nvgpu import labels
from nvgpu.nodelabels import custom_mig_config_name, desired_node_labels
from nvgpu.nodescripts import NodeScript, facts
from nvgpu.stackconfig import GroupPlan, Mig, Sharing
from nvidia_gpu.components.manifests import deckhouse, platform, scheduling, sharing, workloads
from nvidia_gpu.components.manifests.platform import AgentRole
from nvidia_gpu.components.manifests.workloads import GroupContext
from tests.nvidia_gpu.components.component_helpers import group, stack_config

DATA = Path(__file__).resolve().parent / "data"


def _ctx(groups: list[dict[str, Any]], node_setup: str = "deckhouse") -> GroupContext:
    cfg = stack_config(groups, node_setup=node_setup)
    g = cfg.node_groups[0]
    return GroupContext(cfg.cluster.namespace, cfg.cluster, g, GroupPlan.of(cfg.cluster, g))


#: Only the device plugin (host devices, kubelet sockets) and node setup (/proc/sys, containerd) are privileged.
#: Privileged containers by component: node setup's (its init and its teardown holder; the monitor reads
#: only); the device plugin only for MPS groups, whose control daemon it runs (not these groups').
_PRIVILEGED = {"device-plugin": False, "gpu-labeller": False, "gpu-setup": True}


def _containers(ds: dict[str, Any]) -> list[dict[str, Any]]:
    spec = ds["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


# --- sharing configs -------------------------------------------------------------------------------


def test_every_group_gets_all_four_named_configs_keyed_like_the_label_values() -> None:
    g = stack_config([group(sharing="TimeSlicing", timeSlicing={"partitionCount": 8})]).node_groups[0]
    data = sharing.render_named_configs(g)
    assert list(data) == ["Exclusive", "TimeSlicing", "MPS", "MIG"]
    for text in data.values():
        assert yaml.safe_load(text)["version"] == "v1"


@pytest.mark.parametrize(
    ("sharing_mode", "block", "replicas"),
    [
        ("TimeSlicing", {"timeSlicing": {"partitionCount": 8}}, 8),
        ("TimeSlicing", {}, 4),
        ("MPS", {"mps": {"partitionCount": 6}}, 6),
    ],
)
def test_replicated_modes_use_the_groups_partition_count(
    sharing_mode: str, block: dict[str, Any], replicas: int
) -> None:
    g = stack_config([group(sharing=sharing_mode, **block)]).node_groups[0]
    doc = sharing.device_plugin_config(g, Sharing(sharing_mode))
    key = "timeSlicing" if sharing_mode == "TimeSlicing" else "mps"
    assert doc["sharing"][key] == {
        "renameByDefault": False,
        "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
    }
    assert doc["flags"]["migStrategy"] == "none"
    assert ("mpsRoot" in doc["flags"]) is (sharing_mode == "MPS")


def test_configs_have_the_shape_of_nvidias_published_examples() -> None:
    g = stack_config([group(sharing="TimeSlicing")]).node_groups[0]
    for mode, example in (("TimeSlicing", "time-slicing"), ("MPS", "mps")):
        theirs = yaml.safe_load((DATA / f"nvidia-device-plugin-config-{example}.yaml").read_text())
        ours = yaml.safe_load(sharing.render_named_configs(g)[mode])
        assert ours["version"] == theirs["version"]
        assert ours["sharing"].keys() == theirs["sharing"].keys()
        assert ours["sharing"][next(iter(theirs["sharing"]))]["resources"][0]["name"] == "nvidia.com/gpu"


@pytest.mark.parametrize(("strategy", "expected"), [("mixed", "mixed"), ("single", "single")])
def test_mig_config_carries_the_mig_strategy(strategy: str, expected: str) -> None:
    g = stack_config([group(sharing="MIG", model="H100-80GB", mig={"strategy": strategy})]).node_groups[0]
    assert sharing.device_plugin_config(g, Sharing.MIG)["flags"]["migStrategy"] == expected
    assert sharing.device_plugin_config(g, Sharing.EXCLUSIVE)["flags"]["migStrategy"] == "none"
    assert "sharing" not in sharing.device_plugin_config(g, Sharing.MIG)


# --- node labels and taints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "mig_label"),
    [
        ({"sharing": "Exclusive"}, "all-disabled"),
        ({"sharing": "TimeSlicing"}, "all-disabled"),
        ({"sharing": "MIG", "model": "H100-80GB", "mig": {"partedConfig": "all-3g.40gb"}}, "all-3g.40gb"),
    ],
)
def test_deckhouse_flow_labels(gpu: dict[str, Any], mig_label: str) -> None:
    cfg = stack_config([{"name": "g", "nodeGroup": "ng", "gpu": gpu}])
    g = cfg.node_groups[0]
    assert desired_node_labels(g, GroupPlan.of(cfg.cluster, g)) == {
        labels.GPU_NODE: "",
        labels.DEVICE_GPU_CONFIG: gpu["sharing"],
        labels.MIG_CONFIG: mig_label,
        labels.NODE_GROUP: "g",
    }


def test_custom_mig_name_ignores_order_and_fits_a_label() -> None:
    a = Mig.model_validate({"partedConfig": "custom", "customConfigs": [
        {"index": 1, "slices": [{"profile": "3g.40gb"}, {"profile": "1g.10gb", "count": 2}]},
        {"index": 0, "slices": [{"profile": "7g.80gb"}]},
    ]})
    b = Mig.model_validate({"partedConfig": "custom", "customConfigs": [
        {"index": 0, "slices": [{"profile": "7g.80gb", "count": 1}]},
        {"index": 1, "slices": [{"profile": "1g.10gb", "count": 2}, {"profile": "3g.40gb"}]},
    ]})
    assert custom_mig_config_name("ng", a) == custom_mig_config_name("ng", b)
    assert custom_mig_config_name("ng", a).startswith("custom-ng-")
    assert len(custom_mig_config_name("x" * 60, a)) <= 63
    cfg = stack_config([group(sharing="MIG", mig=a.model_dump(by_alias=True))])
    assert GroupPlan.of(cfg.cluster, cfg.node_groups[0]).mig_config_name == custom_mig_config_name("gpu", a)


def test_node_group_patch_sets_labels_and_taints_in_the_node_template() -> None:
    taints = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    cfg = stack_config([{**group(), "extraTaints": taints}])
    g = cfg.node_groups[0]
    patch = deckhouse.node_group_patch(g, GroupPlan.of(cfg.cluster, g), "nvidia-gpu")
    assert (patch["apiVersion"], patch["kind"], patch["metadata"]["name"]) == ("deckhouse.io/v1", "NodeGroup", "ng-gpu")
    template = patch["spec"]["nodeTemplate"]
    assert template["labels"][labels.DEVICE_GPU_CONFIG] == "Exclusive"
    assert template["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
    ]
    assert list(patch["spec"]) == ["nodeTemplate"], "the patch must own nothing but the node template"


def test_gpu_taint_can_be_turned_off() -> None:
    cfg = stack_config([{**group(), "gpuTaint": False}])
    g = cfg.node_groups[0]
    patch = deckhouse.node_group_patch(g, GroupPlan.of(cfg.cluster, g), "nvidia-gpu")
    assert patch["spec"]["nodeTemplate"]["taints"] == []


def test_node_group_configuration_is_scoped_to_the_group() -> None:
    g = stack_config([group("h100")]).node_groups[0]
    ngc = deckhouse.node_group_configuration("nvidia-gpu", g, NodeScript("gpu-check.sh", 31, "echo ok\n"))
    assert ngc["metadata"]["name"] == "nvidia-gpu-h100-gpu-check.sh"
    assert ngc["spec"] == {"weight": 31, "nodeGroups": ["ng-h100"], "bundles": ["*"], "content": "echo ok\n"}


# --- scheduling ------------------------------------------------------------------------------------


def test_affinity_selects_the_group_and_waits_for_setup() -> None:
    cfg = stack_config(
        [{"name": "l4", "nodeSelector": {"matchLabels": {"pool": "l4"},
          "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}],
        node_setup="daemonset",
    )
    terms = scheduling.node_selector_terms(cfg.node_groups[0], require_setup_complete=True)
    assert terms == [{"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["l4"]},
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": labels.GPU_SETUP_COMPLETE, "operator": "Exists"},
    ]}]
    ungated = scheduling.node_selector_terms(cfg.node_groups[0], require_setup_complete=False)
    assert all(e["key"] != labels.GPU_SETUP_COMPLETE for e in ungated[0]["matchExpressions"])


def test_tolerations_cover_the_gpu_taint_and_extra_taints() -> None:
    taints = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}, {"key": "spot", "effect": "NoExecute"}]
    g = stack_config([{**group(), "extraTaints": taints}]).node_groups[0]
    assert scheduling.tolerations(g) == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
    ]


# --- workloads -------------------------------------------------------------------------------------


@pytest.mark.parametrize("node_setup", ["deckhouse", "daemonset"])
def test_every_container_is_pinned_bounded_and_locked_down(node_setup: str) -> None:
    groups = [group()] if node_setup == "deckhouse" else [{"name": "gpu", "nodeSelector": {"matchLabels": {"a": "b"}}}]
    ctx = _ctx(groups, node_setup)
    builders = [workloads.device_plugin_daemonset, workloads.labeller_daemonset]
    if node_setup == "daemonset":
        builders.append(workloads.setup_daemonset)
    for build in builders:
        ds = build(ctx)
        pod = ds["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == "system-node-critical"
        assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
        for c in _containers(ds):
            assert c["image"] == "registry.example.com/nvidia-gpu-agent:0.1.0"
            assert c["command"] == ["python", "-m", "node_agent"] or c["command"] == list(workloads.HOLD_COMMAND)
            assert set(c["resources"]) == {"requests", "limits"}
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            privileged = c["securityContext"].get("privileged", False)
            assert privileged is _PRIVILEGED[ds["metadata"]["labels"]["app.kubernetes.io/name"]]
            if not privileged:
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
                assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_device_plugin_runs_the_agent_with_the_groups_configs() -> None:
    ctx = _ctx([group("l4", sharing="TimeSlicing")])
    ds = workloads.device_plugin_daemonset(ctx)
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["args"][:3] == ["--driver-root", "/driver-root", "device-plugin"]
    assert c["args"][c["args"].index("--default-config") + 1] == "TimeSlicing"
    assert c["args"][c["args"].index("--config-label") + 1] == labels.DEVICE_GPU_CONFIG
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == sharing.config_map_name(ctx.group)
    assert volumes["device-plugins"]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    # Only readiness asks the (optional) status port; liveness is the process's own watchdog.
    assert "readinessProbe" in c and "livenessProbe" not in c and "startupProbe" not in c


@pytest.mark.parametrize("enabled", [True, False])
def test_device_plugin_is_scraped_only_with_monitoring_on(enabled: bool) -> None:
    cfg = stack_config([group()], monitoring={"enabled": enabled})
    g = cfg.node_groups[0]
    ctx = GroupContext(cfg.cluster.namespace, cfg.cluster, g, GroupPlan.of(cfg.cluster, g))
    annotations = workloads.device_plugin_daemonset(ctx)["spec"]["template"]["metadata"].get("annotations", {})
    assert (annotations.get("prometheus.io/port") == str(workloads.DEVICE_PLUGIN_METRICS_PORT)) is enabled


CONFIG_SOURCE = ["--config-dir", "/etc/nvidia-gpu/device-plugin", "--config-label", labels.DEVICE_GPU_CONFIG]


@pytest.mark.parametrize("gpu", [
    {"sharing": "Exclusive"}, {"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 8}}, {"sharing": "MPS"},
    {"sharing": "MIG", "mig": {"strategy": "single"}},
])
def test_labeller_reads_the_device_plugins_config(gpu: dict[str, Any]) -> None:
    """The labeller gets the device plugin's config source and ConfigMap, so its sharing labels follow the
    named config the node label picks (NVIDIA's GFD shares the plugin's config file the same way)."""
    ctx = _ctx([{"name": "g", "nodeGroup": "ng", "gpu": gpu}])
    args = workloads.labeller_args(ctx)
    assert args[:7] == ["--driver-root", "/driver-root", "labels", "--loop", "--interval", "60", "--patch-node"]
    assert args[7:] == [*CONFIG_SOURCE, "--default-config", gpu["sharing"], "--daemonset", "nvidia-gpu/gpu-labeller-g",
                        "--inventory", "--inventory-sharing", gpu["sharing"], "--inventory-allocation-mode",
                        "devicePlugin"]
    plugin = workloads.device_plugin_daemonset(ctx)["spec"]["template"]["spec"]
    assert "--replicas" not in args and "--mig-strategy" not in args
    plugin_args = plugin["containers"][0]["args"]
    assert plugin_args[plugin_args.index("--config-dir"):][:6] == args[7:13]
    pod = workloads.labeller_daemonset(ctx)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"] == {v["name"]: v for v in plugin["volumes"]}["config"]
    assert {"name": "config", "mountPath": "/etc/nvidia-gpu/device-plugin", "readOnly": True} in (
        pod["containers"][0]["volumeMounts"])


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ({"sharing": "Exclusive"}, ["--mig-strategy", "none", "--replicas", "1", "--sharing-strategy", "time-slicing"]),
        ({"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 8}},
         ["--mig-strategy", "none", "--replicas", "8", "--sharing-strategy", "time-slicing"]),
    ],
)
def test_dra_labeller_labels_with_the_groups_sharing(gpu: dict[str, Any], expected: list[str]) -> None:
    """A DRA group has no device plugin and no device-plugin ConfigMap: the group's sharing goes as flags."""
    ctx = _ctx([{"name": "g", "nodeGroup": "ng", "allocationMode": "dra", "gpu": gpu}])
    args = workloads.labeller_args(ctx)
    assert args[7:] == [*expected, "--daemonset", "nvidia-gpu/gpu-labeller-g", "--inventory", "--inventory-sharing",
                        gpu["sharing"], "--inventory-allocation-mode", "dra",
                        "--inventory-dra-driver", "gpu.nvidia.com"]
    pod = workloads.labeller_daemonset(ctx)["spec"]["template"]["spec"]
    assert "config" not in {v["name"] for v in pod["volumes"]}


def test_setup_daemonset_runs_before_the_gate_and_tears_down_on_delete() -> None:
    ds = workloads.setup_daemonset(_ctx([{"name": "g", "nodeSelector": {"matchLabels": {"a": "b"}}}], "daemonset"))
    pod = ds["spec"]["template"]["spec"]
    exprs = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert all(e["key"] != labels.GPU_SETUP_COMPLETE for e in exprs["matchExpressions"])
    assert pod["hostPID"] is False
    assert pod["initContainers"][0]["args"] == ["--host-root", "/host", "--driver-root", "/driver-root", "setup"]
    hold, watch = pod["containers"]
    # The holder only holds the teardown (its preStop hook), with the host root writable; no interpreter.
    assert hold["lifecycle"]["preStop"]["exec"]["command"] == [
        "python", "-m", "node_agent", "--host-root", "/host", "--driver-root", "/driver-root", "teardown"]
    assert hold["command"][:2] == ["sh", "-c"] and "trap 'exit 0' TERM" in hold["command"][2]
    assert {m["mountPath"]: m.get("readOnly", False) for m in hold["volumeMounts"]}["/host"] is False
    # The monitor re-runs the check and serves it (setup-monitor), exiting 0 on SIGTERM; it reads only.
    assert watch["args"] == ["--host-root", "/host", "--driver-root", "/driver-root", "setup-monitor",
                             "--metrics-port", str(workloads.NODE_SETUP_METRICS_PORT)]
    assert {m["mountPath"]: m.get("readOnly", False) for m in watch["volumeMounts"]}["/host"] is True
    assert "lifecycle" not in watch
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}


# --- platform --------------------------------------------------------------------------------------


def test_namespace_enforces_privileged_and_audits_baseline() -> None:
    ns = platform.namespace("nvidia-gpu", "1.34")
    lab = ns["metadata"]["labels"]
    assert lab["pod-security.kubernetes.io/enforce"] == "privileged"
    assert lab["pod-security.kubernetes.io/warn"] == "privileged"
    assert lab["pod-security.kubernetes.io/audit"] == "baseline"
    assert lab["pod-security.kubernetes.io/enforce-version"] == "v1.34"


@pytest.mark.parametrize("role", list(AgentRole))
def test_rbac_is_least_privilege(role: AgentRole) -> None:
    cr = platform.cluster_role("nvidia-gpu", role)
    for rule in cr["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field]
        assert "secrets" not in rule["resources"]
        assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
        # The one delete: the labeller's own node's GPU inventory objects (the confinement policy's rule).
        assert "delete" not in rule["verbs"] or (role, rule["resources"]) == (AgentRole.LABELLER, ["gpus"])
    crb = platform.cluster_role_binding("nvidia-gpu", role)
    assert crb["roleRef"]["name"] == cr["metadata"]["name"] == f"nvidia-gpu-{role.value}"
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": role.value, "namespace": "nvidia-gpu"}]


def test_only_the_daemonset_backend_has_a_setup_role() -> None:
    assert AgentRole.NODE_SETUP not in platform.roles_for_backend(daemonset_setup=False)
    assert AgentRole.NODE_SETUP in platform.roles_for_backend(daemonset_setup=True)


def test_runtime_class_runs_the_nvidia_handler_on_set_up_gpu_nodes_only() -> None:
    rc = platform.runtime_class("nvidia")
    assert rc["apiVersion"] == "node.k8s.io/v1" and rc["kind"] == "RuntimeClass"
    assert rc["metadata"]["name"] == "nvidia" and "namespace" not in rc["metadata"]
    # Every stack on the cluster applies it alike: no label names the stack (co-owned, never a conflict).
    assert "app.kubernetes.io/instance" not in rc["metadata"]["labels"]
    assert rc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvidia-gpu"
    # The runtime entry node setup writes into containerd's and CRI-O's config.
    assert rc["handler"] == facts.NVIDIA_RUNTIME_NAME == "nvidia"
    # Node setup sets the gate label to "" (a RuntimeClass nodeSelector matches exact values).
    assert rc["scheduling"]["nodeSelector"] == {labels.GPU_SETUP_COMPLETE: ""}
    # The GPU taint, the same toleration the agent DaemonSets have; no group's extra taints, no MIG taint.
    assert rc["scheduling"]["tolerations"] == [
        {"key": labels.GPU_TAINT_KEY, "operator": "Exists", "effect": labels.GPU_TAINT_EFFECT}]
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    dedicated = stack_config([{**group(), "extraTaints": [taint]}])
    agent_tolerations = scheduling.tolerations(dedicated.node_groups[0])
    assert rc["scheduling"]["tolerations"] == agent_tolerations[:1] and len(agent_tolerations) == 2
    assert "overhead" not in rc
    assert platform.runtime_class("gpu.example.com")["metadata"]["name"] == "gpu.example.com"
