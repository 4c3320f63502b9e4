"""GetPreferredAllocation: which of the available devices kubelet should give a container.

Full GPUs are chosen by topology. NVIDIA's best-effort policy (go-gpuallocator) scores a set as the
sum of its pair scores (PCIe locality plus 100 per NVLink) and enumerates every partition of the
available GPUs, which grows super-exponentially. Here an exact branch-and-bound over subsets finds
the highest-scoring set that contains the must-include devices, so the answer's score is never below
NVIDIA's (whose answer is one such set); ties go to the set with the weakest links to the GPUs left
behind, keeping well-connected groups together for the next request.

Replicas and MIG devices use NVIDIA's greedy policy over physical GPUs: ``distributed`` picks the GPU
with the fewest replicas handed out, ``packed`` the most; unlike NVIDIA's, the required devices count
as handed out and a request spreads over distinct GPUs first, so a 2-replica request under
``distributed`` never lands on one GPU while another is idle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node_agent.deviceplugin.config import AllocationPolicy
from node_agent.deviceplugin.resources import PluginDevice, Resource


class PreferenceError(ValueError):
    """A malformed preferred-allocation request (unknown IDs, impossible sizes)."""


@dataclass(frozen=True)
class Request:
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def check_request(resource: Resource, req: Request) -> None:
    known = resource.by_id()
    for i in (*req.available, *req.must_include):
        if i not in known:
            raise PreferenceError(f"preferred allocation for '{resource.name}': unknown device: {i}")
    missing = [i for i in req.must_include if i not in req.available]
    if missing:
        raise PreferenceError(f"preferred allocation for '{resource.name}': must-include devices {missing} "
                              "are not in the available list")
    if req.size < len(set(req.must_include)) or req.size > len(set(req.available)) or req.size <= 0:
        raise PreferenceError(
            f"preferred allocation for '{resource.name}': allocation size {req.size} is outside "
            f"[{max(1, len(set(req.must_include)))}, {len(set(req.available))}]"
        )


def best_set(n: int, score: Callable[[int, int], int], required: Sequence[int], size: int,
             candidates: Sequence[int] | None = None) -> tuple[int, ...]:
    """The highest-scoring ``size``-subset of ``range(n)`` (or ``candidates``) containing ``required``.

    Exact branch and bound. The score bound adds, for the ``k`` picks still to make, the ``k`` largest
    gains against the set so far plus ``k(k-1)/2`` times the largest pair score among the remaining
    candidates. Among sets of the best score the one with the smallest cut (links to the GPUs left
    behind) wins; for a fixed size the cut is the members' total link weight minus twice the score, so
    it is bounded by the ``k`` smallest weights still available, which also prunes symmetric
    topologies (every NVSwitch pair alike) instead of visiting every tie.
    """
    pool = list(range(n)) if candidates is None else list(candidates)
    req = list(dict.fromkeys(required))
    free = [c for c in pool if c not in req]
    need = size - len(req)
    if need < 0 or need > len(free):
        raise ValueError("size out of range")
    w = [[score(a, b) if a != b else 0 for b in range(n)] for a in range(n)]
    pool_all = req + free
    weight = {c: sum(w[c][o] for o in pool_all) for c in pool_all}
    base = sum(w[a][b] for i, a in enumerate(req) for b in req[i + 1:])
    base_weight = sum(weight[r] for r in req)
    # Visit strong candidates first so the first complete set is already good.
    strength = {c: sum(w[c][r] for r in req) * 1000 + weight[c] for c in free}
    free.sort(key=lambda c: (-strength[c], c))

    best_score = -1
    best_weight = 0
    best: tuple[int, ...] = ()

    def rec(start: int, chosen: list[int], sc: int, wsum: int, gains: dict[int, int]) -> None:
        nonlocal best_score, best_weight, best
        k = need - len(chosen)
        if k == 0:
            cut = wsum - 2 * sc
            if sc > best_score or (sc == best_score and cut < best_weight - 2 * best_score):
                best_score, best_weight, best = sc, wsum, tuple(sorted(req + chosen))
            return
        rest = free[start:]
        if len(rest) < k:
            return
        if best_score >= 0:
            top = sorted((gains[c] for c in rest), reverse=True)[:k]
            max_pair = max((w[a][b] for i, a in enumerate(rest) for b in rest[i + 1:]), default=0)
            bound = sc + sum(top) + max_pair * k * (k - 1) // 2
            if bound < best_score:
                return
            if bound == best_score:
                lightest = sum(sorted(weight[c] for c in rest)[:k])
                if wsum + lightest - 2 * best_score >= best_weight - 2 * best_score:
                    return
        for i in range(start, len(free) - k + 1):
            c = free[i]
            new_gains = {o: g + w[o][c] for o, g in gains.items()}
            chosen.append(c)
            rec(i + 1, chosen, sc + gains[c], wsum + weight[c], new_gains)
            chosen.pop()

    rec(0, [], base, base_weight, {c: sum(w[c][r] for r in req) for c in free})
    return best


def set_score(members: Sequence[int], score: Callable[[int, int], int]) -> int:
    return sum(score(a, b) for i, a in enumerate(members) for b in members[i + 1:])


def topology_preference(resource: Resource, req: Request, pair_score: Callable[[int, int], int]) -> list[str]:
    """Full GPUs: the best-connected set (``pair_score`` takes GPU indices)."""
    by_id = resource.by_id()
    avail = list(dict.fromkeys(req.available))
    devs = [by_id[i] for i in avail]
    local = {d.id: n for n, d in enumerate(devs)}
    chosen = best_set(
        len(devs), lambda a, b: pair_score(devs[a].gpu_index, devs[b].gpu_index),
        [local[i] for i in req.must_include], req.size,
    )
    return [devs[n].id for n in chosen]


def greedy_preference(resource: Resource, req: Request, policy: AllocationPolicy) -> list[str]:
    """Replicas / MIG devices: spread over (``distributed``) or pack onto (``packed``) physical GPUs."""
    by_id = resource.by_id()
    available = set(req.available)
    required = list(dict.fromkeys(req.must_include))
    total: dict[str, int] = {}
    free: dict[str, int] = {}
    for d in resource.devices:
        total[d.gpu_uuid] = total.get(d.gpu_uuid, 0) + 1
        if d.id in available and d.id not in required:
            free[d.gpu_uuid] = free.get(d.gpu_uuid, 0) + 1
    touched: dict[str, int] = {}
    for r in required:
        touched[by_id[r].gpu_uuid] = touched.get(by_id[r].gpu_uuid, 0) + 1
    candidates: list[PluginDevice] = [by_id[i] for i in dict.fromkeys(req.available) if i not in required]
    picks: list[str] = []
    for _ in range(req.size - len(required)):
        def key(d: PluginDevice) -> tuple[int, int, int, int]:
            used = total[d.gpu_uuid] - free.get(d.gpu_uuid, 0)
            mine = touched.get(d.gpu_uuid, 0)
            if policy is AllocationPolicy.PACKED:
                return (-used, -mine, d.gpu_index, d.replica or 0)
            return (mine, used, d.gpu_index, d.replica or 0)
        best = min(candidates, key=key)
        candidates.remove(best)
        picks.append(best.id)
        free[best.gpu_uuid] -= 1
        touched[best.gpu_uuid] = touched.get(best.gpu_uuid, 0) + 1
    return required + picks


def preferred_allocation(resource: Resource, req: Request, pair_score: Callable[[int, int], int],
                         policy: AllocationPolicy) -> list[str]:
    check_request(resource, req)
    if resource.full_gpus_only:
        return topology_preference(resource, req, pair_score)
    return greedy_preference(resource, req, policy)
