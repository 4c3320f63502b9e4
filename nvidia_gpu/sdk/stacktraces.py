"""Faster stack traces for resource registrations: the SDK's private ``_get_stack_trace``, replaced.

Every registration sends the engine the Python stack below the resource's own constructor, as a
``pulumi.runtime.proto.source_pb2.StackTrace``. The SDK builds it in ``pulumi.runtime.resource``'s
private ``_get_stack_trace`` (with ``traceback.extract_stack``) and converts each frame with the private
``_get_source_position_for_frame``; both were the largest single costs of a registration in the
offline preview. :func:`install` swaps in :func:`stack_trace`, which builds the same message; it is an
internal of ``pulumi.runtime``, so it lives in this adapter (``tests/nvidia_gpu/sdk`` pins its shape).
"""

from __future__ import annotations

import sys
import traceback
from functools import lru_cache
from types import FrameType
from typing import Any

from pulumi.runtime import resource as sdk_resource
from pulumi.runtime.proto import source_pb2

#: ``_get_stack_trace`` as the SDK ships it (:func:`install` puts :func:`stack_trace` in its place).
sdk_stack_trace = sdk_resource._get_stack_trace


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


def install() -> None:
    """Make every registration in this process use :func:`stack_trace` and the memoised source positions
    (idempotent: a second call changes nothing)."""
    _cache_source_positions()
    sdk_resource._get_stack_trace = stack_trace
