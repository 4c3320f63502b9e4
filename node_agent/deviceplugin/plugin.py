"""The device plugin's domain service: one :class:`ResourcePlugin` per advertised resource.

A :class:`NodePlugins` is built from the node's devices and the settings at every (re)start, the
way NVIDIA rebuilds its plugins: it enumerates resources, writes the CDI spec, shares one
:class:`~node_agent.deviceplugin.health.HealthBoard` between them and starts the health monitor. The
gRPC servicers in ``node_agent.kubelet`` call these methods and only translate types.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from node_agent.cdi.spec import ContainerEdits
from node_agent.deviceplugin.allocate import AllocationError, Allocator, ContainerAllocation
from node_agent.deviceplugin.cdi import write_specs
from node_agent.deviceplugin.config import Settings
from node_agent.deviceplugin.devices import Gpu, HostFiles, NodeDevices
from node_agent.deviceplugin.health import HealthBoard, HealthMonitor, HealthPolicy
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.preferred import PreferenceError, Request, preferred_allocation
from node_agent.deviceplugin.resources import Resource, build_resources, select_imex_channels
from node_agent.host import HostError

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class DeviceStatus:
    id: str
    health: str
    numa_node: int | None


@dataclass(frozen=True)
class Options:
    pre_start_required: bool = False
    get_preferred_allocation_available: bool = True


class ResourcePlugin:
    """Answers kubelet's calls for one resource (no protocol types here)."""

    def __init__(self, resource: Resource, settings: Settings, board: HealthBoard, *,
                 pair_scores: dict[tuple[int, int], int], host: HostFiles, metrics: PluginMetrics,
                 refresh_cdi: Callable[[], object] | None = None):
        self.resource = resource
        self.settings = settings
        self.board = board
        self._scores = pair_scores
        self._allocator = Allocator(resource, settings, host)
        #: Rewrites the CDI spec if the host's control nodes changed (``nvidia-uvm`` made after the plugin
        #: started): the runtime resolves the names Allocate answers from that spec.
        self._refresh_cdi = refresh_cdi
        self.metrics = metrics
        self._stopped = threading.Event()

    @property
    def name(self) -> str:
        return self.resource.name

    def options(self) -> Options:
        return Options()

    def devices(self) -> list[DeviceStatus]:
        out = []
        for d in self.resource.devices:
            ok = self.board.healthy(d.uuid) and self.board.healthy(d.gpu_uuid)
            out.append(DeviceStatus(d.id, HEALTHY if ok else UNHEALTHY, d.numa_node))
        return out

    def _count(self, devices: Sequence[DeviceStatus]) -> None:
        healthy = sum(1 for d in devices if d.health == HEALTHY)
        self.metrics.devices.labels(resource=self.name, health=HEALTHY).set(healthy)
        self.metrics.devices.labels(resource=self.name, health=UNHEALTHY).set(len(devices) - healthy)

    def watch(self, active: threading.Event | None = None, poll_s: float = 60.0) -> Iterator[list[DeviceStatus]]:
        """ListAndWatch: the full list now, then again on every health change, until stopped.

        ``active`` is the caller's "stream still open" flag; like NVIDIA's plugin the stream ends
        without sending an empty list. A health change, the stream's end (its callback wakes the board)
        and :meth:`stop` all wake the wait, so ``poll_s`` is only a safety net: at 1 s it was one of the
        plugin's few wake-ups at rest, once a second per stream.
        """
        seen = self.board.version
        current = self.devices()
        self._count(current)
        yield current
        while not self._stopped.is_set() and (active is None or active.is_set()):
            version = self.board.wait_change(seen, poll_s)
            if self._stopped.is_set() or (active is not None and not active.is_set()):
                return
            if version == seen:
                continue
            seen = version
            latest = self.devices()
            if latest != current:
                current = latest
                self._count(current)
                yield current

    def preferred(self, requests: Sequence[Request]) -> list[list[str]]:
        out = []
        for req in requests:
            out.append(preferred_allocation(
                self.resource, req, lambda a, b: self._scores.get((a, b), 0),
                self.settings.shared_devices_allocation_policy,
            ))
            self.metrics.preferred.labels(resource=self.name).inc()
        return out

    def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        start = time.perf_counter()
        if self._refresh_cdi is not None and self.settings.uses_cdi:
            try:
                self._refresh_cdi()
            except HostError as e:  # the spec written at start still serves; the container may lack UVM
                log.warning("event=cdi-refresh-failed resource=%s error=%s", self.name, e)
        try:
            out = [self._allocator.allocate(ids) for ids in requests]
        except AllocationError:
            self.metrics.allocation_errors.labels(resource=self.name).inc()
            raise
        self.metrics.allocations.labels(resource=self.name).inc(len(out))
        self.metrics.allocated_devices.labels(resource=self.name).inc(sum(len(ids) for ids in requests))
        self.metrics.allocate_seconds.labels(resource=self.name).observe(time.perf_counter() - start)
        return out

    def stop(self) -> None:
        self._stopped.set()
        self.board.wake()


class NodePlugins:
    """Every resource of the node, built from one snapshot of the devices and settings."""

    def __init__(self, node: NodeDevices, settings: Settings, host: HostFiles, *, metrics: PluginMetrics,
                 policy: HealthPolicy, board: HealthBoard | None = None,
                 driver_edits: ContainerEdits | None = None):
        settings = select_imex_channels(settings, host)  # only channels with a device node are offered
        self.settings = settings
        self.gpus: tuple[Gpu, ...] = tuple(node.gpus())
        self.resources = build_resources(self.gpus, settings, host)
        scores: dict[tuple[int, int], int] = {}
        for a in self.gpus:
            for b in self.gpus:
                if a.index < b.index:
                    s = node.link(a, b).score
                    scores[(a.index, b.index)] = scores[(b.index, a.index)] = s
        self.board = HealthBoard() if board is None else board
        self.board.add_listener(metrics.on_transition)
        resources = self.resources
        self.plugins = [ResourcePlugin(r, settings, self.board, pair_scores=scores, host=host, metrics=metrics,
                                       refresh_cdi=lambda: write_specs(resources, settings, host, driver_edits))
                        for r in self.resources]
        self.monitor = HealthMonitor(node, self.gpus, self.board, policy)
        self.cdi_changed = write_specs(self.resources, settings, host, driver_edits)
        log.info("event=plugins-built resources=%s", ",".join(f"{r.name}:{len(r.devices)}" for r in self.resources))

    def start(self) -> None:
        self.monitor.start()

    def stop(self, wait: bool = True) -> None:
        """``wait``: for the health monitor's thread (a final stop; see :meth:`HealthMonitor.stop`)."""
        self.monitor.stop(wait)
        for p in self.plugins:
            p.stop()


__all__ = ["AllocationError", "DeviceStatus", "NodePlugins", "Options", "PreferenceError", "ResourcePlugin"]
