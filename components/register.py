"""Turns a manifest dict into the matching pulumi_kubernetes resource, so components stay declarative.

Typed classes are used for built-in kinds (their type tokens are what policies match on, e.g.
``kubernetes:apps/v1:DaemonSet``); any other kind is a ``CustomResource``, and partial objects
applied with server-side apply are ``CustomResourcePatch``. Object names always come from the
manifest, never from Pulumi's auto-naming, so the preview's files equal what ``pulumi up`` sends.
"""

from __future__ import annotations

import re
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.manifests import Manifest

_TYPED: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
}

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def _kwargs(manifest: Manifest) -> dict[str, Any]:
    """Top-level fields as the typed classes' snake_case keyword arguments (``roleRef`` → ``role_ref``)."""
    return {
        _CAMEL.sub("_", key).lower(): value
        for key, value in manifest.items()
        if key not in ("apiVersion", "kind")
    }


def register(name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Register ``manifest`` as a whole object; named objects are deleted before a replacement is created."""
    opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True))
    key = (manifest["apiVersion"], manifest["kind"])
    cls = _TYPED.get(key)
    if cls is not None:
        resource: pulumi.CustomResource = cls(name, opts=opts, **_kwargs(manifest))
        return resource
    extra = set(manifest) - {"apiVersion", "kind", "metadata", "spec"}
    if extra:
        raise ValueError(f"{key[1]} {name}: custom resources carry only metadata and spec, not {sorted(extra)}")
    return k8s.apiextensions.CustomResource(
        name, api_version=key[0], kind=key[1], metadata=manifest.get("metadata"), spec=manifest.get("spec"), opts=opts
    )


def register_patch(name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Server-side-apply only the fields in ``manifest`` onto an object someone else owns."""
    return k8s.apiextensions.CustomResourcePatch(
        name,
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        metadata=manifest.get("metadata"),
        spec=manifest.get("spec"),
        opts=opts,
    )
