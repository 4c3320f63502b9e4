"""The stack's alerts run by Prometheus's own rule engine: ``promtool check rules`` on the PrometheusRule's
groups, and ``promtool test rules`` over synthetic series, one case per alert (it fires on the series it is
for, with the labels a receiver routes by, and not on its near misses). Every alert has a case and a runbook
section in docs/operations/runbooks.md that quotes its ``runbook`` annotation."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from nvidia_gpu.components.manifests import alerts
from tests.kit.tools import required_bin

REPO = Path(__file__).resolve().parents[3]
GPU = {"Hostname": "n1", "gpu": "0", "UUID": "GPU-a"}


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


#: alert -> (input series, eval time, the labels of each expected alert)
CASES: dict[str, tuple[list[dict[str, str]], str, list[dict[str, str]]]] = {
    "NvidiaGpuFellOffTheBus": (
        [_series("nvidia_gpu_exporter_gpus", {"state": "lost", "Hostname": "n1"}, "0 0 1 1"),
         _series("nvidia_gpu_exporter_gpus", {"state": "ok", "Hostname": "n1"}, "8 8 7 7"),
         _series("DCGM_FI_DEV_XID_ERRORS", {**GPU, "Hostname": "n2"}, "79 79 79 79"),
         _series("DCGM_FI_DEV_XID_ERRORS", {**GPU, "Hostname": "n3"}, "31 31 31 31")],
        "3m", [{"state": "lost", "Hostname": "n1", "severity": "critical"},
               {**GPU, "Hostname": "n2", "severity": "critical"}]),
    "NvidiaGpuMissing": (
        [_series("DCGM_FI_DEV_GPU_TEMP", GPU, "50x60"), _series("DCGM_FI_DEV_GPU_TEMP", {**GPU, "gpu": "1"}, "50x30")],
        "50m", [{"Hostname": "n1", "severity": "critical"}]),
    "NvidiaGpuXidError": (
        [_series("nvidia_gpu_xid_errors_total", {**GPU, "xid": "48", "class": "device"}, "0 0 1 1 1"),
         _series("nvidia_gpu_xid_errors_total", {**GPU, "gpu": "1", "xid": "13", "class": "application"}, "0 1 2 3 4"),
         _series("DCGM_EXP_XID_ERRORS_COUNT", {**GPU, "Hostname": "n2", "xid": "94"}, "1 1 1 1 1"),
         _series("DCGM_EXP_XID_ERRORS_COUNT", {**GPU, "Hostname": "n3", "xid": "43"}, "1 1 1 1 1")],
        "4m", [{**GPU, "xid": "48", "severity": "critical"},
               {**GPU, "Hostname": "n2", "xid": "94", "severity": "critical"}]),
    "NvidiaGpuApplicationXids": (
        [_series("nvidia_gpu_xid_errors_total", {**GPU, "xid": "13", "class": "application"}, "0+1x10"),
         _series("nvidia_gpu_xid_errors_total", {**GPU, "gpu": "1", "xid": "13", "class": "application"}, "0 1 1")],
        "10m", [{**GPU, "severity": "warning"}]),
    "NvidiaGpuUncorrectableEccErrors": (
        [_series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU, "0 0 2 2"),
         _series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", {**GPU, "gpu": "1"}, "3 3 3 3")],
        "3m", [{**GPU, "severity": "critical"}]),
    "NvidiaGpuRowRemapFailure": (
        [_series("DCGM_FI_DEV_ROW_REMAP_FAILURE", GPU, "0 1"),
         _series("DCGM_FI_DEV_ROW_REMAP_FAILURE", {**GPU, "gpu": "1"}, "0 0")],
        "1m", [{**GPU, "severity": "critical"}]),
    "NvidiaGpuRowRemapPending": (
        [_series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", GPU, "0 0 1"),
         _series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", {**GPU, "gpu": "1"}, "2 2 2")],
        "2m", [{**GPU, "severity": "warning"}]),
    # 0x20 software thermal slowdown; 0x60 both thermal bits; 0x04 power cap (normal under load); 0x80 brake.
    "NvidiaGpuThermalThrottling": (
        [_series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GPU, "32x15"),
         _series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {**GPU, "gpu": "1"}, "96x15"),
         _series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {**GPU, "gpu": "2"}, "5x15"),
         _series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {**GPU, "gpu": "3"}, "128x15")],
        "12m", [{**GPU, "severity": "warning"}, {**GPU, "gpu": "1", "severity": "warning"}]),
    "NvidiaGpuPowerThrottling": (
        [_series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GPU, "128x15"),
         _series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {**GPU, "gpu": "1"}, "8x15"),
         _series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {**GPU, "gpu": "2"}, "4x15"),
         _series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {**GPU, "gpu": "3"}, "128 0x14")],
        "12m", [{**GPU, "severity": "warning"}, {**GPU, "gpu": "1", "severity": "warning"}]),
    "NvidiaGpuDevicePluginNotRegistered": (
        [_series("nvidia_gpu_device_plugin_registered", {"resource": "nvidia.com/gpu", "node": "n1"}, "1 0x10"),
         _series("nvidia_gpu_device_plugin_registered", {"resource": "nvidia.com/gpu", "node": "n2"}, "1 0 0 1x8")],
        "8m", [{"resource": "nvidia.com/gpu", "node": "n1", "severity": "critical"}]),
    "NvidiaGpuDraPluginNotRegistered": (
        [_series("nvidia_gpu_dra_plugin_registered", {"driver": "gpu.nvidia.com", "node": "n1"}, "1 0x10"),
         _series("nvidia_gpu_dra_plugin_registered", {"driver": "gpu.nvidia.com", "node": "n2"}, "0 0 0 1x8")],
        "8m", [{"driver": "gpu.nvidia.com", "node": "n1", "severity": "critical"}]),
    # n1 became unusable after setup; n2 recovered within the 10 minutes; n3 has no GPU (not an alert).
    "NvidiaGpuNodeCheckFailing": (
        [_series("nvidia_gpu_node_check_verdict", {"verdict": "unusable", "node": "n1"}, "0 1x15"),
         _series("nvidia_gpu_node_check_verdict", {"verdict": "unusable", "node": "n2"}, "1x5 0x10"),
         _series("nvidia_gpu_node_check_verdict", {"verdict": "no-gpu", "node": "n3"}, "1x15")],
        "13m", [{"verdict": "unusable", "node": "n1", "severity": "critical"}]),
    # Seconds in the current phase (scraped each minute): n1 waits past the hour, n2 moved on at 50 min.
    "NvidiaGpuMigReconfigurationStuck": (
        [_series("nvidia_gpu_mig_manager_phase_duration_seconds", {"node": "n1"}, "0+60x80"),
         _series("nvidia_gpu_mig_manager_phase_duration_seconds", {"node": "n2"}, "0+60x50 0x30")],
        "70m", [{"node": "n1", "severity": "warning"}]),
    "NvidiaGpuMetricsTargetDown": (
        [_series("up", {"job": "gpu-exporter", "node": "n1"}, "0x15"),
         _series("up", {"job": "device-plugin", "node": "n1"}, "1x15"),
         _series("up", {"job": "dra-kubelet-plugin", "node": "n2"}, "0x15"),
         _series("up", {"job": "something-else", "node": "n1"}, "0x15")],
        "12m", [{"job": "gpu-exporter", "node": "n1", "severity": "warning"},
                {"job": "dra-kubelet-plugin", "node": "n2", "severity": "warning"}]),
    "NvidiaGpuNodeSetupIncomplete": (
        [_series("kube_node_labels", {"node": "n1", alerts.ksm_label(alerts.KSM_NODE_LABELS[0]): "a100"}, "1x40"),
         _series("kube_node_labels", {"node": "n2", alerts.ksm_label(alerts.KSM_NODE_LABELS[0]): "a100",
                                      alerts.ksm_label("nvidia.com/gpu.count"): "8"}, "1x40"),
         _series("kube_node_labels", {"node": "n3"}, "1x40")],
        "35m", [{"node": "n1", alerts.ksm_label(alerts.KSM_NODE_LABELS[0]): "a100", "severity": "warning"}]),
    "NvidiaGpuMigReconfigurationFailed": (
        [_series("kube_node_labels", {"node": "n1", alerts.ksm_label(alerts.KSM_NODE_LABELS[2]): "failed"}, "1x5"),
         _series("kube_node_labels", {"node": "n2", alerts.ksm_label(alerts.KSM_NODE_LABELS[2]): "success"}, "1x5")],
        "3m", [{"node": "n1", alerts.ksm_label(alerts.KSM_NODE_LABELS[2]): "failed", "severity": "critical"}]),
    "NvidiaGpuAllocatableDropped": (
        [_series("kube_node_status_allocatable", {"node": "n1", "resource": "nvidia_com_gpu"}, "8x20 7x30"),
         _series("kube_node_status_allocatable", {"node": "n2", "resource": "nvidia_com_gpu"}, "0x50"),
         _series("kube_node_status_allocatable", {"node": "n1", "resource": "cpu"}, "96x20 90x30")],
        "40m", [{"node": "n1", "resource": "nvidia_com_gpu", "severity": "warning"}]),
}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    promtool = required_bin("promtool") / "promtool"
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_every_alert_has_a_case() -> None:
    assert sorted(CASES) == sorted(a.name for a in alerts.gpu_alerts())


def test_promtool_accepts_the_rules_with_their_templates(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": alerts.rule_groups()}))
    done = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_alert_fires_on_its_series_and_not_on_its_near_misses(tmp_path: Path) -> None:
    # promtool compares annotations too; the templates are checked above, the firing here.
    groups: list[dict[str, Any]] = alerts.rule_groups()
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = [{"interval": "1m", "input_series": series,
              "alert_rule_test": [{"alertname": name, "eval_time": at,
                                   "exp_alerts": [{"exp_labels": labels} for labels in expected]}]}
             for name, (series, at, expected) in CASES.items()]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                         "tests": tests}))
    done = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_runbook_section_that_quotes_its_annotation() -> None:
    """``## <alert>`` in the runbooks page (its anchor, ``#<alert in lower case>``, is what links point at), and
    under it the rule's own ``runbook`` text, so the page and what a receiver shows say the same."""
    page = (REPO / "docs" / "operations" / "runbooks.md").read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", page, flags=re.MULTILINE | re.DOTALL))
    names = [a.name for a in alerts.gpu_alerts()]
    assert sorted(sections) == sorted(names), "one section per alert, and none for an alert that is gone"
    flat = {name: " ".join(text.split()) for name, text in sections.items()}
    unquoted = [a.name for a in alerts.gpu_alerts() if " ".join(a.runbook.split()) not in flat[a.name]]
    assert not unquoted, f"runbook sections that do not quote the rule's runbook annotation: {unquoted}"
