"""In-memory stand-ins for the MIG manager's three seams: NVML, the Node API and host files.

They implement the same protocols as production (``MigBackend``, ``NodeApi``, ``StateFiles``, ``StepLock``) so the
executor runs unchanged; each records what it was asked to do and can be told to fail, which is how
the crash, NVML-error and bad-node tests are written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from node_agent.kube.errors import ServerError
from node_agent.mig.hardware import GpuInfo, InstanceInfo, MigHardwareError, ResetUnavailable
from node_agent.mig.kube import NodePatch, NodeView, PodView
from nvgpu import catalogue
from nvgpu.catalogue import GpuModel, MigProfile
from nvgpu.taints import NodeTaint


class Crash(BaseException):
    """Simulates the process dying at a given call (not an Exception, so nothing catches it)."""


@dataclass
class FakeGpu:
    info: GpuInfo
    model: GpuModel
    current: bool = False
    pending: bool = False
    instances: list[InstanceInfo] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)


@dataclass
class FakeBackend:
    """A node of identical GPUs; ``reset_needs`` mimics Ampere (a reset applies a mode change)."""

    gpus_: list[FakeGpu]
    reset_needs: bool = True
    reset_blocked: bool = False
    fail_on: dict[str, int] = field(default_factory=dict)  #: op -> fail on the n-th call (1-based)
    crash_on: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, model_key: str, count: int = 8, **kw: object) -> FakeBackend:
        model = catalogue.get_model(model_key)
        gpus = [
            FakeGpu(
                GpuInfo(i, f"GPU-{model_key}-{i:04d}", model.product_names[0], model.pci_device_ids[0],
                        f"00000000:{0x10 + i:02X}:00.0"),
                model,
            )
            for i in range(count)
        ]
        return cls(gpus, **kw)  # type: ignore[arg-type]

    def _tick(self, op: str, detail: str = "") -> None:
        n = self.calls.get(op, 0) + 1
        self.calls[op] = n
        self.log.append(f"{op}{detail}")
        if self.crash_on.get(op) == n:
            raise Crash(f"crash at {op} #{n}")
        if self.fail_on.get(op) == n:
            raise MigHardwareError(f"NVML error in {op}{detail}: Insufficient Resources")

    def gpu(self, index: int) -> FakeGpu:
        return self.gpus_[index]

    def gpus(self) -> Sequence[GpuInfo]:
        return [g.info for g in self.gpus_]

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        g = self.gpu(index)
        return (g.current, g.pending) if g.model.mig else (False, False)

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        self._tick("set_mig_mode", f"({index},{enabled})")
        g = self.gpu(index)
        if g.model.mig is None:
            raise MigHardwareError(f"GPU {index}: MIG not supported")
        if g.current and g.instances:
            raise MigHardwareError(f"GPU {index}: in use by instances")
        g.pending = enabled
        if not self.reset_needs:
            g.current = enabled

    def reset_gpus(self, indices: Sequence[int]) -> None:
        self._tick("reset_gpus", f"({','.join(map(str, indices))})")
        if self.reset_blocked or any(self.gpu(i).processes for i in indices):
            raise ResetUnavailable("GPU reset failed: In use by another client")
        for i in indices:
            g = self.gpu(i)
            g.current = g.pending

    def gpu_instances(self, index: int) -> Sequence[InstanceInfo]:
        return list(self.gpu(index).instances)

    def create_instance(self, index: int, profile: MigProfile, start: int) -> None:
        self._tick("create_instance", f"({index},{profile.name}@{start})")
        g = self.gpu(index)
        if not g.current:
            raise MigHardwareError(f"GPU {index}: MIG disabled")
        used = {s for i in g.instances for s in range(i.start, i.start + i.size)}
        span = set(range(start, start + profile.memory_slices))
        if start not in profile.placement_starts or used & span:
            raise MigHardwareError(f"GPU {index}: placement {start} not available for {profile.name}")
        gi = max((i.gi_id for i in g.instances), default=0) + 1
        g.instances.append(InstanceInfo(gi, profile.profile_id, start, profile.memory_slices))

    def destroy_all_instances(self, index: int) -> None:
        self._tick("destroy_all_instances", f"({index})")
        self.gpu(index).instances.clear()

    def gpu_processes(self, index: int) -> Sequence[int]:
        return list(self.gpu(index).processes)

    def layout(self, index: int) -> dict[str, int]:
        g = self.gpu(index)
        out: dict[str, int] = {}
        assert g.model.mig is not None
        for inst in g.instances:
            name = next(p.name for p in g.model.mig.profiles if p.profile_id == inst.profile_id)
            out[name] = out.get(name, 0) + 1
        return out


@dataclass
class FakeNode:
    """An in-memory Node plus pods, with merge-patch semantics like the API server's."""

    name: str = "gpu-node-0"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: list[NodeTaint] = field(default_factory=list)
    unschedulable: bool = False
    pods: list[PodView] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    calls: int = 0
    version: int = 1
    fail_patches: int = 0  #: fail this many next patches with HTTP 500
    crash_on_patch: int = 0  #: the process dies on the n-th patch (before it lands)
    patches: int = 0
    #: Hook run on every wait: lets a test play Deckhouse (approve, drain) or a user.
    on_wait: list[object] = field(default_factory=list)
    waits_cancelled: bool = False  #: :meth:`cancel_waits` was called (the manager's stop path)

    def view(self) -> NodeView:
        return NodeView(self.name, "uid-1", dict(self.labels), dict(self.annotations), tuple(self.taints),
                        self.unschedulable, str(self.version))

    def read_node(self) -> NodeView:
        self.calls += 1
        return self.view()

    def patch_node(self, patch: NodePatch) -> NodeView:
        # What node_agent.kube.nodeowner.patch refuses on the real API: a key that is not the MIG manager's.
        assert not patch.change().not_owned(), patch.change().not_owned()
        self.calls += 1
        self.patches += 1
        if self.crash_on_patch == self.patches:
            raise Crash(f"crash before patch #{self.patches}")
        if self.fail_patches:
            self.fail_patches -= 1
            raise ServerError("patch node: HTTP 500 Internal Server Error", 500)
        for src, dst in ((patch.labels, self.labels), (patch.annotations, self.annotations)):
            for k, v in src.items():
                if v is None:
                    dst.pop(k, None)
                else:
                    dst[k] = v
        if patch.taints is not None:
            self.taints = list(patch.taints)
        if patch.unschedulable is not None:
            self.unschedulable = patch.unschedulable
        self.version += 1
        return self.view()

    def pods_on_node(self) -> tuple[PodView, ...]:
        self.calls += 1
        return tuple(self.pods)

    def evict(self, namespace: str, name: str) -> None:
        self.calls += 1
        self.evicted.append(f"{namespace}/{name}")
        self.pods = [p for p in self.pods if (p.namespace, p.name) != (namespace, name)]

    def delete_pod(self, namespace: str, name: str) -> None:
        self.calls += 1
        self.deleted.append(f"{namespace}/{name}")
        self.pods = [p for p in self.pods if (p.namespace, p.name) != (namespace, name)]

    def event(self, node: NodeView, reason: str, message: str, warning: bool) -> None:
        self.calls += 1
        self.events.append((reason, message, warning))

    def wait_for_change(self, resource_version: str, timeout_s: float) -> str | None:
        for hook in self.on_wait:
            hook(self)  # type: ignore[operator]
        return None

    def cancel_waits(self) -> None:
        self.waits_cancelled = True


@dataclass
class MemoryFiles:
    """Host files in memory, with the same atomic-replace contract as the host layer."""

    data: dict[str, bytes] = field(default_factory=dict)
    crash_on_write: int = 0  #: crash on the n-th write (before it lands)
    writes: int = 0

    modes: dict[str, int] = field(default_factory=dict)  #: the mode each file was written with

    def read_bytes_or_none(self, host_path: str) -> bytes | None:
        return self.data.get(host_path)

    def write_atomic(self, host_path: str, data: bytes, mode: int) -> bool:
        self.writes += 1
        if self.crash_on_write == self.writes:
            raise Crash(f"crash before write #{self.writes} of {host_path}")
        changed = self.data.get(host_path) != data or self.modes.get(host_path) != mode
        self.data[host_path], self.modes[host_path] = data, mode
        return changed

    def remove(self, host_path: str) -> bool:
        return self.data.pop(host_path, None) is not None


@dataclass
class StepLock:
    """Counts the steps taken under the manager's step lock (one process, so nothing to exclude)."""

    held: int = 0
    taken: int = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self.held += 1
        self.taken += 1
        try:
            yield
        finally:
            self.held -= 1


@dataclass
class Clock:
    """The manager's two clocks. ``t`` is time passing: both move with it. :meth:`step` moves only the
    wall clock, as an NTP step or an operator's ``date -s`` does; the monotonic clock does not see it."""

    t: float = 1000.0
    wall_offset: float = 0.0

    def __call__(self) -> float:
        return self.t + self.wall_offset

    def monotonic(self) -> float:
        return self.t

    def step(self, seconds: float) -> None:
        self.wall_offset += seconds


@dataclass
class Rebooter:
    count: int = 0

    def reboot(self) -> None:
        self.count += 1


def pod(name: str, *, gpu: bool = False, client: str | None = None, namespace: str = "default",
        daemonset: bool = False, app: str | None = None) -> PodView:
    return PodView(namespace, name, "Running", ("nvidia.com/gpu",) if gpu else (),
                   (f"nvidia.com/gpu.deploy.{client}",) if client else (), daemonset,
                   {"app.kubernetes.io/name": app} if app else {})
