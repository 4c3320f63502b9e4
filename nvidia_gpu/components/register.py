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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from typing import Any, Literal

import pulumi

from nvidia_gpu.components import inputs
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.sdk import k8stypes

#: Pins the provider plugin like pulumi_kubernetes' own classes do (used when no explicit provider is given).
PROVIDER_VERSION = version("pulumi-kubernetes")


def type_token(api_version: str, kind: str, *, patch: bool = False) -> str:
    """The provider's token: the core group is spelled ``core/v1`` (``kubernetes:core/v1:Namespace``)."""
    group_version = f"core/{api_version}" if "/" not in api_version else api_version
    return f"kubernetes:{group_version}:{kind}{'Patch' if patch else ''}"


@cache
def aliases(api_version: str, kind: str, *, patch: bool = False) -> tuple[str, ...]:
    """The type tokens of ``kind`` in its group's other API versions, as pulumi_kubernetes' typed class
    declares them as aliases: a later move to another version keeps the resource (no delete-then-create).

    Found from the SDK's type-token table (:mod:`nvidia_gpu.sdk.k8stypes`), without importing the classes; a
    group outside Kubernetes' own (a CRD such as Deckhouse's) has none.
    """
    group, _, version = api_version.rpartition("/")
    others = [v for v in k8stypes.typed_versions(group, f"{kind}{'Patch' if patch else ''}") if v != version]
    return tuple(type_token(f"{group}/{v}" if group else v, kind, patch=patch) for v in others)


@dataclass(frozen=True)
class Registered:
    """One object the program registered: applied whole, patched (server-side apply of some fields), or read."""

    manifest: Manifest
    mode: Literal["object", "patch", "read"]


_recorders: list[list[Registered]] = []


@contextmanager
def recording() -> Iterator[list[Registered]]:
    """Every object registered inside the block, in order: what the stack applies, read from the one place
    that registers it, so the preview identity's RBAC is derived from it rather than kept by hand."""
    seen: list[Registered] = []
    _recorders.append(seen)
    try:
        yield seen
    finally:
        # By identity: nested recordings hold equal lists, and list.remove compares by value.
        _recorders[:] = [r for r in _recorders if r is not seen]


def _record(manifest: Manifest, mode: Literal["object", "patch", "read"]) -> None:
    for seen in _recorders:
        seen.append(Registered(manifest, mode))


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
        _record(manifest, "patch" if patch else "object")
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
        _record({"apiVersion": api_version, "kind": kind, "metadata": {"name": object_id}}, "read")
        super().__init__(type_token(api_version, kind), name, props, pulumi.ResourceOptions.merge(opts, ours))


def register_shared(name: str, manifest: Manifest, owner: pulumi.Resource | None,
                    opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Register a cluster-wide definition every stack on the cluster applies alike (the rule is in
    :mod:`nvidia_gpu.components.manifests.shared`): an owner reference to this stack's Namespace
    (``owner``), so the garbage collector deletes the object once no owning namespace is left, and
    retained by Pulumi on destroy, so one stack's destroy never removes what another stack still uses.

    ``owner`` is None for a platform deployed elsewhere: the object then has no owner of ours and stays
    until it is deleted by hand (the docs say how)."""
    body: dict[str, Any] = dict(manifest)
    if owner is not None:
        def references(metadata: Any) -> list[dict[str, str]]:
            """Empty while the namespace's UID is not known (a preview of a new stack, the offline preview)."""
            meta = metadata if isinstance(metadata, dict) else {}
            uid, owner_name = meta.get("uid"), meta.get("name")
            if not uid or not owner_name:
                return []
            return [{"apiVersion": "v1", "kind": "Namespace", "name": str(owner_name), "uid": str(uid)}]

        owner_metadata: pulumi.Output[Any] = owner.metadata  # type: ignore[attr-defined]
        body["metadata"] = {**(body.get("metadata") or {}), "ownerReferences": owner_metadata.apply(references)}
    retained = pulumi.ResourceOptions(retain_on_delete=True)
    return KubernetesObject(name, body, pulumi.ResourceOptions.merge(opts, retained), delete_before_replace=True)


#: The Patch resources' annotation for server-side apply's force (the provider reads it, and keeps it on the object).
PATCH_FORCE_ANNOTATION = "pulumi.com/patchForce"
#: A ConfigMap's content: owned by its data patch, never by the ConfigMap resource (see ``register_config_map``).
CONFIG_MAP_CONTENT = ("data", "binaryData")


def config_map_parts(manifest: Manifest) -> tuple[Manifest, Manifest]:
    """``manifest`` split into the ConfigMap object (identity, labels) and its data patch (the content, forced).

    The patch carries only the identity and the content: every field it names is one it owns, so the
    object's labels stay the ConfigMap resource's."""
    meta = manifest.get("metadata") or {}
    obj = {k: v for k, v in manifest.items() if k not in CONFIG_MAP_CONTENT}
    patch: dict[str, Any] = {
        "apiVersion": manifest["apiVersion"], "kind": manifest["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                     "annotations": {PATCH_FORCE_ANNOTATION: "true"}},
        **{k: manifest[k] for k in CONFIG_MAP_CONTENT if k in manifest},
    }
    return obj, patch


def register_config_map(name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Register a fixed-name ConfigMap that agents read, so that a change of its content is an in-place
    update whichever Kubernetes provider the user hands the component; returns its data patch, the
    resource a reader waits for (it depends on the ConfigMap).

    The provider replaces a ConfigMap whose ``data`` changes (delete, then create, for a fixed name)
    unless *its* ``enableConfigMapMutable`` is set, and no per-object setting exists; a component cannot
    read that setting from the provider it is given (another language passes only a reference). A
    ``ConfigMapPatch`` is always updated in place, so:

    - the ConfigMap resource (the name and URN it always had) holds the identity and labels, is
      created first and deleted on destroy; ``ignore_changes`` on its content keeps a stack deployed
      before this split from seeing a removed ``data`` (a replace): such a ConfigMap keeps its old
      content in its state, and the provider re-applies the live content with it, never a stale one;
    - ``<name>-data``, a ``ConfigMapPatch``, owns the content with server-side apply's force (it takes
      the fields over from the ConfigMap resource of such a stack, and from a hand edit), so a changed
      ``partitionCount`` is one in-place update and the object keeps its uid. It is retained on delete:
      the ConfigMap's deletion removes the content, and relinquishing the fields first would empty the
      ConfigMap under a running reader (or re-create it, an apply, once it is gone).

    Needs the provider's server-side apply (its default; a Patch resource names the setting otherwise).
    """
    obj, patch = config_map_parts(manifest)
    config_map = KubernetesObject(name, obj, pulumi.ResourceOptions.merge(
        opts, pulumi.ResourceOptions(ignore_changes=list(CONFIG_MAP_CONTENT))), delete_before_replace=True)
    patch_opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[config_map],
                                                                           retain_on_delete=True))
    patch_opts.aliases = None  # the caller's aliases name the ConfigMap's old identities, not this new child
    return KubernetesObject(f"{name}-data", patch, patch_opts, patch=True)
