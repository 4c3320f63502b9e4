"""Prometheus metrics of the device plugin.

One registry per plugin process (tests create their own): allocations and their failures, health
transitions, devices by health and whether each resource is registered with kubelet. They are served by
the agent's status server (``node_agent.status.server``) with ``/healthz`` (the supervisor loop is alive)
and ``/readyz`` (every resource is registered), which the DaemonSet's probes use.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

NAMESPACE = "nvidia_gpu_device_plugin"


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.allocations = Counter(f"{NAMESPACE}_allocations_total", "Container allocations answered.",
                                   ["resource"], registry=r)
        self.allocated_devices = Counter(f"{NAMESPACE}_allocated_devices_total", "Devices handed to containers.",
                                         ["resource"], registry=r)
        self.allocation_errors = Counter(f"{NAMESPACE}_allocation_errors_total", "Allocate requests rejected.",
                                         ["resource"], registry=r)
        self.allocate_seconds = Histogram(f"{NAMESPACE}_allocate_duration_seconds", "Allocate handling time.",
                                          ["resource"], registry=r,
                                          buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05))
        self.preferred = Counter(f"{NAMESPACE}_preferred_allocations_total", "Preferred allocations answered.",
                                 ["resource"], registry=r)
        self.health_transitions = Counter(f"{NAMESPACE}_health_transitions_total", "Device health changes.",
                                          ["device", "to", "reason"], registry=r)
        self.devices = Gauge(f"{NAMESPACE}_devices", "Advertised devices by health.", ["resource", "health"],
                             registry=r)
        self.registered = Gauge(f"{NAMESPACE}_registered", "1 while the resource is registered with kubelet.",
                                ["resource"], registry=r)
        self.registrations = Counter(f"{NAMESPACE}_registrations_total", "Registrations with kubelet.",
                                     ["resource"], registry=r)
        self.restarts = Counter(f"{NAMESPACE}_restarts_total", "Plugin restarts by cause.", ["cause"], registry=r)
        self.heartbeat = Gauge(f"{NAMESPACE}_loop_heartbeat_seconds", "Last supervisor loop pass (monotonic).",
                               registry=r)

    def on_transition(self, uuid: str, healthy: bool, reason: str) -> None:
        self.health_transitions.labels(device=uuid, to="Healthy" if healthy else "Unhealthy", reason=reason).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
