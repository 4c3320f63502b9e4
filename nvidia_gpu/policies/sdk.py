"""The one place the pack reaches into ``pulumi_policy``'s internals: deserialize a resource once per request.

``pulumi_policy`` (1.21) answers ``Analyze`` by looping over the pack's policies and, for each one,
turning the request's protobuf ``Struct`` into a dict (``json_format.MessageToDict``) and then into
Python values (``deserialize_properties``). ``AnalyzeStack`` does the same for every resource, once per
stack policy. With eight resource policies that is eight full conversions of every resource: on a
driver DaemonSet one conversion costs about 0.3 ms, more than all of our rules together
(``bench/bench_policies.py``).

The conversions are pure functions of the request, and every policy receives the result through the
SDK's read-only ``unknown_checking_proxy``, so one conversion per message per request is safe to share.
:func:`install` wraps the two servicer methods so each call opens a memo scope (per thread: the SDK
serves requests on a thread pool) and swaps the two module-level names ``policy.py`` calls for ones
that consult the scope. Outside a scope, for example ``Remediate``, the originals run unchanged.

The memo holds a strong reference to each message it has seen, so an ``id`` is never reused while
the scope lives, and the scope ends with the call. :data:`SDK_VERSION` names the SDK this was read
against; ``tests/nvidia_gpu/policies/test_policy_sdk.py`` fails when the SDK changes under it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from google.protobuf import json_format
from pulumi_policy import policy as _policy

#: The ``pulumi-policy`` release whose ``_PolicyAnalyzerServicer`` this adapter was written against.
SDK_VERSION = "1.21.0"
_SERVICER = _policy._PolicyAnalyzerServicer
_WRAPPED = ("Analyze", "AnalyzeStack")
#: The module-level conversions ``policy.py`` runs per policy; ``json_format.MessageToDict`` is the third.
_STEPS = ("deserialize_properties", "unknown_checking_proxy")
_scope = threading.local()


class _Memo:
    """One request's conversions, keyed by the step, the input's ``id`` and the step's other arguments.

    Each entry keeps its input alive, so an ``id`` cannot be reused while the memo lives."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, int, tuple[Any, ...]], tuple[object, Any]] = {}


def _current() -> _Memo | None:
    memo: _Memo | None = getattr(_scope, "memo", None)
    return memo


@contextmanager
def request_scope() -> Iterator[_Memo]:
    """Share conversions until the block ends; nested scopes reuse the outer one."""
    outer = _current()
    if outer is not None:
        yield outer
        return
    _scope.memo = memo = _Memo()
    try:
        yield memo
    finally:
        _scope.memo = None


def _memoised(step: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` once per distinct input object within a request scope; unchanged outside one."""

    @functools.wraps(original)
    def convert(value: Any, *args: Any, **kwargs: Any) -> Any:
        memo = _current()
        if memo is None or kwargs:
            return original(value, *args, **kwargs)
        key = (step, id(value), args)
        hit = memo.entries.get(key)
        if hit is None:
            hit = memo.entries[key] = (value, original(value, *args))
        return hit[1]

    convert.__nvidia_gpu_memo__ = True  # type: ignore[attr-defined]
    return convert


def _scoped(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, request: Any, context: Any) -> Any:
        with request_scope():
            return method(self, request, context)

    return call


class _JsonFormat(ModuleType):
    """``json_format`` as ``policy.py`` sees it: ``MessageToDict`` memoised, everything else forwarded."""

    def __init__(self) -> None:
        super().__init__(json_format.__name__)
        self.MessageToDict = _memoised("MessageToDict", json_format.MessageToDict)

    def __getattr__(self, name: str) -> Any:
        return getattr(json_format, name)


def installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return bool(getattr(getattr(_policy, "deserialize_properties"), "__nvidia_gpu_memo__", False))  # noqa: B009


def install() -> None:
    """Make ``Analyze`` and ``AnalyzeStack`` convert each resource once per request; idempotent.

    Call before ``PolicyPack(...)``, which builds the servicer and blocks serving it.
    """
    if installed():
        return
    for step in _STEPS:
        setattr(_policy, step, _memoised(step, getattr(_policy, step)))
    setattr(_policy, "json_format", _JsonFormat())  # noqa: B010 - not a name the SDK exports
    for name in _WRAPPED:
        setattr(_SERVICER, name, _scoped(getattr(_SERVICER, name)))
