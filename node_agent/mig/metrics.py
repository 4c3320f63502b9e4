"""Prometheus metrics of the MIG manager.

The node's ``nvidia.com/mig.config.state`` label already says ``pending``/``success``/``failed`` (what the
stack's alert reads through kube-state-metrics); these add what a label cannot: how many
reconfigurations finished and how, how long the last one took (drain, clients, GPU changes: the time the
node's GPUs were out of service), the phase an unfinished one is in and for how long, and steps that
failed and are being retried. The phase is read from the journal at scrape time, so it is the journal's
word, whichever manager process wrote it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from node_agent.mig.journal import Journal, Outcome, Phase
from node_agent.mig.machine import Act

NAMESPACE = "nvidia_gpu_mig_manager"


class MigMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        r = self.registry
        self._reconfigurations = Counter(f"{NAMESPACE}_reconfigurations_total",
                                         "Reconfigurations finished, by outcome (success, failed, aborted).",
                                         ["outcome"], registry=r)
        self._last_seconds = Gauge(f"{NAMESPACE}_last_reconfiguration_duration_seconds",
                                   "From the start of the last finished reconfiguration to its end.", ["outcome"],
                                   registry=r)
        self._actions = Counter(f"{NAMESPACE}_actions_total", "Steps taken, by action.", ["action"], registry=r)
        self._step_failures = Counter(f"{NAMESPACE}_step_failures_total",
                                      "Steps that failed and are retried (API server, NVML, journal).", registry=r)
        self._phase = Gauge(f"{NAMESPACE}_phase", "1 for the phase of the reconfiguration in flight.", ["phase"],
                            registry=r)
        self._phase_seconds = Gauge(f"{NAMESPACE}_phase_duration_seconds",
                                    "How long the reconfiguration in flight has been in its phase (0: none).",
                                    registry=r)
        self._heartbeat = Gauge(f"{NAMESPACE}_loop_heartbeat_seconds", "Unix time of the loop's last round.",
                                registry=r)
        for outcome in Outcome:
            self._reconfigurations.labels(outcome.value)

    def watch_journal(self, peek: Callable[[], Journal | None], age: Callable[[Journal], float] | None = None) -> None:
        """Read the journal at each scrape: the phase in flight (every phase 0 when idle) and its age, by
        ``age`` (the manager's: the monotonic clock, which a wall-clock step does not move) or else the
        wall clock since the journal's ``phase_since``."""
        def in_phase(phase: Phase) -> Callable[[], float]:
            return lambda: 1.0 if (j := peek()) is not None and j.phase is phase else 0.0

        def phase_seconds() -> float:
            j = peek()
            if j is None:
                return 0.0
            return age(j) if age is not None else max(self._clock() - j.phase_since, 0.0)

        for phase in Phase:
            self._phase.labels(phase.value).set_function(in_phase(phase))
        self._phase_seconds.set_function(phase_seconds)

    def action(self, act: Act) -> None:
        self._actions.labels(act.value).inc()

    def step_failed(self) -> None:
        self._step_failures.inc()

    def finished(self, journal: Journal) -> None:
        """The node was given back after ``journal``'s reconfiguration (its outcome is recorded)."""
        if journal.outcome is None:
            return
        self._reconfigurations.labels(journal.outcome.value).inc()
        self._last_seconds.labels(journal.outcome.value).set(max(self._clock() - journal.started_at, 0.0))

    def round(self) -> None:
        self._heartbeat.set(self._clock())
