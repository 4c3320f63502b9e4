"""The provider side of a component package: Pulumi's component provider host, for ``nvidia_gpu.package``.

``pulumi.provider.experimental.component.ComponentProvider`` infers a package schema from component
classes' annotations and constructs them when the engine asks; ``pulumi.provider.main`` serves it over
gRPC. Both are experimental (the module says so), and the host reports any exception from a component's
constructor as an unexpected one, wrapped in ``pulumi.provider.server.ComponentInitError``. This module
is the package's only way to them: :func:`schema` and :func:`serve`, which lets the caller turn a
constructor's own errors into input-property errors the engine shows without a traceback, and refine the
inferred schema before it is served (typed settings objects: :mod:`nvidia_gpu.sdk.schematypes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pulumi
from pulumi.errors import InputPropertiesError
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ComponentInitError

Components = Sequence[type[pulumi.ComponentResource]]
#: What the served schema is made of the inferred one (both as JSON values): see :mod:`nvidia_gpu.sdk.schematypes`.
Refine = Callable[[dict[str, Any]], dict[str, Any]]
#: What a constructor's exception is reported as: None to let the host report it (as unexpected), or the
#: input-property problems it names, ``(property path, reason)`` each.
ErrorTranslation = Callable[[Exception], Sequence[tuple[str, str]] | None]


def _refined(provider: Any, refine: Refine | None) -> Any:
    """``provider`` serving its inferred schema as ``refine`` makes it (``Provider.schema``, which ``GetSchema``
    answers with)."""
    text: str | None = provider.schema
    if text is None:  # the host always infers one; a None would be an SDK change to see at once
        raise RuntimeError("the component provider host inferred no schema")
    if refine is not None:
        provider.schema = json.dumps(refine(json.loads(text)))
    return provider


def schema(components: Components, package: str, version: str, *, refine: Refine | None = None) -> str:
    """The schema (JSON text) the host serves for ``components`` as package ``package`` at ``version``, the
    inferred one as ``refine`` makes it: what the engine receives from ``pulumi package get-schema``."""
    text: str = _refined(ComponentProvider(list(components), package, None, version), refine).schema
    return text


def host(components: Components, package: str, version: str, input_problems: ErrorTranslation, *,
         refine: Refine | None = None) -> Any:
    """The provider :func:`serve` serves: the SDK's component provider host for ``components`` (package
    ``package`` at ``version``, its schema as ``refine`` makes it), except that a constructor's exception for
    which ``input_problems`` names problems reaches the engine as an ``InputPropertiesError`` with that
    message, not as an unexpected one. The constructors get their inputs as the inferred schema says (the
    refined one types only what the engine and the SDKs see)."""

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

    return _refined(Provider(list(components), package, None, version), refine)


def serve(components: Components, package: str, version: str, args: Sequence[str],
          input_problems: ErrorTranslation, *, refine: Refine | None = None) -> None:
    """Serve :func:`host`'s provider to the engine; returns when the engine is done. ``args`` are the plugin's
    command-line arguments (the engine passes the plugin's directory, then its own address), as
    ``component_provider_host`` takes them."""
    main(host(components, package, version, input_problems, refine=refine), list(args))
