"""A loop's waits recorded instead of slept through (``ListWatch``'s ``pause``): a test reads a backoff
schedule off them without sleeping."""

from __future__ import annotations

import threading


class Pauses:
    """The loop's waits, recorded instead of slept through; from the ``limit``-th on it really waits (for the
    stop), so a test reads a backoff schedule off ``asked`` without sleeping through it."""

    def __init__(self, limit: int) -> None:
        self.asked: list[float] = []
        self.limit = limit
        self.reached = threading.Event()

    def __call__(self, stop: threading.Event, seconds: float) -> bool:
        self.asked.append(seconds)
        if len(self.asked) < self.limit:
            return stop.is_set()
        self.reached.set()
        return stop.wait(seconds)
