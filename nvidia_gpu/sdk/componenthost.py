"""The provider side of a component package: Pulumi's component provider host, for ``nvidia_gpu.package``.

``pulumi.provider.experimental.component.ComponentProvider`` infers a package schema from component
classes' annotations and constructs them when the engine asks; ``pulumi.provider.main`` serves it over
gRPC. Both are experimental (the module says so), and the host reports any exception from a component's
constructor as an unexpected one, wrapped in ``pulumi.provider.server.ComponentInitError``. This module
is the package's only way to them: :func:`schema` and :func:`serve`, which lets the caller turn a
constructor's own errors into input-property errors the engine shows without a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pulumi
from pulumi.errors import InputPropertiesError
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ComponentInitError

Components = Sequence[type[pulumi.ComponentResource]]
#: What a constructor's exception is reported as: None to let the host report it (as unexpected), or the
#: input-property problems it names, ``(property path, reason)`` each.
ErrorTranslation = Callable[[Exception], Sequence[tuple[str, str]] | None]


def _host(components: Components, package: str, version: str) -> Any:
    return ComponentProvider(list(components), package, None, version)


def schema(components: Components, package: str, version: str) -> str:
    """The schema (JSON text) the host infers for ``components`` as package ``package`` at ``version``: what
    the engine receives from ``pulumi package get-schema``."""
    text: str | None = _host(components, package, version).schema
    if text is None:  # the host always infers one; a None would be an SDK change to see at once
        raise RuntimeError("the component provider host inferred no schema")
    return text


def host(components: Components, package: str, version: str, input_problems: ErrorTranslation) -> Any:
    """The provider :func:`serve` serves: the SDK's component provider host for ``components`` (package
    ``package`` at ``version``), except that a constructor's exception for which ``input_problems`` names
    problems reaches the engine as an ``InputPropertiesError`` with that message, not as an unexpected one."""

    class Provider(ComponentProvider):  # type: ignore[misc]  # the SDK's classes are untyped
        def construct(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().construct(*args, **kwargs)
            except ComponentInitError as e:
                problems = input_problems(e.inner)
                if problems is not None:
                    raise InputPropertiesError(str(e.inner), [
                        {"property_path": path, "reason": reason} for path, reason in problems]) from None
                raise

    return Provider(list(components), package, None, version)


def serve(components: Components, package: str, version: str, args: Sequence[str],
          input_problems: ErrorTranslation) -> None:
    """Serve :func:`host`'s provider to the engine; returns when the engine is done. ``args`` are the plugin's
    command-line arguments (the engine passes the plugin's directory, then its own address), as
    ``component_provider_host`` takes them."""
    main(host(components, package, version, input_problems), list(args))
