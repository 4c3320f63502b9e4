"""``cluster.monitoring`` rendered: the exporter DaemonSets in both modes, the scrape objects each mode
asks for (validated against the Prometheus Operator's CRDs), the counters the alerts need, the dashboards,
and bad settings refused with the field named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvgpu import dcgmcounters
from nvgpu.stackconfig import AllocationMode, GroupPlan, NodeSetupBackend, StackConfigError, load_stack_config
from nvidia_gpu.components.manifests import alerts, dashboards, monitoring
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvidia_gpu.preview import crds

DIGEST = "sha256:" + "ab" * 32


def _config(**monitoring_settings: Any) -> Any:
    return load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "agentImage": {"repository": "registry.example.com/agent",
                                                                "tag": "1.0.0"},
                    "monitoring": monitoring_settings},
        "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"gpu": "h100"}},
                        "gpu": {"model": "H100-80GB"}}],
    })


def _ctx(config: Any) -> GroupContext:
    group = config.node_groups[0]
    return GroupContext(namespace="nvidia-gpu", cluster=config.cluster, group=group,
                        plan=GroupPlan.of(config.cluster, group))


def test_the_agent_exporter_is_unprivileged_and_reads_pod_resources() -> None:
    ds = monitoring.exporter_daemonset(_ctx(_config()))
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]} and not c["securityContext"]["privileged"]
    assert pod["automountServiceAccountToken"] is False
    assert {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True} \
        in c["volumeMounts"]
    assert "--info" in c["args"] and "node_group=h100" in c["args"]
    assert ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9400"


def test_dcgm_mode_runs_nvidias_image_by_digest_with_sys_admin_only() -> None:
    config = _config(exporter="dcgm", dcgm={"image": {"tag": "4.4.1-4.6.0-ubuntu22.04", "digest": DIGEST}},
                     scrape="serviceMonitor")
    ds = monitoring.exporter_daemonset(_ctx(config))
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["image"].endswith("@" + DIGEST) and c["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "dcgm-exporter"
    text = monitoring.counters_text(config.cluster.monitoring)
    listed = {c.name for c in dcgmcounters.read(text)}
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_EXP_XID_ERRORS_COUNT"} <= listed
    assert text.startswith(dcgmcounters.default_text().rstrip("\n"))


@pytest.mark.parametrize("scrape", ["serviceMonitor", "podMonitor"])
def test_monitors_and_rules_are_valid_prometheus_operator_objects(scrape: str) -> None:
    config = _config(scrape=scrape, labels={"release": "kube-prometheus-stack"})

    cluster = config.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET})
    dra_group = config.node_groups[0].model_copy(update={"name": "h100-dra", "allocation_mode": AllocationMode.DRA})
    groups = [*config.node_groups, dra_group]
    found = monitoring.targets(cluster, groups, {g.name: GroupPlan.of(cluster, g) for g in groups})
    # The exporter and every agent serving /metrics, each on its own port.
    assert {t.component: t.port for t in found} == {
        "gpu-exporter": 9400, "device-plugin": 9401, "dra-kubelet-plugin": 9402, "mig-manager": 9403,
        "gpu-setup": 9404}
    deckhouse = config.cluster.model_copy(update={"node_setup": NodeSetupBackend.DECKHOUSE})
    plans = {g.name: GroupPlan.of(deckhouse, g) for g in config.node_groups}
    assert {t.component for t in monitoring.targets(deckhouse, config.node_groups, plans)} == {
        "gpu-exporter", "device-plugin", "mig-manager"}  # Deckhouse's bashible leaves no setup pod to scrape
    objects = [monitoring.monitor("nvidia-gpu", cluster, t) for t in found]
    objects.append(monitoring.prometheus_rule("nvidia-gpu", config.cluster, alerts.rule_groups()))
    for obj in objects:
        validator = crds.validator(obj["apiVersion"], obj["kind"], False)
        assert validator is not None, obj["kind"]
        errors = [e.message for e in validator.iter_errors(obj)]
        assert not errors, (obj["kind"], errors)
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert {o["kind"] for o in objects} == {"ServiceMonitor" if scrape == "serviceMonitor" else "PodMonitor",
                                           "PrometheusRule"}
    # No annotations when a monitor selects the pods (they would be scraped twice).
    assert "annotations" not in monitoring.exporter_daemonset(_ctx(config))["spec"]["template"]["metadata"]


def test_nvidias_dashboard_ships_unchanged_and_ours_parses() -> None:
    config = _config()
    cm = monitoring.dashboard_config_map("nvidia-gpu", config.cluster.monitoring, "dcgm-exporter",
                                         dashboards.nvidia_dashboard_text())
    assert cm["data"]["dcgm-exporter.json"] == dashboards.NVIDIA_DASHBOARD_FILE.read_text()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboards.fleet_dashboard_text())
    assert len(dashboards.queries(board)) >= len(dashboards.PANELS)


@pytest.mark.parametrize(("settings", "message"), [
    ({"exporter": "dcgm"}, "nvidia-gpu:cluster.monitoring.dcgm.image: required with exporter 'dcgm'"),
    ({"dcgm": {"image": {"digest": DIGEST}}}, "cluster.monitoring.dcgm.image: set, but exporter is 'agent'"),
    ({"alerts": True}, "cluster.monitoring.alerts: true needs the Prometheus Operator"),
    ({"labels": {"release": "x"}}, "cluster.monitoring.labels: set, but scrape is 'annotations'"),
    ({"interval": "30"}, "cluster.monitoring.interval: must be a Prometheus duration"),
    ({"interval": "1h"}, "must be between 1s and 10m"),
    ({"counters": "DCGM_FI_DEV_GPU_TEMP, gague, t\n"}, "counters line 1: type 'gague'"),
    ({"exporter": "dcgm", "dcgm": {"image": {"tag": "4.4.1"}}}, "cluster.monitoring.dcgm.image.digest"),
    ({"dashboards": {"enabled": "yes"}}, "cluster.monitoring.dashboards.enabled: must be a boolean"),
])
def test_bad_monitoring_settings_name_the_field(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(StackConfigError) as caught:
        _config(**settings)
    assert message in str(caught.value), str(caught.value)
