"""Apply a planned layout (or put a previous one back) through the :class:`MigBackend`.

The order follows mig-parted: instances are cleared before a mode change on an enabled GPU, modes are
set for every GPU first (so one reset covers them all), then each GPU's instances are destroyed and
recreated, largest first, at the placements the plan chose. GPUs already matching are not touched,
so re-running after a crash does only the remaining work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from node_agent.mig.hardware import (
    GpuInfo,
    GpuState,
    MigBackend,
    MigHardwareError,
    PlacedInstance,
    ResetUnavailable,
    snapshot,
)
from node_agent.mig.plan import GpuTarget, NodePlan
from nvgpu.catalogue import GpuModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModeResult:
    reset: tuple[int, ...]  #: GPUs reset so the new mode took effect
    pending: tuple[int, ...]  #: GPUs whose mode change still waits for a reset (a reboot is needed)


def _model(gpus: Sequence[GpuInfo], index: int) -> GpuModel:
    for g in gpus:
        if g.index == index:
            m = g.model
            if m is None:
                raise MigHardwareError(f"GPU {index} ({g.name}) is not in the GPU catalogue")
            return m
    raise MigHardwareError(f"GPU {index} is not on this node")


def set_modes(backend: MigBackend, wanted: Sequence[tuple[int, bool]]) -> ModeResult:
    """Set MIG mode per GPU, clearing instances first, and reset GPUs left pending.

    Raises :class:`~node_agent.mig.hardware.ResetUnavailable` when the reset fails (a reboot is needed)
    and :class:`MigHardwareError` for other NVML failures.
    """
    for index, enabled in wanted:
        current, pending = backend.mig_mode(index)
        if current == enabled and pending == enabled:
            continue
        if current:
            backend.destroy_all_instances(index)
        log.info("event=mig-mode gpu=%d enabled=%s", index, enabled)
        backend.set_mig_mode(index, enabled)
    need_reset = []
    for index, enabled in wanted:
        current, _ = backend.mig_mode(index)
        if current != enabled:
            need_reset.append(index)
    if need_reset:
        log.info("event=gpu-reset gpus=%s", ",".join(map(str, need_reset)))
        backend.reset_gpus(need_reset)
        still = [i for i, e in wanted if backend.mig_mode(i)[0] != e]
        if still:
            return ModeResult(tuple(need_reset), tuple(still))
    return ModeResult(tuple(need_reset), ())


def apply_modes(backend: MigBackend, node_plan: NodePlan) -> ModeResult:
    """The plan's MIG modes set; :class:`ResetUnavailable` when one is still pending after the GPU reset
    (NVML re-read after it): the layout step would only fail on it later with a misleading reason, where
    mig-parted's ``assert --mode-only`` after its apply fails at once (NVIDIA's ``reconfigure-mig.sh``)."""
    result = set_modes(backend, [(t.index, t.mig_enabled) for t in node_plan.targets])
    if result.pending:
        raise ResetUnavailable(f"MIG mode still pending on GPU {', '.join(map(str, result.pending))} after the "
                               "GPU reset")
    return result


def _create(backend: MigBackend, model: GpuModel, index: int, instances: Sequence[PlacedInstance]) -> None:
    assert model.mig is not None
    ordered = sorted(instances, key=lambda i: (-_size(model, i.profile), i.start))
    for inst in ordered:
        profile = model.mig.profile(inst.profile)
        if profile is None:
            raise MigHardwareError(f"GPU {index}: profile {inst.profile} is unknown for the {model.key}")
        backend.create_instance(index, profile, inst.start)


def _size(model: GpuModel, name: str) -> int:
    assert model.mig is not None
    p = model.mig.profile(name)
    return p.memory_slices if p else 0


def apply_layouts(backend: MigBackend, node_plan: NodePlan, gpus: Sequence[GpuInfo] | None = None) -> tuple[int, ...]:
    """Recreate instances on GPUs whose instances differ from the plan; returns the GPUs changed."""
    gpus = tuple(gpus if gpus is not None else backend.gpus())
    states = {s.index: s for s in snapshot(backend, gpus)}
    changed = []
    for t in node_plan.targets:
        if not t.mig_enabled:
            continue
        state = states.get(t.index)
        if state is None or not state.mig_enabled:
            raise MigHardwareError(f"GPU {t.index}: MIG mode is not enabled, cannot create instances")
        if state.profile_counts == t.profile_counts:
            continue
        _replace(backend, _model(gpus, t.index), t)
        changed.append(t.index)
    return tuple(changed)


def _replace(backend: MigBackend, model: GpuModel, t: GpuTarget) -> None:
    log.info("event=mig-layout gpu=%d instances=%s", t.index, ",".join(f"{i.profile}@{i.start}" for i in t.instances))
    backend.destroy_all_instances(t.index)
    _create(backend, model, t.index, t.instances)


def restore(backend: MigBackend, previous: Sequence[GpuState]) -> list[str]:
    """Put journaled GPU states back; returns the problems met (empty when fully restored)."""
    problems: list[str] = []
    gpus = tuple(backend.gpus())
    by_index = {g.index: g for g in gpus}
    wanted = [(p.index, p.mig_enabled) for p in previous if p.index in by_index]
    try:
        result = set_modes(backend, wanted)
        if result.pending:
            problems.append(f"MIG mode of GPU {', '.join(map(str, result.pending))} waits for a reset")
    except MigHardwareError as e:
        problems.append(f"restoring MIG mode: {e}")
    for p in previous:
        if p.index not in by_index or not p.mig_enabled:
            continue
        try:
            current, _ = backend.mig_mode(p.index)
            if not current:
                continue
            now = {s.index: s for s in snapshot(backend, [by_index[p.index]])}[p.index]
            if now.profile_counts == p.profile_counts:
                continue
            backend.destroy_all_instances(p.index)
            known = [i for i in p.instances if not i.profile.startswith("id:")]
            _create(backend, _model(gpus, p.index), p.index, known)
        except MigHardwareError as e:
            problems.append(f"restoring GPU {p.index} instances: {e}")
    return problems
