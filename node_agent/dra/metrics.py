"""Prometheus metrics of the DRA kubelet plugin.

What a platform team alerts on and what the kubelet's own metrics do not show per driver: whether the
plugin is registered with kubelet (under DRA ``kube_node_status_allocatable`` stays 0, so a plugin that
lost its registration is invisible there), claims prepared and refused (and how long a prepare takes, the
pod start-up cost the plugin adds), the devices this node publishes by health, and failed publications of
the pool. Gauges of state the driver already keeps (registration, devices, prepared claims) are read when
Prometheus scrapes, so they can never drift from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "nvidia_gpu_dra_plugin"
#: Prepare handling time: a CDI spec write and, for shared GPUs, an MPS daemon start (seconds).
PREPARE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class DraMetrics:
    """One registry per plugin process; ``driver`` is the DRA driver name every series carries."""

    def __init__(self, driver: str, registry: CollectorRegistry | None = None) -> None:
        self.driver = driver
        self.registry = registry or CollectorRegistry()
        r = self.registry
        labels = ["driver"]
        self._registered = Gauge(f"{NAMESPACE}_registered", "1 while kubelet has accepted the plugin's registration.",
                                 labels, registry=r)
        self._registrations = Counter(f"{NAMESPACE}_registrations_total",
                                      "Registration outcomes kubelet reported (NotifyRegistrationStatus).",
                                      [*labels, "result"], registry=r)
        self._prepares = Counter(f"{NAMESPACE}_prepares_total", "Claims prepared, by result.",
                                 [*labels, "result"], registry=r)
        self._unprepares = Counter(f"{NAMESPACE}_unprepares_total", "Claims unprepared, by result.",
                                   [*labels, "result"], registry=r)
        self._prepare_seconds = Histogram(f"{NAMESPACE}_prepare_duration_seconds",
                                          "Time to prepare one claim (claim read, CDI spec, sharing).", labels,
                                          registry=r, buckets=PREPARE_BUCKETS)
        self._publications = Counter(f"{NAMESPACE}_slice_publications_total",
                                     "Publications of this node's ResourceSlices, by result.", [*labels, "result"],
                                     registry=r)
        self._devices = Gauge(f"{NAMESPACE}_devices", "Devices in this node's published pool, by health.",
                              [*labels, "health"], registry=r)
        self._prepared = Gauge(f"{NAMESPACE}_prepared_claims", "Claims prepared on this node (the checkpoint).",
                               labels, registry=r)
        self._heartbeat = Gauge(f"{NAMESPACE}_inventory_heartbeat_seconds",
                                "Unix time of the inventory loop's last pass.", labels, registry=r)
        for result in ("ok", "error"):
            self._prepares.labels(driver, result)
            self._unprepares.labels(driver, result)
            self._publications.labels(driver, result)

    # -- read at scrape time ---------------------------------------------------------------------------
    def watch_registration(self, registered: Callable[[], bool]) -> None:
        self._registered.labels(self.driver).set_function(lambda: 1.0 if registered() else 0.0)

    def watch_devices(self, by_health: Callable[[], Mapping[str, int]]) -> None:
        """``by_health`` answers device counts per health (``Healthy``/``Unhealthy``) at each scrape."""
        def count(health: str) -> Callable[[], float]:
            return lambda: float(by_health().get(health, 0))

        for health in ("Healthy", "Unhealthy"):
            self._devices.labels(self.driver, health).set_function(count(health))

    def watch_prepared(self, count: Callable[[], int]) -> None:
        self._prepared.labels(self.driver).set_function(lambda: float(count()))

    # -- events ----------------------------------------------------------------------------------------
    def registration(self, ok: bool) -> None:
        self._registrations.labels(self.driver, "ok" if ok else "error").inc()

    @contextmanager
    def timed_prepare(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._prepare_seconds.labels(self.driver).observe(time.perf_counter() - started)

    def prepared(self, ok: bool) -> None:
        self._prepares.labels(self.driver, "ok" if ok else "error").inc()

    def unprepared(self, ok: bool) -> None:
        self._unprepares.labels(self.driver, "ok" if ok else "error").inc()

    def published(self, ok: bool) -> None:
        self._publications.labels(self.driver, "ok" if ok else "error").inc()

    def inventory_pass(self) -> None:
        self._heartbeat.labels(self.driver).set(time.time())
