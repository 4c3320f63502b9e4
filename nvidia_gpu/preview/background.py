"""One thing a later preview step needs, started on a thread by an earlier step (a pipeline handoff).

The step that needs it calls :meth:`BackgroundStart.wait` (which raises what the start raised); the
pipeline calls :meth:`BackgroundStart.close` when it ends, whatever happened, and only once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class BackgroundStart(Generic[T]):
    def __init__(self, name: str, begin: Callable[[], T], end: Callable[[], None]) -> None:
        self._begin, self._end = begin, end
        self._value: T | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._begin()
        except BaseException as e:  # handed to wait(), on the step's thread
            self._error = e

    def wait(self) -> T:
        """What the start gave; raises what it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def close(self) -> None:
        """Undo the start (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        self._thread.join()
        self._end()
