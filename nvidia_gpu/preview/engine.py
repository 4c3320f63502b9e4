"""Step 2: run the project's own ``__main__.py`` under the Pulumi SDK's mock engine and record every registration.

The SDK's mock monitor (:class:`nvidia_gpu.sdk.runtime.EchoMonitor`) sees each ``RegisterResource``
request, so the record has what the real engine would get: type token, name, parent URN, provider,
dependencies, options and the serialised inputs. Mocked resources echo their inputs back as state, so
Outputs resolve like in a real preview. Every use of the SDK's internals is in :mod:`nvidia_gpu.sdk`.
"""

from __future__ import annotations

import gc
import runpy
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from nvidia_gpu.preview.model import PreviewResult, Problem, RecordedResource
from nvidia_gpu.sdk import runtime, stacktraces

STEP = "program"

# Every registration's stack trace, built faster (the same message): see nvidia_gpu.sdk.stacktraces.
stacktraces.install()


#: Keys that read best first in a Kubernetes object; everything else is sorted.
_LEADING_KEYS = ("apiVersion", "kind", "metadata", "name", "namespace")


def _key_order(key: str) -> tuple[int, str]:
    return (_LEADING_KEYS.index(key), "") if key in _LEADING_KEYS else (len(_LEADING_KEYS), key)


def normalise(value: Any) -> Any:
    """Undo the protobuf ``Struct`` round trip: integers get their type back and keys a stable order."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: normalise(value[k]) for k in sorted(value, key=_key_order)}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


class RecordingMonitor(runtime.EchoMonitor):
    """The SDK's mock monitor (inputs echoed back as state), plus a record of each registration."""

    def __init__(self, listeners: Sequence[Callable[[RecordedResource], None]] = ()) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.recorded: list[RecordedResource] = []
        self.listeners = list(listeners)

    def on_register(self, registration: runtime.Registration) -> None:
        record = RecordedResource(**{
            **{f.name: getattr(registration, f.name) for f in fields(registration)},
            "inputs": normalise(registration.inputs), "dependencies": tuple(sorted(registration.dependencies))})
        with self._lock:
            self.recorded.append(record)
        for listener in self.listeners:
            listener(record)

    def recorded_resources(self) -> tuple[RecordedResource, ...]:
        """Everything registered so far, in URN order (registration order is not deterministic)."""
        with self._lock:
            return tuple(sorted(self.recorded, key=lambda r: r.urn))


def install_mocks(
    project: str,
    stack: str,
    config: dict[str, str] | None = None,
    listeners: Sequence[Callable[[RecordedResource], None]] = (),
) -> RecordingMonitor:
    """Point the Pulumi runtime at a fresh recording mock engine (process-global: call once per run or test);
    each run starts with a fresh root stack resource (:func:`nvidia_gpu.sdk.runtime.install`)."""
    monitor = RecordingMonitor(listeners)
    runtime.install(monitor, project, stack, config or {})
    return monitor


#: Allocations between young-generation collections while a program runs (CPython's default is 700).
_YOUNG_GC_THRESHOLD = 100_000


_gc_depth = 0


@contextmanager
def program_gc() -> Iterator[None]:
    """Garbage collection tuned for one preview or program run; the previous settings come back afterwards.

    A run allocates several futures, Outputs and protobuf messages per property of every resource and
    keeps most of them until the end, so with CPython's defaults the collector ran some 500 times for
    a 100-group stack and re-scanned everything alive each time (imports and loaded schemas included):
    a third to a half of the run, growing faster than the stack. Here what existed before the run is
    frozen (never scanned) and young collections wait for 100,000 allocations instead of 700; cycles are
    still collected. Nested uses (the pipeline around the program step) keep the outermost settings.
    """
    global _gc_depth
    _gc_depth += 1
    if _gc_depth > 1:
        try:
            yield
        finally:
            _gc_depth -= 1
        return
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0  # someone else's frozen objects are theirs to unfreeze
    if freeze:
        gc.freeze()
    gc.set_threshold(max(threshold[0], _YOUNG_GC_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        _gc_depth -= 1
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()


def run_in_engine(fn: Callable[[], object]) -> None:
    """Run ``fn`` as a Pulumi program and wait until every registration and Output has settled."""

    with program_gc():
        runtime.run_as_program(fn)


def run_program(
    main: Path,
    project: str,
    stack: str,
    config: dict[str, str],
    listeners: Sequence[Callable[[RecordedResource], None]] = (),
) -> tuple[tuple[RecordedResource, ...], BaseException | None]:
    """Run ``main`` like ``pulumi preview`` would; return the registrations and the program's error, if any."""
    monitor = install_mocks(project, stack, config, listeners)
    project_dir = str(main.parent)
    if project_dir not in sys.path:
        sys.path.insert(0, project_dir)
    error: BaseException | None = None
    try:
        run_in_engine(lambda: runpy.run_path(str(main), run_name="__main__"))
    except Exception as e:  # the program's own failure is a preview problem, not a crash
        error = e
    return monitor.recorded_resources(), error


def run(result: PreviewResult) -> None:
    resources, error = run_program(
        result.project_dir / "__main__.py", result.project, result.stack, result.engine_config, result.listeners
    )
    result.resources = resources
    if error is not None:
        result.problems.append(Problem(STEP, "__main__.py", f"{type(error).__name__}: {error}"))
