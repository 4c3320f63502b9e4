"""The program's runtime: the SDK's mock engine (the offline preview and the tests) and the runtime's settings.

``pulumi.runtime.mocks`` is the SDK's unit-test support: a ``MockMonitor`` answers the program's gRPC
calls in-process, ``set_mocks`` points the runtime at it, and ``pulumi.runtime.test`` runs a function
until every Output has settled. The preview needs more of it than a unit test does, and all of that
leans on internals (``tests/nvidia_gpu/sdk`` pins them):

* the raw ``RegisterResource`` request, to record what the real engine would receive (type token,
  parent, provider, dependencies, options), and the deserialised inputs the SDK hands its ``Mocks``;
* ``MockMonitor.make_urn``, replaced by the engine's own URN rule;
* ``pulumi.runtime.settings.set_root_resource``, to start every run with a fresh root stack resource.

:class:`EchoMonitor` is that monitor; the caller sees plain :class:`Registration` values, never a
protobuf request. The runtime's settings a program reads (its stack config as the engine passed it,
whether this is a preview, whether a mock serves it) are ``pulumi.runtime`` functions too, so they are
here as well.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.runtime import config as sdk_config
from pulumi.runtime import mocks as sdk_mocks
from pulumi.runtime import settings as sdk_settings

from nvidia_gpu.sdk import ROOT_STACK_TYPE


@dataclass(frozen=True)
class Registration:
    """One ``RegisterResource`` call, as the engine would receive it (the inputs as the SDK deserialised them)."""

    type_token: str
    name: str
    urn: str
    parent_urn: str | None
    custom: bool
    provider: str | None
    inputs: dict[str, Any]
    dependencies: tuple[str, ...] = ()
    retain_on_delete: bool = False
    delete_before_replace: bool = False
    #: Input paths the engine keeps at their old values (``ResourceOptions.ignore_changes``).
    ignore_changes: tuple[str, ...] = ()


class _EchoMocks(sdk_mocks.Mocks):
    """Every resource gets its inputs back as state; ids are stable and readable."""

    def __init__(self) -> None:
        self.last_inputs: dict[str, Any] = {}

    def new_resource(self, args: sdk_mocks.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        self.last_inputs = args.inputs
        return f"{args.name}-id", args.inputs

    def call(self, args: sdk_mocks.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


class EchoMonitor(sdk_mocks.MockMonitor):  # type: ignore[misc]
    """The SDK's mock monitor: each resource's inputs echoed back as its state (id ``<name>-id``), URNs made as
    the engine makes them, and every registration but the root stack's handed to :meth:`on_register`.

    Registrations and reads are serialised, so the echo a registration reads is its own; :meth:`on_register`
    runs inside that lock.
    """

    def __init__(self) -> None:
        # Name-mangled, so a subclass's own ``_lock`` (the preview's record has one) never replaces this one:
        # on_register runs under it, and a non-reentrant lock taken twice hangs the program.
        self.__echo = _EchoMocks()
        super().__init__(self.__echo)
        self.__lock = threading.Lock()

    def on_register(self, registration: Registration) -> None:
        """Called once per registered resource (not for the root stack); the default does nothing."""

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
        with self.__lock:
            self.__echo.last_inputs = {}
            response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
            if request.type == ROOT_STACK_TYPE:
                return response
            self.on_register(Registration(
                type_token=request.type,
                name=request.name,
                urn=response.urn,
                parent_urn=request.parent or None,
                custom=bool(request.custom),
                provider=request.provider or None,
                inputs=self.__echo.last_inputs,
                dependencies=tuple(request.dependencies),
                retain_on_delete=bool(request.retainOnDelete),
                delete_before_replace=bool(request.deleteBeforeReplace),
                ignore_changes=tuple(request.ignoreChanges),
            ))
            return response

    def ReadResource(self, request: Any) -> Any:  # noqa: N802 (gRPC method name)
        """A read of a live object (``ResourceOptions(id=...)``): answered like the SDK's mock, not handed to
        :meth:`on_register` (the stack does not manage it), and under the lock, so its echo never lands on a
        registration."""
        with self.__lock:
            return super().ReadResource(request)  # type: ignore[no-untyped-call]


def install(monitor: EchoMonitor, project: str, stack: str, config: Mapping[str, str]) -> None:
    """Point the Pulumi runtime at ``monitor`` for a preview of ``project``/``stack`` with ``config`` (full keys,
    ``nvidia-gpu:cluster``, values as the CLI passes them). Process-global: once per run or test.

    The SDK's ``set_mocks`` creates a root stack resource only when none exists, so without the reset a
    second run in one process (another stack, a test after a test) kept the first run's root, and every
    top-level component of the second run had a parent URN naming the first run's stack."""
    sdk_settings.set_root_resource(None)  # type: ignore[arg-type]
    sdk_mocks.set_mocks(monitor.mocks, project=project, stack=stack, preview=True, monitor=monitor)
    set_config(config)


def set_config(config: Mapping[str, str]) -> None:
    """Replace the running program's whole stack config (what ``pulumi.Config`` reads) with ``config``."""
    sdk_config.set_all_config(dict(config))


def program_config() -> dict[str, Any]:
    """The running program's whole stack config, full keys (``nvidia-gpu:cluster``) to values as the engine
    passed them: its environment's (``PULUMI_CONFIG``) with what :func:`set_config` set over it."""
    return {**sdk_config.get_config_env(), **sdk_config.CONFIG.get()}


def is_preview() -> bool:
    """Whether the running program is a preview (``pulumi preview``, the offline preview), not an update."""
    return bool(sdk_settings.is_dry_run())


def run_as_program(fn: Callable[[], object]) -> None:
    """Run ``fn`` as a Pulumi program under the installed mock engine and wait until every registration and
    Output it started has settled (the SDK's ``pulumi.runtime.test``); its exception propagates."""

    @sdk_mocks.test  # type: ignore[untyped-decorator]
    def program() -> None:
        fn()

    program()


def under_mock_engine() -> bool:
    """Whether the running program is served by a mock monitor (the offline preview, a test) rather than an engine."""
    return isinstance(sdk_settings.get_monitor(), sdk_mocks.MockMonitor)
