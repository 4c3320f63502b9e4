"""Registers a manifest dict as the Kubernetes provider resource for its kind, so components stay declarative.

Every object is registered under the provider's own type token, ``kubernetes:<apiVersion>:<kind>``
(``...Patch`` for server-side-apply patches), with the manifest as its properties: exactly what
pulumi_kubernetes' typed classes and ``apiextensions.CustomResource`` send to the engine, and what the
policies match on. The typed classes are not used because they re-translate every nested key of
inputs that are already in Kubernetes' camelCase shape, which doubled the registration cost in
``bench/bench_preview.py``; the preview validates the same objects against the real OpenAPI schemas,
a stronger check than the typed classes' signatures. Object names always come from the manifest,
never from Pulumi's auto-naming, so the preview's files equal what ``pulumi up`` sends.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes

from nvidia_gpu.components import inputs
from nvidia_gpu.components.manifests import Manifest

#: Pins the provider plugin like pulumi_kubernetes' own classes do (used when no explicit provider is given).
PROVIDER_VERSION = version("pulumi-kubernetes")


def type_token(api_version: str, kind: str, *, patch: bool = False) -> str:
    """The provider's token: the core group is spelled ``core/v1`` (``kubernetes:core/v1:Namespace``)."""
    group_version = f"core/{api_version}" if "/" not in api_version else api_version
    return f"kubernetes:{group_version}:{kind}{'Patch' if patch else ''}"


_SDK_DIR = Path(pulumi_kubernetes.__file__).parent


@cache
def aliases(api_version: str, kind: str, *, patch: bool = False) -> tuple[str, ...]:
    """The type tokens of ``kind`` in its group's other API versions, as pulumi_kubernetes' typed class
    declares them as aliases: a later move to another version keeps the resource (no delete-then-create).

    Found from the SDK's files (``pulumi_kubernetes/<group>/<version>/<Kind>.py``), without importing them.
    """
    group, _, version = api_version.rpartition("/")
    if group and not group.endswith(".k8s.io") and "." in group:
        return ()  # not a Kubernetes API group (a CRD such as Deckhouse's): the SDK has no typed class
    module = _SDK_DIR / (group.split(".")[0] if group else "core")
    name = f"{kind}{'Patch' if patch else ''}.py"
    if not module.is_dir():
        return ()
    others = sorted(d.name for d in module.iterdir() if d.is_dir() and d.name != version and (d / name).is_file())
    return tuple(type_token(f"{group}/{v}" if group else v, kind, patch=patch) for v in others)


class KubernetesObject(pulumi.CustomResource):
    """One Kubernetes API object (or a server-side-apply patch of one) managed by the Kubernetes provider."""

    def __init__(
        self,
        name: str,
        manifest: Manifest,
        opts: pulumi.ResourceOptions,
        *,
        patch: bool = False,
        delete_before_replace: bool = False,
    ) -> None:
        if "apiVersion" not in manifest or "kind" not in manifest:
            raise ValueError(f"{name}: a manifest needs apiVersion and kind")
        token = type_token(manifest["apiVersion"], manifest["kind"], patch=patch)
        # Outputs the user passed (a namespace, an image) back in place of their stand-ins (see inputs).
        props: dict[str, Any] = inputs.bind(dict(manifest))
        ours = pulumi.ResourceOptions(version=PROVIDER_VERSION, delete_before_replace=delete_before_replace or None,
                                      aliases=[pulumi.Alias(type_=t) for t in
                                               aliases(manifest["apiVersion"], manifest["kind"], patch=patch)] or None)
        super().__init__(token, name, props, pulumi.ResourceOptions.merge(opts, ours))


def register(name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Register ``manifest`` as a whole object; named objects are deleted before a replacement is created."""
    return KubernetesObject(name, manifest, opts, delete_before_replace=True)


def register_patch(name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Server-side-apply only the fields in ``manifest`` onto an object someone else owns."""
    return KubernetesObject(name, manifest, opts, patch=True)


class KubernetesRead(pulumi.CustomResource):
    """A live object read through the provider (``pulumi.ResourceOptions(id=...)``): nothing is managed.

    Reading at preview makes a missing object fail there, and lets a component look at what others own
    (``managedFields``) before it applies its own fields.
    """

    metadata: pulumi.Output[dict[str, Any]]
    spec: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, api_version: str, kind: str, object_id: str, opts: pulumi.ResourceOptions) -> None:
        props: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": None, "spec": None}
        ours = pulumi.ResourceOptions(version=PROVIDER_VERSION, id=object_id)
        super().__init__(type_token(api_version, kind), name, props, pulumi.ResourceOptions.merge(opts, ours))
