"""Resolve a named mig-parted config against this node's GPUs, and compare it with what is applied.

The plan is computed once per decision from the config file, the GPU list and the catalogue: which
entry selects which GPU, and the exact placement of every instance (the same search the components
use at preview time, so a layout accepted there is placed the same way here). Problems that make a
config unusable on this node (unknown name, a layout for another GPU model, a profile that does not fit)
raise :class:`PlanError` with a reason fit for an Event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node_agent.mig.hardware import GpuInfo, GpuState, PlacedInstance, count_profiles
from nvgpu.mig import MigLayoutError, place_layout
from nvgpu.migparted import MigConfigSpec, MigPartedConfig, MigPartedError


class PlanError(ValueError):
    """The config cannot be applied on this node; the message says why, naming the GPU."""


@dataclass(frozen=True)
class GpuTarget:
    index: int
    uuid: str
    model: str
    mig_enabled: bool
    instances: tuple[PlacedInstance, ...]

    @property
    def profile_counts(self) -> dict[str, int]:
        return count_profiles(self.instances)


@dataclass(frozen=True)
class NodePlan:
    config: str
    targets: tuple[GpuTarget, ...]  #: managed GPUs only; GPUs no entry selects are left alone


@dataclass(frozen=True)
class Diff:
    mode: tuple[int, ...]  #: GPUs whose current or pending mode differs from the target
    layout: tuple[int, ...]  #: GPUs whose instances differ from the target

    @property
    def applied(self) -> bool:
        return not self.mode and not self.layout


def plan(config: MigPartedConfig, name: str, gpus: Sequence[GpuInfo]) -> NodePlan:
    try:
        specs = config.get(name)
    except MigPartedError as e:
        raise PlanError(str(e)) from None
    if not gpus:
        raise PlanError(f"MIG config {name!r}: no GPU on this node")
    targets = []
    for gpu in gpus:
        chosen: list[tuple[int, MigConfigSpec]] = [
            (i, s)
            for i, s in enumerate(specs)
            if s.matches(gpu.index, gpu.pci_device_id, subsystem=gpu.pci_subsystem_id)
        ]
        if len(chosen) > 1:
            raise PlanError(
                f"MIG config {name!r}: GPU {gpu.index} is selected by entries "
                f"{', '.join(str(i) for i, _ in chosen)}; each GPU may match one entry"
            )
        if not chosen:
            continue
        spec = chosen[0][1]
        model = gpu.model
        label = f"GPU {gpu.index} ({gpu.name}, PCI 0x{gpu.pci_device_id:04X})"
        if not spec.mig_enabled:
            targets.append(GpuTarget(gpu.index, gpu.uuid, model.key if model else gpu.name, False, ()))
            continue
        if model is None:
            raise PlanError(f"MIG config {name!r}: {label} is not in the GPU catalogue; its MIG profiles are unknown")
        try:
            placements = place_layout(model, spec.layout, gpu=f"MIG config {name!r}: {label}")
        except MigLayoutError as e:
            raise PlanError(str(e)) from None
        instances = tuple(sorted((PlacedInstance(p.profile.name, p.start) for p in placements), key=_order))
        targets.append(GpuTarget(gpu.index, gpu.uuid, model.key, True, instances))
    if not targets:
        models = ", ".join(sorted({g.name for g in gpus}))
        raise PlanError(f"MIG config {name!r} selects none of this node's GPUs ({models}): it is for another model")
    return NodePlan(name, tuple(targets))


def _order(i: PlacedInstance) -> tuple[int, str]:
    return (i.start, i.profile)


def diff(node_plan: NodePlan, states: Sequence[GpuState]) -> Diff:
    by_index = {s.index: s for s in states}
    mode: list[int] = []
    layout: list[int] = []
    for t in node_plan.targets:
        s = by_index.get(t.index)
        if s is None:
            mode.append(t.index)
            continue
        if s.mig_enabled != t.mig_enabled or s.mig_pending != t.mig_enabled:
            mode.append(t.index)
        if t.mig_enabled and s.profile_counts != t.profile_counts:
            layout.append(t.index)
    return Diff(tuple(mode), tuple(layout))
