"""Bounded NVML calls: every call runs on a worker thread and is abandoned after its time budget.

NVML calls can block for a long time on a wedged GPU or driver (an RM lock held by a crashed
process, a GPU stuck in reset). A Python thread cannot be cancelled, so a call that overruns is
*abandoned*: its worker is retired (it exits once the call finally returns) and later calls get a
fresh worker, so one hung GPU never stalls the agent. Errors are translated to the project's own
types here, with the ``NVMLError`` chained.

A wedged GPU costs a bounded number of threads: the session runs each per-GPU call inside
``on_gpus(index)``, and once a call to a GPU has timed out the GPU is *wedged* until that call
returns: further calls to it wait a short grace for the hung call, then fail fast with
``NvmlTimeout`` instead of starting another worker that would hang too. Calls outside any GPU scope
(device count, driver version, event waits) share one key, "the driver", with the same rule. So at
most one abandoned thread per GPU (plus one for the driver) is alive at any time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from node_agent.nvml.errors import (
    DeviceLost,
    NvmlError,
    NvmlInsufficientResources,
    NvmlInUse,
    NvmlInvalidArgument,
    NvmlNotFound,
    NvmlNotSupported,
    NvmlPermissionDenied,
    NvmlTimeout,
    NvmlUnavailable,
)

T = TypeVar("T")

#: How long a call to a wedged GPU waits for the hung call to come back before failing fast.
WEDGED_GRACE_S = 0.1
#: The wedge key of calls made outside any GPU scope.
_DRIVER = -1
_scope = threading.local()


@contextlib.contextmanager
def on_gpus(*indices: int) -> Iterator[None]:
    """Mark the NVML calls this thread makes inside the block as calls to these GPUs."""
    previous: frozenset[int] = getattr(_scope, "gpus", frozenset())
    _scope.gpus = previous | frozenset(indices)
    try:
        yield
    finally:
        _scope.gpus = previous


def current_gpus() -> frozenset[int]:
    """The GPUs the calling thread's NVML calls are for (empty: a driver-wide call)."""
    gpus: frozenset[int] = getattr(_scope, "gpus", frozenset())
    return gpus

_BY_CODE: dict[int, type[NvmlError]] = {
    pynvml.NVML_ERROR_UNINITIALIZED: NvmlUnavailable,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: NvmlUnavailable,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: NvmlUnavailable,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: NvmlUnavailable,
    pynvml.NVML_ERROR_GPU_IS_LOST: DeviceLost,
    pynvml.NVML_ERROR_RESET_REQUIRED: DeviceLost,
    pynvml.NVML_ERROR_NOT_SUPPORTED: NvmlNotSupported,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: NvmlNotSupported,
    pynvml.NVML_ERROR_NOT_FOUND: NvmlNotFound,
    pynvml.NVML_ERROR_IN_USE: NvmlInUse,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: NvmlInsufficientResources,
    pynvml.NVML_ERROR_INVALID_ARGUMENT: NvmlInvalidArgument,
    pynvml.NVML_ERROR_NO_PERMISSION: NvmlPermissionDenied,
    pynvml.NVML_ERROR_TIMEOUT: NvmlTimeout,
}


def translate(err: pynvml.NVMLError, what: str) -> NvmlError:
    """The project error for an ``NVMLError`` raised by ``what`` (chain it with ``from err``)."""
    code = int(getattr(err, "value", pynvml.NVML_ERROR_UNKNOWN))
    cls = _BY_CODE.get(code, NvmlError)
    return cls(f"{what}: {err} (NVML error {code})", code)


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.retired = False
        self.thread = threading.Thread(target=self._loop, name="nvml-call", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                job.result = job.fn(*job.args)
            except BaseException as e:  # handed to the caller's thread
                job.error = e
            job.done.set()
            if self.retired:
                return


@dataclass(frozen=True)
class _Hung:
    what: str
    job: _Job
    since: float


def _key_name(key: int) -> str:
    return "the NVML driver" if key == _DRIVER else f"GPU {key}"


class CallRunner:
    """Runs NVML calls with a deadline; ``timeout_s=None`` calls inline (no thread)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        #: GPU index (or ``_DRIVER``) -> the call that timed out on it and has not returned yet.
        self._hung: dict[int, _Hung] = {}

    def call(self, what: str, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        budget = timeout_s if timeout_s is not None else self.timeout_s
        try:
            if budget is None or getattr(_scope, "batch", None) is self:
                return fn(*args)
            return self._bounded(what, fn, args, budget)
        except pynvml.NVMLError as e:
            raise translate(e, what) from e
        except pynvml.NVMLLibraryMismatchError as e:
            raise NvmlNotSupported(f"{what}: {e}") from e

    def batch(self, what: str, fn: Callable[[], T]) -> T:
        """``fn``, which makes several calls through this runner, as one job on the worker: the calls in it
        run inline there. One thread handoff for a whole GPU's read instead of one per call (a dozen, and
        dozens on a MIG GPU): most of what an inventory poll cost. The budget covers the batch, and a batch
        that runs out of it wedges the caller's GPUs as one call would."""
        if self.timeout_s is None or getattr(_scope, "batch", None) is self:
            return fn()

        def inline() -> T:
            outer = getattr(_scope, "batch", None)
            _scope.batch = self
            try:
                return fn()
            finally:
                _scope.batch = outer

        return self._bounded(what, inline, (), self.timeout_s)

    def _check_wedged(self, what: str, keys: frozenset[int], budget: float) -> None:
        for key in sorted(keys):
            hung = self._hung.get(key)
            if hung is None:
                continue
            if hung.job.done.wait(min(budget, WEDGED_GRACE_S)):
                del self._hung[key]
                continue
            raise NvmlTimeout(
                f"{what}: {_key_name(key)} is wedged: {hung.what} has not returned after "
                f"{time.monotonic() - hung.since:.1f}s; not calling it again until it does")

    def _bounded(self, what: str, fn: Callable[..., T], args: tuple[Any, ...], budget: float) -> T:
        job = _Job(fn, args)
        keys = current_gpus() or frozenset((_DRIVER,))
        with self._lock:
            self._check_wedged(what, keys, budget)
            if self._worker is None:
                self._worker = _Worker()
            worker = self._worker
            worker.jobs.put(job)
            if not job.done.wait(budget):
                # Retire the stuck worker: it exits after the hung call returns; the next call gets a new one.
                worker.retired = True
                worker.jobs.put(None)
                self._worker = None
                for key in keys:
                    self._hung[key] = _Hung(what, job, time.monotonic())
                raise NvmlTimeout(f"{what}: no answer from NVML within {budget:g}s")
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.jobs.put(None)
                self._worker = None
