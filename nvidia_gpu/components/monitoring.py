"""``GpuMonitoring``: GPU metrics for the whole stack (``cluster.monitoring``).

Children: the exporters' ServiceAccount and counters ConfigMap, one exporter DaemonSet per node group
(the agent's or NVIDIA's dcgm-exporter), and, as the scrape mode says, a headless Service and a
ServiceMonitor per target, or a PodMonitor per target (the exporters and every agent serving
``/metrics``: device plugins, DRA plugins, the MIG manager, node setup's monitor), the
PrometheusRule with the GPU alerts, and the dashboard ConfigMaps. See
:mod:`nvidia_gpu.components.manifests.monitoring` for what each object carries and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from nvgpu.stackconfig import Cluster, GroupPlan, MetricsExporter, NodeGroup, ScrapeMode
from nvidia_gpu.components import inputs
from nvidia_gpu.components.manifests import alerts, dashboards
from nvidia_gpu.components.manifests import monitoring as manifests
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvidia_gpu.components.platform import PlatformRefs
from nvidia_gpu.components.register import register as register_object
from nvidia_gpu.components.register import register_config_map

TYPE = "nvidia-gpu:index:GpuMonitoring"


@dataclass(frozen=True, kw_only=True)
class GpuMonitoringArgs:
    platform: PlatformRefs
    #: Every node group of the stack: one exporter DaemonSet each.
    groups: Sequence[NodeGroup]
    cluster: Cluster | None = None
    #: What the exporters wait for (the groups' node setup, so their pods meet a prepared node).
    depends_on: Sequence[pulumi.Resource] = ()
    settings: Cluster = field(init=False, repr=False)
    #: What the stack decided for each group, by name (:class:`~nvgpu.stackconfig.GroupPlan`).
    plans: dict[str, GroupPlan] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        settings = self.cluster or self.platform.cluster
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "plans", {g.name: GroupPlan.of(settings, g) for g in self.groups})


class GpuMonitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuMonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        cluster, refs = args.settings, args.platform
        monitoring = cluster.monitoring
        ns = refs.namespace

        def register(suffix: str, manifest: dict[str, Any], *deps: pulumi.Resource) -> pulumi.CustomResource:
            # A ConfigMap's content is an in-place update whatever the provider (see register_config_map).
            how = register_config_map if manifest["kind"] == "ConfigMap" else register_object
            return how(f"{name}-{suffix}",
                       inputs.with_labels(manifest, refs.extra_labels, "GpuPlatformArgs.extra_labels"),
                       pulumi.ResourceOptions(parent=self, depends_on=[*refs.needs_namespace(), *deps]))

        self.exporters: list[pulumi.CustomResource] = []
        self.scrape_objects: list[pulumi.CustomResource] = []
        self.rules: pulumi.CustomResource | None = None
        self.dashboards: list[pulumi.CustomResource] = []
        exporter = monitoring.exporter if monitoring.enabled else MetricsExporter.NONE
        if exporter is not MetricsExporter.NONE:
            sa = register("exporter-sa", manifests.service_account(ns))
            counters = register("counters", manifests.counters_config_map(ns, monitoring))
            for group in args.groups:
                ctx = GroupContext(namespace=ns, cluster=cluster, group=group, plan=args.plans[group.name])
                self.exporters.append(register(f"{group.name}-exporter", manifests.exporter_daemonset(ctx), sa,
                                               counters, *args.depends_on))
        if monitoring.operator:
            for target in manifests.targets(cluster, args.groups, args.plans):
                deps: list[pulumi.CustomResource] = []
                if monitoring.scrape is ScrapeMode.SERVICE_MONITOR:
                    deps.append(register(f"{target.component}-metrics-service", manifests.service(ns, target)))
                    self.scrape_objects.extend(deps)
                self.scrape_objects.append(register(f"{target.component}-monitor",
                                                    manifests.monitor(ns, cluster, target), *deps))
        if monitoring.rules:
            self.rules = register("alerts", manifests.prometheus_rule(ns, cluster, alerts.rule_groups()))
        if monitoring.enabled and monitoring.dashboards.enabled:
            for board, text in (("dcgm-exporter", dashboards.nvidia_dashboard_text()),
                                ("fleet", dashboards.fleet_dashboard_text())):
                self.dashboards.append(register(f"dashboard-{board}",
                                                manifests.dashboard_config_map(ns, monitoring, board, text)))
        self.register_outputs({
            "exporter": exporter.value,
            "scrape": monitoring.scrape.value if monitoring.enabled else None,
            "alerts": self.rules is not None,
            "dashboards": len(self.dashboards),
        })
