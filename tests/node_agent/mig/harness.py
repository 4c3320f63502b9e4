"""Wiring of a MigManager over the fakes, shared by the executor, crash and bench-style tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from node_agent.mig.executor import MigManager, Settings
from node_agent.mig.journal import JournalStore
from node_agent.mig.machine import DrainMode, Timeouts
from nvgpu import labels
from nvgpu.migparted import MigPartedConfig, build_config
from tests.node_agent.mig.fakes import Clock, FakeBackend, FakeNode, MemoryFiles, Rebooter, StepLock

CONFIG = build_config()


def deckhouse_approver(node: FakeNode) -> None:
    """Play Deckhouse's node-manager: approve a required disruption, then drain when asked."""
    if labels.DISRUPTION_REQUIRED in node.annotations and labels.DISRUPTION_APPROVED not in node.annotations:
        node.annotations[labels.DISRUPTION_APPROVED] = ""
    if labels.DRAINING in node.annotations and labels.DRAINED not in node.annotations:
        node.unschedulable = True
        node.pods = [p for p in node.pods if p.daemonset]
        node.annotations[labels.DRAINED] = node.annotations[labels.DRAINING]


def clients_leave(node: FakeNode) -> None:
    """Play the DaemonSet controller: paused deploy labels make the GPU agents' pods go."""
    node.pods = [p for p in node.pods if not any(k.startswith(labels.GPU_DEPLOY_PREFIX) for k in p.selector_keys)]


@dataclass
class Rig:
    backend: FakeBackend
    node: FakeNode = field(default_factory=FakeNode)
    files: MemoryFiles = field(default_factory=MemoryFiles)
    lock: StepLock = field(default_factory=StepLock)
    clock: Clock = field(default_factory=Clock)
    rebooter: Rebooter = field(default_factory=Rebooter)
    boot: list[str] = field(default_factory=lambda: ["boot-1"])
    config: MigPartedConfig = CONFIG
    drain: DrainMode = DrainMode.DECKHOUSE
    allow_reboot: bool = False
    timeouts: Timeouts = field(default_factory=Timeouts)

    def manager(self, registry: CollectorRegistry | None = None) -> MigManager:
        """A fresh manager process over the same node, host and GPUs (what a pod restart gives)."""
        return MigManager(
            node=self.node,
            backend=self.backend,
            load_config=lambda: self.config,
            files=self.files,
            step_lock=self.lock,
            boot_id=lambda: self.boot[0],
            clock=self.clock,
            monotonic=self.clock.monotonic,
            rebooter=self.rebooter,
            settings=Settings(drain=self.drain, allow_reboot=self.allow_reboot, timeouts=self.timeouts,
                              max_steps=64),
            registry=registry,
        )

    @property
    def journal(self) -> JournalStore:
        return JournalStore(self.files)

    def converge(self, rounds: int = 20, manager: MigManager | None = None) -> list[str]:
        """Run a manager (a fresh one unless given) round by round, letting the fake cluster react between
        rounds."""
        m = manager or self.manager()
        acts: list[str] = []
        for _ in range(rounds):
            a = m.run_until_blocked()
            acts.extend(x.act.value for x in m.history)
            m.history.clear()
            if a.act.value in ("idle", "exit"):
                return acts
            m._node = None
            self.node.wait_for_change("", 0)
            self.clock.t += 1
        raise AssertionError(f"did not converge: {acts[-10:]}")

    def run_until_reboot(self, rounds: int = 10) -> None:
        """Run a manager round by round until it asks for a reboot (or ``rounds`` pass), letting the fake
        cluster react between rounds; the test then checks what the reboot request left behind."""
        m = self.manager()
        for _ in range(rounds):
            if m.run_until_blocked().act.value == "reboot":
                return
            self.node.wait_for_change("", 0)
            m._node = None


def mig_node(rig: Rig, config: str, **extra: str) -> Rig:
    rig.node.labels.update({labels.MIG_CONFIG: config, labels.DEVICE_GPU_CONFIG: "MIG",
                            labels.MIG_CAPABLE: "true", **extra})
    rig.node.on_wait = [deckhouse_approver, clients_leave]
    return rig
