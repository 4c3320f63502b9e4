"""Reference allocators for comparison: exhaustive subset search and NVIDIA's partition search.

``nvidia_best_effort`` re-implements go-gpuallocator's best-effort policy (enumerate every partition
of the available GPUs into sets of the request size, padded with empty slots; keep partitions with a
set holding all required GPUs; take the best-scoring partition, then its best set with the required
GPUs). Used by tests and the benchmark only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

Score = Callable[[int, int], int]


def set_score(s: Sequence[int | None], score: Score) -> int:
    real = [x for x in s if x is not None]
    return sum(score(a, b) for i, a in enumerate(real) for b in real[i + 1:])


def exhaustive(n: int, score: Score, required: Sequence[int], size: int) -> int:
    free = [i for i in range(n) if i not in required]
    return max(set_score([*required, *c], score) for c in itertools.combinations(free, size - len(required)))


def _partitions(items: list[int | None], size: int) -> Iterator[list[list[int | None]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for combo in itertools.combinations(range(len(rest)), size - 1):
        chosen = [first, *(rest[i] for i in combo)]
        remaining = [x for i, x in enumerate(rest) if i not in combo]
        for p in _partitions(remaining, size):
            yield [chosen, *p]


def nvidia_best_effort(n: int, score: Score, required: Sequence[int], size: int) -> list[int]:
    items: list[int | None] = list(range(n))
    while len(items) % size:
        items.append(None)
    best: list[list[int | None]] | None = None
    best_score = 0
    req = set(required)
    for part in _partitions(items, size):
        if not any(req <= set(s) for s in part):
            continue
        sc = sum(set_score(s, score) for s in part)
        if best is None or sc > best_score:
            best, best_score = part, sc
    assert best is not None
    sets = [s for s in best if req <= set(s)]
    chosen = max(sets, key=lambda s: set_score(s, score))
    return [x for x in chosen if x is not None]
