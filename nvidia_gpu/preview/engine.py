"""Step 2: run the project's own ``__main__.py`` under the Pulumi SDK's mock engine and record every registration.

A ``MockMonitor`` subclass sees each ``RegisterResource`` request, so the record has what the real
engine would get: type token, name, parent URN, provider, dependencies, options and the serialised
inputs. Mocked resources echo their inputs back as state, so Outputs resolve like in a real preview.
"""

from __future__ import annotations

import gc
import runpy
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from types import FrameType
from typing import Any

import pulumi
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.mocks import MockMonitor, MockResourceArgs
from pulumi.runtime.proto import source_pb2

from nvidia_gpu.preview.model import PreviewResult, Problem, RecordedResource
from nvidia_gpu.preview.policyrun.analyzer_client import ROOT_STACK_TYPE

STEP = "program"


def _cache_source_positions() -> None:
    """Memoise the SDK's frame-to-URI conversion, which it repeats for every frame of every registration.

    Each registration records the Python stack as source positions, and each frame's file name goes
    through ``pathlib.Path(...).as_uri()``: a fifth of the preview's program step. A file and line
    always map to the same position, so caching changes nothing but the time.
    """
    original = sdk_resource._get_source_position_for_frame
    if getattr(original, "cached_by_preview", False):
        return

    @lru_cache(maxsize=65536)
    def by_location(filename: str, lineno: int | None) -> Any:
        return original(traceback.FrameSummary(filename, lineno, "", line=""))

    def cached(frame: traceback.FrameSummary) -> Any:
        return by_location(frame.filename, frame.lineno)

    cached.cached_by_preview = True  # type: ignore[attr-defined]
    sdk_resource._get_source_position_for_frame = cached


_cache_source_positions()

#: ``_get_stack_trace`` as the SDK ships it (the preview installs :func:`stack_trace` in its place).
_SDK_STACK_TRACE = sdk_resource._get_stack_trace


@lru_cache(maxsize=65536)
def _stack_frame(filename: str, lineno: int | None) -> Any:
    position = sdk_resource._get_source_position_for_frame(traceback.FrameSummary(filename, lineno, "", line=""))
    return source_pb2.StackFrame(pc=position)


def stack_trace() -> Any:
    """The SDK's ``_get_stack_trace`` (the same message), without ``traceback.extract_stack``.

    Every registration sends the Python stack below the resource's own constructor; the SDK builds it
    with ``traceback.extract_stack``, which stats each frame's file and reads its source line, then
    drops both. The stack of a component's child is some 30 frames deep, so that was the largest single
    cost of a registration. This walks the frames directly and keeps what the SDK keeps (file, line),
    cutting the stack at the same place: below the third ``__init__`` frame from the top.
    """
    frame: FrameType | None = sys._getframe(1)
    inits = 0
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            inits += 1
            if inits == 3:
                break
        frame = frame.f_back
    outer = frame.f_back if frame is not None else None
    if outer is None:  # fewer than three constructors, or the third is the outermost frame
        return source_pb2.StackTrace()
    frames = []
    while outer is not None:
        frames.append(_stack_frame(outer.f_code.co_filename, outer.f_lineno))
        outer = outer.f_back
    return source_pb2.StackTrace(frames=frames)


sdk_resource._get_stack_trace = stack_trace


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


class _EchoMocks(pulumi.runtime.Mocks):
    """Every resource gets its inputs back as state; ids are stable and readable."""

    def __init__(self) -> None:
        self.last_inputs: dict[str, Any] = {}

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        self.last_inputs = args.inputs
        return f"{args.name}-id", args.inputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


class RecordingMonitor(MockMonitor):  # type: ignore[misc]
    """The SDK's mock monitor, plus a record of each registration (serialised, so the echo is unambiguous)."""

    def __init__(self, listeners: Sequence[Callable[[RecordedResource], None]] = ()) -> None:
        self.echo = _EchoMocks()
        super().__init__(self.echo)
        self._lock = threading.Lock()
        self.recorded: list[RecordedResource] = []
        self.listeners = list(listeners)

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        """URNs as the engine makes them (``resource.NewURN``), not as the SDK's mock does: a child's type
        is its parent's whole qualified type chain plus its own, and the root stack adds nothing. The
        mock takes only the parent's last type and prefixes ``pulumi:pulumi:Stack$`` to every top-level
        component, so its URNs (and the policies' view of them) differed from ``pulumi preview``'s."""
        if parent:
            qualified = parent.split("::")[2]
            if qualified != ROOT_STACK_TYPE:
                type_ = f"{qualified}${type_}"
        return "urn:pulumi:" + "::".join([pulumi.get_stack(), pulumi.get_project(), type_, name])

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (gRPC method name)
        with self._lock:
            self.echo.last_inputs = {}
            response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
            if request.type == ROOT_STACK_TYPE:
                return response
            record = RecordedResource(
                type_token=request.type,
                name=request.name,
                urn=response.urn,
                parent_urn=request.parent or None,
                custom=bool(request.custom),
                provider=request.provider or None,
                inputs=normalise(self.echo.last_inputs),
                dependencies=tuple(sorted(request.dependencies)),
                retain_on_delete=bool(request.retainOnDelete),
                delete_before_replace=bool(request.deleteBeforeReplace),
                ignore_changes=tuple(request.ignoreChanges),
            )
            self.recorded.append(record)
            for listener in self.listeners:
                listener(record)
            return response

    def ReadResource(self, request: Any) -> Any:  # noqa: N802 (gRPC method name)
        """A read of a live object (``ResourceOptions(id=...)``): answered like the SDK's mock, not recorded
        (the stack does not manage it), and under the lock, so its echo never lands on a registration."""
        with self._lock:
            return super().ReadResource(request)  # type: ignore[no-untyped-call]

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
    """Point the Pulumi runtime at a fresh recording mock engine (process-global: call once per run or test).

    The SDK's ``set_mocks`` creates a root stack resource only when none exists, so without the reset a
    second run in one process (another stack, a test after a test) kept the first run's root, and every
    top-level component of the second run had a parent URN naming the first run's stack."""
    monitor = RecordingMonitor(listeners)
    pulumi_settings.set_root_resource(None)  # type: ignore[arg-type]
    pulumi.runtime.set_mocks(monitor.echo, project=project, stack=stack, preview=True, monitor=monitor)
    pulumi.runtime.set_all_config(dict(config or {}))
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

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> None:
        fn()

    with program_gc():
        program()


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
