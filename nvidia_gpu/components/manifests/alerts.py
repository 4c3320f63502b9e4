"""The stack's GPU alerts, as PrometheusRule groups; each is tested with ``promtool test rules`` over synthetic
series (tests/nvidia_gpu/components/test_alerts.py) and has a runbook section in docs/operations/runbooks.md.

The GPU alerts read dcgm-exporter's names, so they fire the same under either exporter; where the two
count XIDs differently the expression takes both (``nvidia_gpu_xid_errors_total`` from the agent,
``DCGM_EXP_XID_ERRORS_COUNT`` from dcgm-exporter). ``Hostname`` (the node, set by both exporters) keys the
per-node alerts. The node alerts read kube-state-metrics: ``kube_node_status_allocatable`` as it is, and
``kube_node_labels`` for the labels named in :data:`KSM_NODE_LABELS`, which its
``--metric-labels-allowlist`` must list (docs/guides/monitoring.md says how).

NVML's clock event reasons are a bitmask (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``); PromQL has no bitwise
operators, so a bit is tested as ``floor(x / 2^n) % 2 == 1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nvgpu import labels as names
from nvidia_gpu.components.manifests.monitoring import JOBS

#: XIDs an application causes (the GPU is fine), as ``node_agent.nvml.xid`` classes them.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
#: Node labels the alerts read through kube-state-metrics' ``kube_node_labels``.
KSM_NODE_LABELS = (names.NODE_GROUP, "nvidia.com/gpu.count", names.MIG_CONFIG_STATE)

_HW_SLOWDOWN = 3  # 0x08: HW slowdown (power brake or thermal, by the board)
_SW_THERMAL = 5  # 0x20
_HW_THERMAL = 6  # 0x40
_HW_POWER_BRAKE = 7  # 0x80


def ksm_label(key: str) -> str:
    """kube-state-metrics' name for a node label: ``label_`` and the key with every other character as ``_``."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _bit(n: int) -> str:
    return f"floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / {2 ** n}) % 2 == 1"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    severity: str
    summary: str
    description: str
    #: What to do (its section in docs/operations/runbooks.md quotes it).
    runbook: str
    for_: str = "0m"
    extra_labels: dict[str, str] = field(default_factory=dict)

    def rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.extra_labels}
        out["annotations"] = {"summary": self.summary, "description": self.description, "runbook": self.runbook}
        return out


def _app_xids() -> str:
    return "|".join(str(x) for x in APPLICATION_XIDS)


def gpu_alerts() -> list[Alert]:
    node_group, gpu_count, mig_state = (ksm_label(k) for k in KSM_NODE_LABELS)
    return [
        Alert("NvidiaGpuFellOffTheBus",
              'nvidia_gpu_exporter_gpus{state="lost"} > 0'
              ' or sum by (Hostname, gpu, UUID) (increase(nvidia_gpu_xid_errors_total{xid="79"}[15m])) > 0'
              ' or DCGM_FI_DEV_XID_ERRORS == 79',
              "critical", "A GPU on {{ $labels.Hostname }} fell off the bus",
              "NVML reports a GPU lost, or XID 79: the GPU no longer answers on PCIe.",
              "Drain the node and power-cycle it (a GPU reset is not enough); if it recurs, the board, riser "
              "or power is at fault."),
        Alert("NvidiaGpuMissing",
              "count by (Hostname) (DCGM_FI_DEV_GPU_TEMP)"
              " < max_over_time(count by (Hostname) (DCGM_FI_DEV_GPU_TEMP)[6h:5m])",
              "critical", "{{ $labels.Hostname }} serves metrics for fewer GPUs than it did",
              "{{ $value }} GPU(s) report now, fewer than in the last 6 hours.",
              "Run `python -m node_agent check` on the node and compare `nvidia-smi -L` with the model's "
              "GPU count; a GPU NVML no longer lists needs a power cycle.", for_="5m"),
        Alert("NvidiaGpuXidError",
              f'sum by (Hostname, gpu, UUID, xid) (increase(nvidia_gpu_xid_errors_total{{class="device"}}[10m])) > 0'
              f' or sum by (Hostname, gpu, UUID, xid) (DCGM_EXP_XID_ERRORS_COUNT{{xid!~"{_app_xids()}"}}) > 0',
              "critical", "XID {{ $labels.xid }} on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}",
              "The driver raised an XID that NVIDIA's XID catalogue treats as a GPU or driver fault.",
              "Look the XID up in NVIDIA's XID catalogue; the device plugin has already marked the GPU "
              "unhealthy. Drain the node, reset the GPU (`nvidia-smi -r`) or reboot, then check ECC and row "
              "remapping."),
        Alert("NvidiaGpuApplicationXids",
              f'sum by (Hostname, gpu, UUID) (increase(nvidia_gpu_xid_errors_total{{class="application"}}[1h])) >= 5'
              f' or sum by (Hostname, gpu, UUID) (DCGM_EXP_XID_ERRORS_COUNT{{xid=~"{_app_xids()}"}}) >= 5',
              "warning", "Repeated application XIDs on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}",
              "{{ $value }} application XIDs (illegal memory access, page faults, resets of a channel) in an "
              "hour: a workload keeps crashing on this GPU.",
              "Find the pod with the `pod` label of DCGM_FI_DEV_GPU_UTIL on that GPU; the GPU itself is fine."),
        Alert("NvidiaGpuUncorrectableEccErrors",
              "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0",
              "critical", "Uncorrectable ECC errors on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}",
              "Double-bit ECC errors since the last driver load: the memory they hit is lost to its process.",
              "Drain the node and reset the GPU so that row remapping takes effect; a GPU that keeps reporting "
              "them, or whose remapping fails, is due for replacement."),
        Alert("NvidiaGpuRowRemapFailure",
              "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
              "critical", "Row remapping failed on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}",
              "The GPU has no spare rows left for a failing memory row.",
              "Take the node out of service (cordon) and replace the GPU: its memory can no longer be repaired."),
        Alert("NvidiaGpuRowRemapPending",
              "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[1h]) > 0",
              "warning", "GPU {{ $labels.gpu }} of {{ $labels.Hostname }} remapped rows after uncorrectable errors",
              "New rows were remapped; the remapping takes effect at the next GPU reset.",
              "Drain the node and reset the GPU (or reboot) at the next opportunity."),
        Alert("NvidiaGpuThermalThrottling",
              f"({_bit(_SW_THERMAL)}) or ({_bit(_HW_THERMAL)})",
              "warning", "GPU {{ $labels.gpu }} of {{ $labels.Hostname }} is slowed down by heat",
              "The driver lowers the clocks for temperature (thermal slowdown); jobs run slower.",
              "Check the node's cooling (fans, airflow, inlet temperature) and DCGM_FI_DEV_GPU_TEMP.",
              for_="10m"),
        Alert("NvidiaGpuPowerThrottling",
              f"({_bit(_HW_POWER_BRAKE)}) or ({_bit(_HW_SLOWDOWN)})",
              "warning", "GPU {{ $labels.gpu }} of {{ $labels.Hostname }} is slowed down by the board",
              "Hardware slowdown or power brake: the board or the chassis asks the GPU to draw less.",
              "Check the power supplies and the chassis' power-brake signal; see DCGM_FI_DEV_POWER_USAGE.",
              for_="10m"),
        Alert("NvidiaGpuDevicePluginNotRegistered",
              "nvidia_gpu_device_plugin_registered == 0",
              "critical", "The device plugin on {{ $labels.node }} is not registered for {{ $labels.resource }}",
              "kubelet does not know the resource: no new pod can get these GPUs on this node.",
              "Read the device-plugin pod's log on the node; kubelet's restart removes the registration and the "
              "plugin re-registers within seconds, so a lasting one points at kubelet's device-plugins directory.",
              for_="5m"),
        Alert("NvidiaGpuDraPluginNotRegistered",
              "nvidia_gpu_dra_plugin_registered == 0",
              "critical", "The DRA plugin {{ $labels.driver }} on {{ $labels.node }} is not registered with kubelet",
              "kubelet cannot prepare claims for this driver on the node: pods allocated its devices stay in "
              "ContainerCreating. (Under DRA allocatable stays 0, so only this metric shows it.)",
              "Read the dra-kubelet-plugin pod's log on the node and kubelet's log for the driver name; "
              "kubelet's plugins_registry directory must be the one the DaemonSet mounts.", for_="5m"),
        Alert("NvidiaGpuNodeCheckFailing",
              'nvidia_gpu_node_check_verdict{verdict="unusable"} == 1',
              "critical", "GPU node {{ $labels.node }} no longer passes its check",
              "Node setup's monitor re-ran the check after setup and the node's GPUs can no longer be offered "
              "to pods (driver unloaded or changed, a device node gone, the runtime config rewritten).",
              "`nvidia_gpu_node_check_failing == 1` on the node names the reasons; run `python -m node_agent "
              "check` there for the messages, fix the host, then delete the node's gpu-setup pod to set it up "
              "again.", for_="10m"),
        Alert("NvidiaGpuMigReconfigurationStuck",
              "nvidia_gpu_mig_manager_phase_duration_seconds > 3600",
              "warning", "A MIG reconfiguration on {{ $labels.node }} has been in one phase for over an hour",
              "The MIG manager is waiting: for Deckhouse's disruption approval, a drain, or GPU clients to exit "
              "(`nvidia_gpu_mig_manager_phase == 1` names the phase).",
              "Approval: approve the node's disruption in Deckhouse. Draining or clients: find the pods still on "
              "the node's GPUs (`kubectl get pods --field-selector spec.nodeName=<node>`) and let them finish "
              "or delete them.", for_="5m"),
        Alert("NvidiaGpuMetricsTargetDown",
              f'up{{job=~"{"|".join(JOBS)}"}} == 0',
              "warning", "{{ $labels.job }} on {{ $labels.node }} cannot be scraped",
              "Prometheus cannot read the target: its pod is down or its port unreachable.",
              "Check the pod on that node (`kubectl get pods -o wide` in the stack's namespace) and its log.",
              for_="10m"),
        Alert("NvidiaGpuNodeSetupIncomplete",
              f'kube_node_labels{{{node_group}!=""}} unless on (node) kube_node_labels{{{gpu_count}!=""}}',
              "warning", "GPU node {{ $labels.node }} has no GPU labels after 30 minutes",
              "The labeller labels a node only behind node setup's gpu-setup-complete gate: setup has not "
              "finished (or the labeller cannot run).",
              "On Deckhouse read bashible's log for the gpu-* steps; elsewhere `kubectl logs -c gpu-setup` of the "
              "node's gpu-setup pod. `python -m node_agent check` on the node names what is missing.",
              for_="30m"),
        Alert("NvidiaGpuMigReconfigurationFailed",
              f'kube_node_labels{{{mig_state}="failed"}}',
              "critical", "MIG reconfiguration failed on {{ $labels.node }}",
              "The MIG manager could not apply the requested layout and rolled back; the node kept its layout.",
              "Read the MIG manager's log on the node; fix the layout (mig.partedConfig) or free the GPUs, then "
              "relabel nvidia.com/mig.config to retry.", for_="1m"),
        Alert("NvidiaGpuAllocatableDropped",
              'sum by (node, resource) (kube_node_status_allocatable{resource=~"nvidia_com_.+"})'
              ' < max_over_time(sum by (node, resource) (kube_node_status_allocatable{resource=~"nvidia_com_.+"})'
              "[6h:5m])",
              "warning", "{{ $labels.node }} offers fewer {{ $labels.resource }} than it did",
              "Allocatable {{ $labels.resource }} fell ({{ $value }} now): GPUs went unhealthy, a MIG layout "
              "changed or the device plugin lost its registration. (Under DRA allocatable stays 0.)",
              "Compare `kubectl get gpus -l` for the node (health, MIG) with the device plugin's log.",
              for_="10m"),
    ]


def rule_groups() -> list[dict[str, Any]]:
    return [{"name": "nvidia-gpu", "rules": [a.rule() for a in gpu_alerts()]}]
