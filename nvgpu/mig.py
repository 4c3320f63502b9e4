"""MIG layout placement: can a set of GPU-instance profiles be created on one GPU, and where.

Used at preview time (config validation, the MigProfile component, policies) and on the node (the
MIG manager's plan). The search is exact: a backtracking search over each profile's legal
placements, largest instances first, with the compute-slice and per-profile instance limits checked
along the way. Layouts hold at most 7 instances, so this is microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvgpu.catalogue import GpuModel, MigProfile
from nvgpu.catalogue import normalize_profile_name as catalogue_normalize
from nvgpu.errortext import shown


class MigLayoutError(ValueError):
    """A layout that cannot be placed on a model; the message names the GPU, the profile and why."""


@dataclass(frozen=True)
class Placement:
    profile: MigProfile
    start: int

    @property
    def size(self) -> int:
        return self.profile.memory_slices


def normalize_profile_name(name: str) -> str:
    """Accept both ``1g.10gb+me`` (mig-parted) and ``1g.10gb.me`` (resource/label spelling), and the same for
    the RTX PRO 6000's ``+me.all`` and ``+gfx`` (:func:`nvgpu.catalogue.normalize_profile_name`)."""
    return catalogue_normalize(name)


def place_layout(model: GpuModel, layout: Mapping[str, int], gpu: str = "GPU") -> tuple[Placement, ...]:
    """Return one legal placement of ``layout`` ({profile: count}) on ``model`` or raise MigLayoutError.

    ``gpu`` names the GPU in error messages (e.g. ``GPU 3`` or ``gpu index 0``).
    """
    if model.mig is None:
        raise MigLayoutError(f"{gpu}: model {model.key} does not support MIG")
    spec = model.mig
    wanted: list[MigProfile] = []
    media = 0
    for raw_name, count in layout.items():
        if count < 0:
            raise MigLayoutError(f"{gpu}: profile {shown(raw_name)} has a negative count {shown(count)}")
        if count == 0:
            continue
        profile = spec.profile(normalize_profile_name(raw_name))
        if profile is None:
            raise MigLayoutError(
                f"{gpu}: profile {shown(raw_name)} is unknown for {model.key}; allowed: {', '.join(spec.profile_names)}"
            )
        if count > profile.max_instances:
            raise MigLayoutError(
                f"{gpu}: {shown(count)} x {profile.name} exceeds the {profile.max_instances} instance(s) "
                f"a {model.key} can hold"
            )
        if profile.media_extensions:
            media += count
        wanted.extend([profile] * count)
    if media > 1:
        raise MigLayoutError(f"{gpu}: only one +me (media extension) instance fits on the {model.key}, got {media}")
    compute = sum(p.compute_slices for p in wanted)
    if compute > spec.compute_slices:
        raise MigLayoutError(
            f"{gpu}: layout needs {compute} compute slices but the {model.key} has {spec.compute_slices}"
        )
    memory = sum(p.memory_slices for p in wanted)
    if memory > spec.memory_slices:
        raise MigLayoutError(
            f"{gpu}: layout needs {memory} memory slices but the {model.key} has {spec.memory_slices}"
        )
    wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    result = _search(wanted, 0, [False] * spec.memory_slices, [])
    if result is None:
        names = ", ".join(f"{c} x {n}" for n, c in layout.items() if c)
        raise MigLayoutError(f"{gpu}: no legal placement on the {model.key} holds {names}")
    return tuple(result)


def _search(
    wanted: list[MigProfile], i: int, used: list[bool], acc: list[Placement]
) -> list[Placement] | None:
    if i == len(wanted):
        return list(acc)
    profile = wanted[i]
    # Identical profiles are placed in increasing start order to avoid re-exploring permutations.
    min_start = acc[-1].start + 1 if acc and acc[-1].profile == profile else 0
    for start in profile.placement_starts:
        if start < min_start:
            continue
        span = range(start, start + profile.memory_slices)
        if any(used[s] for s in span):
            continue
        for s in span:
            used[s] = True
        acc.append(Placement(profile, start))
        found = _search(wanted, i + 1, used, acc)
        if found is not None:
            return found
        acc.pop()
        for s in span:
            used[s] = False
    return None


def layout_fits(model: GpuModel, layout: Mapping[str, int]) -> bool:
    try:
        place_layout(model, layout)
    except MigLayoutError:
        return False
    return True


def all_profile_layout(model: GpuModel, profile_name: str) -> dict[str, int]:
    """``all-<profile>``: as many instances of one profile as fit (mig-parted's standard sets)."""
    if model.mig is None:
        raise MigLayoutError(f"model {model.key} does not support MIG")
    profile = model.mig.profile(normalize_profile_name(profile_name))
    if profile is None:
        raise MigLayoutError(
            f"profile {shown(profile_name)} is unknown for {model.key}; allowed: {', '.join(model.mig.profile_names)}"
        )
    for count in range(profile.max_instances, 0, -1):
        if layout_fits(model, {profile.name: count}):
            return {profile.name: count}
    raise MigLayoutError(f"profile {profile.name} does not fit on {model.key}")


def balanced_layout(model: GpuModel) -> dict[str, int]:
    """mig-parted's ``all-balanced``: 2x1g + 1x2g + 1x3g on 7-slice GPUs, 2x1g + 1x2g on 4-slice GPUs."""
    if model.mig is None:
        raise MigLayoutError(f"model {model.key} does not support MIG")
    # The plain profiles only: the RTX PRO 6000's +gfx and -me variants share the plain ones' shapes, and
    # NVIDIA's all-balanced for it is 2x 1g.24gb + 1x 2g.48gb (mig-parted config-default.yaml).
    by_shape = {(p.compute_slices, p.memory_slices, p.media_extensions): p.name for p in model.mig.profiles
                if "+" not in p.name and "-" not in p.name}
    layout = {by_shape[(1, 1, False)]: 2, by_shape[(2, 2, False)]: 1}
    if model.mig.compute_slices == 7:
        layout[by_shape[(3, 4, False)]] = 1
    return layout
