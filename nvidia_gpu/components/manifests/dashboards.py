"""The Grafana dashboards the stack ships: NVIDIA's dcgm-exporter dashboard unchanged, and its own.

NVIDIA's shows each GPU's telemetry. What a platform team also asks, and it does not show, is the fleet
by the stack's own terms: GPUs and how many are held per node group (the ``node_group`` label the scrape
objects copy from the pod), each group's sharing and allocation
mode (``nvidia_gpu_node_info``, which the agent exporter serves from its ``--info`` flags), the MIG layout
(MIG devices per profile, from the framebuffer series the exporters serve per instance), health (lost
GPUs, XIDs by class, ECC and row remapping) and what kubelet offers (kube-state-metrics' allocatable).
Every query of the stack's dashboard names a metric the agent exporter serves or kube-state-metrics
exports (tests/node_agent/exporter/test_exporter.py checks the agent's against a live scrape).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nvgpu import dcgmcounters

NVIDIA_DASHBOARD_FILE = dcgmcounters.DATA_DIR / "dcgm-exporter-dashboard.json"
UID = "nvidia-gpu-fleet"


def nvidia_dashboard_text() -> str:
    """NVIDIA's dashboard, byte for byte (users compare it with the one they import from NVIDIA)."""
    return NVIDIA_DASHBOARD_FILE.read_text()


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | table | stat
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    width: int = 12


PANELS = (
    Panel("GPUs per node group", "stat",
          (("count by (node_group) (DCGM_FI_DEV_GPU_TEMP)", "{{node_group}}"),), width=8),
    Panel("GPUs held by a pod, per node group", "timeseries",
          (("count by (node_group) (count by (node_group, Hostname, gpu) (nvidia_gpu_device_holder))",
            "{{node_group}}"),), width=16),
    Panel("Sharing and allocation mode per node group", "table",
          (("count by (node_group, sharing, allocation_mode) (nvidia_gpu_node_info)", ""),), width=12),
    Panel("MIG devices per profile", "table",
          (('count by (Hostname, GPU_I_PROFILE) (DCGM_FI_DEV_FB_USED{GPU_I_PROFILE!=""})', ""),), width=12),
    Panel("GPU health", "timeseries",
          (('sum by (Hostname) (nvidia_gpu_exporter_gpus{state="lost"})', "lost on {{Hostname}}"),
           ("sum by (Hostname, class) (increase(nvidia_gpu_xid_errors_total[1h]))", "{{class}} XIDs on {{Hostname}}"),
           ("sum by (Hostname) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1h]))", "uncorrectable ECC on {{Hostname}}"),
           ("sum by (Hostname) (DCGM_FI_DEV_ROW_REMAP_FAILURE)", "row remap failed on {{Hostname}}")), width=24),
    Panel("Allocatable GPU resources per node (kubelet)", "timeseries",
          (('sum by (node, resource) (kube_node_status_allocatable{resource=~"nvidia_com_.+"})',
            "{{resource}} on {{node}}"),), width=24),
    Panel("Framebuffer used per pod", "timeseries",
          (('sum by (namespace, pod) (DCGM_FI_DEV_FB_USED{pod!=""})', "{{namespace}}/{{pod}}"),), unit="decmbytes",
          width=24),
)


def _panel(index: int, panel: Panel, x: int, y: int) -> dict[str, Any]:
    targets = [{"datasource": {"type": "prometheus", "uid": "$datasource"}, "expr": expr, "legendFormat": legend,
                "refId": chr(ord("A") + i), **({"format": "table", "instant": True} if panel.kind == "table" else {})}
               for i, (expr, legend) in enumerate(panel.queries)]
    return {
        "id": index + 1,
        "type": panel.kind,
        "title": panel.title,
        "datasource": {"type": "prometheus", "uid": "$datasource"},
        "gridPos": {"x": x, "y": y, "w": panel.width, "h": 8},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": targets,
    }


def fleet_dashboard() -> dict[str, Any]:
    panels, x, y = [], 0, 0
    for i, panel in enumerate(PANELS):
        if x + panel.width > 24:
            x, y = 0, y + 8
        panels.append(_panel(i, panel, x, y))
        x += panel.width
    return {
        "uid": UID,
        "title": "NVIDIA GPU fleet (nvidia-gpu)",
        "tags": ["nvidia-gpu", "gpu"],
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "current": {"text": "Prometheus", "value": "Prometheus"}}]},
        "panels": panels,
    }


def fleet_dashboard_text() -> str:
    return json.dumps(fleet_dashboard(), indent=1) + "\n"


def queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard (panels, nested rows, template variables)."""
    out: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            out.extend(str(t["expr"]) for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(board.get("panels", []))
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query" and var.get("query"):
            out.append(str(var["query"]))
    return out
