"""Node setup's monitor: ``check`` again at an interval, its verdict and findings as Prometheus metrics.

Setup runs once, in the setup pod's init container; what it checked can change afterwards (the driver
is unloaded or upgraded without a reboot, a device node disappears, containerd's config is rewritten by
someone else). The setup pod's main container, which only held the pod for its ``preStop`` teardown,
runs this instead: the same read-only check (``node_agent.setup.check``, never recording a verdict, so
what bashible and setup read is not changed behind them), every ``interval`` seconds, served on the
agent's status endpoint:

* ``nvidia_gpu_node_check_verdict{verdict}``: 1 for the last verdict (``ok``, ``no-gpu``, ``unusable``);
* ``nvidia_gpu_node_check_failing{reason}``: 1 for each reason code of the last run's findings;
* ``nvidia_gpu_node_check_runs_total``, ``..._last_run_timestamp_seconds``, ``..._duration_seconds``;
* ``nvidia_gpu_node_driver_info{version}``: the loaded driver the last run saw.

A check that raises (it should not: it reports what it cannot read as findings) counts as a failed run
and keeps the previous verdict, so one bad read never flips an alert.

With ``publish`` (node setup's pod: its node's name and token), a verdict or reasons that changed are
also written on the Node as its check labels (``nvgpu.labels.check_labels``), so ``kubectl get nodes``
and the GPU inventory objects show a driver that no longer matches the declaration; a write the API
server refuses is tried again after the next run.

The same monitor runs beside NVIDIA's driver container in every driver pod the stack deploys
(``--phase host --ready-when-usable``): there ``/readyz`` answers only while the last check found the
node usable with the driver that pod's template declares, so the pod is Ready, and the driver upgrade
validated, only once our check agrees (a driver DaemonSet's template always carries the current
declaration, where node setup's ``OnDelete`` pod keeps the one it started with).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from node_agent.kube.errors import KubeError
from node_agent.setup.check import CheckReport
from nvgpu import labels
from nvgpu.nodescripts.facts import Reason, Verdict

log = logging.getLogger(__name__)

NAMESPACE = "nvidia_gpu_node_check"
DEFAULT_INTERVAL_S = 300.0


class CheckMonitor:
    def __init__(self, check: Callable[[], CheckReport], registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time,
                 publish: Callable[[dict[str, str | None]], None] | None = None) -> None:
        self._check = check
        self._clock = clock
        self._publish = publish
        self._published: dict[str, str | None] | None = None
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._verdict = Gauge(f"{NAMESPACE}_verdict", "1 for the verdict of the node's last check.", ["verdict"],
                              registry=r)
        self._failing = Gauge(f"{NAMESPACE}_failing", "1 for each reason the last check found.", ["reason"],
                              registry=r)
        self._runs = Counter(f"{NAMESPACE}_runs_total", "Checks run, by result (ok: a verdict was reached).",
                             ["result"], registry=r)
        self._last = Gauge(f"{NAMESPACE}_last_run_timestamp_seconds", "Unix time of the last check with a verdict.",
                           registry=r)
        self._seconds = Gauge(f"{NAMESPACE}_duration_seconds", "How long the last check took.", registry=r)
        self._driver = Gauge("nvidia_gpu_node_driver_info", "The loaded NVIDIA driver the last check saw.",
                             ["version"], registry=r)
        self._driver_seen: str | None = None
        self.last: CheckReport | None = None
        for result in ("ok", "error"):
            self._runs.labels(result)

    def run_once(self) -> CheckReport | None:
        started = time.perf_counter()
        try:
            report = self._check()
        except Exception:
            log.exception("event=check-crashed")
            self._runs.labels("error").inc()
            return None
        self._seconds.set(time.perf_counter() - started)
        self._runs.labels("ok").inc()
        self._last.set(self._clock())
        for verdict in Verdict:
            self._verdict.labels(verdict.value).set(1.0 if report.verdict is verdict else 0.0)
        found = {f.reason for f in report.findings}
        for reason in Reason:
            self._failing.labels(reason.value).set(1.0 if reason in found else 0.0)
        if self._driver_seen is not None and self._driver_seen != report.driver_version:
            self._driver.remove(self._driver_seen)
        if report.driver_version:
            self._driver.labels(report.driver_version).set(1.0)
        self._driver_seen = report.driver_version
        if self.last is not None and self.last.verdict is not report.verdict:
            log.warning("event=check-verdict-changed from=%s to=%s reasons=%s", self.last.verdict.value,
                        report.verdict.value, ",".join(report.reasons))
        self.last = report
        self._publish_labels(report)
        return report

    def _publish_labels(self, report: CheckReport) -> None:
        if self._publish is None:
            return
        wanted = labels.check_labels(report.verdict.value, report.reasons)
        if wanted == self._published:
            return
        try:
            self._publish(wanted)
        except KubeError as e:
            log.warning("event=check-labels-not-written error=%s", e)
            return
        self._published = wanted

    def run(self, stop: threading.Event, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        """Check now, then every ``interval_s`` until ``stop`` is set."""
        self.run_once()
        while not stop.wait(interval_s):
            self.run_once()

    def live(self) -> bool:
        return self.last is not None

    def usable(self) -> bool:
        """The last check reached a verdict, and it was ``ok``."""
        return self.last is not None and self.last.verdict is Verdict.OK
