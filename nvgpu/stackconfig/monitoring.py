"""``cluster.monitoring``: who serves the GPU metrics, how Prometheus finds them, alerts and dashboards.

The combinations that would render objects nobody loads (alerts without the Prometheus Operator, a
dcgm-exporter image that never runs) are refused here, at the field to change.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import (
    AfterValidator,
    field_validator,
    model_validator,
)

from nvgpu import dcgmcounters
from nvgpu.k8snames import check_key, check_label_value
from nvgpu.stackconfig.common import (
    Bool,
    ConfigModel,
    Digest,
    DnsLabel,
    Loc,
    PullPolicy,
    Repository,
    Tag,
    image_ref,
    raise_all,
)


class MetricsExporter(StrEnum):
    """Who serves the GPUs' metrics under dcgm-exporter's names."""

    #: The agent image's exporter (NVML; no DCGM on the node; profiling fields not served).
    AGENT = "agent"
    #: NVIDIA's dcgm-exporter image, for DCGM's profiling fields (``cluster.monitoring.dcgm.image``).
    DCGM = "dcgm"
    #: No GPU metrics (the agents' own metrics are still scraped).
    NONE = "none"


class ScrapeMode(StrEnum):
    """How Prometheus finds the targets."""

    SERVICE_MONITOR = "serviceMonitor"
    POD_MONITOR = "podMonitor"
    #: ``prometheus.io/*`` pod annotations only: for scrapers without the Prometheus Operator.
    ANNOTATIONS = "annotations"


_DURATION = re.compile(r"([1-9][0-9]{0,6})(ms|s|m|h)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def _scrape_interval(v: str) -> str:
    m = _DURATION.fullmatch(v)
    if not m:
        raise ValueError("must be a Prometheus duration like 30s or 1m (a whole number and ms, s, m or h)")
    seconds = int(m.group(1)) * _DURATION_SECONDS[m.group(2)]
    if not 1 <= seconds <= 600:
        raise ValueError("must be between 1s and 10m: GPU counters change within seconds, and a longer "
                         "interval leaves the alerts' rate() windows without samples")
    return v


class DcgmExporterImage(ConfigModel):
    """NVIDIA's dcgm-exporter image, pinned by digest (an image with host access is never taken by tag alone)."""

    #: Where NVIDIA's dcgm-exporter image is (``exporter: dcgm``).
    repository: Repository = "nvcr.io/nvidia/k8s/dcgm-exporter"
    #: The release, e.g. ``4.4.1-4.6.0-ubuntu22.04`` (informational: the digest decides).
    tag: Tag | None = None
    #: ``sha256:`` and 64 hex digits: required, the image is pulled by digest.
    digest: Digest
    #: The exporter container's ``imagePullPolicy``.
    pull_policy: PullPolicy = "IfNotPresent"

    @property
    def ref(self) -> str:
        return image_ref(self.repository, self.tag, self.digest)


class DcgmExporterSettings(ConfigModel):
    """NVIDIA's dcgm-exporter, for ``exporter: dcgm``."""

    #: NVIDIA's dcgm-exporter image: required with ``exporter: dcgm``, refused otherwise.
    image: DcgmExporterImage | None = None


class Dashboards(ConfigModel):
    """Grafana dashboards as ConfigMaps for Grafana's dashboard sidecar (NVIDIA's, unchanged, and ours)."""

    #: The dashboard ConfigMaps (NVIDIA's dashboard and the fleet dashboard).
    enabled: Bool = True
    #: The label Grafana's sidecar selects (its ``sidecar.dashboards.label`` and ``labelValue``).
    label: Annotated[str, AfterValidator(check_key)] = "grafana_dashboard"
    #: The value of that label.
    label_value: Annotated[str, AfterValidator(check_label_value)] = "1"
    #: Where the ConfigMaps go (default: the stack's namespace); the sidecar must watch it.
    namespace: DnsLabel | None = None


class Monitoring(ConfigModel):
    """GPU metrics, scrape objects, alerts and dashboards."""

    #: Off: no exporter, scrape objects, alerts or dashboards at all.
    enabled: Bool = True
    #: Who serves the GPU metrics, under dcgm-exporter's names either way.
    exporter: MetricsExporter = MetricsExporter.AGENT
    #: ``annotations`` needs nothing in the cluster; the two monitors need the Prometheus Operator's CRDs.
    scrape: ScrapeMode = ScrapeMode.ANNOTATIONS
    #: How often Prometheus scrapes, a Prometheus duration from 1s to 10m: GPU counters change within seconds, and
    #: a longer interval leaves the alerts' ``rate()`` windows without samples.
    interval: Annotated[str, AfterValidator(_scrape_interval)] = "30s"
    #: A PrometheusRule with the GPU alerts (docs/operations/runbooks.md); default: on wherever the scrape is by the
    #: Prometheus Operator, which is what loads it.
    alerts: Bool | None = None
    #: Labels the cluster's Prometheus selects monitors and rules by (kube-prometheus-stack's
    #: ``release: <name>``, say). On Deckhouse its own (``prometheus: main``) are added.
    labels: dict[Annotated[str, AfterValidator(check_key)], Annotated[str, AfterValidator(check_label_value)]] = {}
    #: The fields to serve, in dcgm-exporter's counters format (default: NVIDIA's default file); one
    #: ConfigMap feeds whichever exporter runs.
    counters: str | None = None
    #: NVIDIA's dcgm-exporter, for ``exporter: dcgm``.
    dcgm: DcgmExporterSettings = DcgmExporterSettings()
    #: The Grafana dashboards.
    dashboards: Dashboards = Dashboards()
    #: What an agent does when another process holds its status port (``/metrics`` and its probes): by
    #: default the device plugin, DRA plugin, MIG manager and node setup's monitor log it, keep doing
    #: their job (the kubelet keeps its GPUs) and bind the port once it is free, their pods NotReady
    #: meanwhile; ``true`` makes them exit instead, so the conflict shows as restarts. The exporter
    #: always needs its port.
    require_status_port: Bool = False

    @field_validator("counters")
    @classmethod
    def _counters(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                dcgmcounters.read(v, "counters")
            except dcgmcounters.CountersError as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _cross(self) -> Monitoring:
        problems: list[tuple[Loc, str]] = []
        if self.exporter is MetricsExporter.DCGM and self.dcgm.image is None:
            problems.append((("dcgm", "image"), "required with exporter 'dcgm': NVIDIA's dcgm-exporter image, "
                                                "pinned by digest (repository, tag, digest)"))
        if self.dcgm.image is not None and self.exporter is not MetricsExporter.DCGM:
            problems.append((("dcgm", "image"), f"set, but exporter is {self.exporter.value!r}: the image would "
                                                "not run (set exporter: dcgm, or remove it)"))
        if self.alerts and self.scrape is ScrapeMode.ANNOTATIONS:
            problems.append((("alerts",), "true needs the Prometheus Operator, which loads the PrometheusRule, but "
                                          "scrape is 'annotations' (a cluster without it): set scrape to "
                                          "serviceMonitor or podMonitor, or alerts: false"))
        if self.labels and self.scrape is ScrapeMode.ANNOTATIONS:
            problems.append((("labels",), "set, but scrape is 'annotations': these labels select monitors and "
                                          "rules of the Prometheus Operator, and none is created"))
        raise_all(problems)
        return self

    @property
    def operator(self) -> bool:
        """Scraped by the Prometheus Operator (monitors, and a PrometheusRule unless alerts is false)."""
        return self.enabled and self.scrape is not ScrapeMode.ANNOTATIONS

    @property
    def rules(self) -> bool:
        return self.operator and self.alerts is not False

    @property
    def counters_text(self) -> str:
        return self.counters if self.counters is not None else dcgmcounters.default_text()

