"""Timing shared by the benchmarks: the median of repeated calls (a machine's noise lands in the tails)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

RUNS = 30


def median_ms(call: Callable[[], object], runs: int = RUNS) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)
