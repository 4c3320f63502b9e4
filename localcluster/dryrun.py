"""Every rendered object through a real API server: server-side apply with ``dryRun=All``.

Schemas accept objects a real API server refuses: names and keys that break Kubernetes' own
validation, CEL that does not compile, a namespace nobody creates, a patch of an object that does not
exist. Dry-run runs all of that (defaulting, validation, admission including ValidatingAdmissionPolicy
and Pod Security) and persists nothing.

Two modes. On a throwaway control plane (``ephemeral``) the stack's preconditions are put in place
for real first and listed: the CRDs it needs, the stack's own namespaces (a dry-run namespace does not
exist for the objects in it), namespaces it only references, and the objects it patches, made by the
caller's ``placeholder`` (the preview's makes the Deckhouse NodeGroups a stack patches).
Against a user's cluster nothing is written: a missing precondition is itself the finding, and
objects in a namespace the stack has yet to create are only checked once it exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcluster.client import ApiError, Kube, describe

FIELD_MANAGER = "nvidia-gpu"
#: What the harness applies as the cluster's own (the NodeGroups a stack patches, namespaces it needs).
PRECONDITIONS_MANAGER = "nvidia-gpu-preconditions"


@dataclass(frozen=True)
class Item:
    """One object to check; ``label`` names it in findings (a manifest file name), ``patch`` marks a
    partial object applied onto one another controller owns."""

    label: str
    object: dict[str, Any]
    patch: bool = False


@dataclass
class DryRunReport:
    server: str
    version: str
    checked: int = 0
    #: ``(label, message)``: the API server refused the object.
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: ``(label, message)``: something the stack needs is not in the cluster (user mode).
    missing: list[tuple[str, str]] = field(default_factory=list)
    #: ``(label, text)``: warnings the server sent while accepting an object.
    warnings: list[tuple[str, str]] = field(default_factory=list)
    #: What had to exist first (ephemeral mode: created; user mode: found).
    preconditions: list[str] = field(default_factory=list)
    #: ``(label, why)``: objects that could not be checked in this cluster yet.
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused and not self.missing


def server_version(kube: Kube) -> str:
    doc = kube.request("GET", "/version")
    return str(doc.get("gitVersion", "?"))


#: The ``x-`` extensions a CRD schema (``JSONSchemaProps``) declares; the API server refuses others.
CRD_SCHEMA_EXTENSIONS = frozenset({
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-validations",
})


def without_doc_keys(node: Any) -> Any:
    """``node`` without undeclared ``x-`` keys: Deckhouse's CRD sources carry documentation
    extensions (``x-doc-*``) and built-in-only hints (``x-kubernetes-patch-merge-key``) that its
    installer strips, and the API server refuses them as fields not declared in the schema."""
    if isinstance(node, dict):
        return {k: without_doc_keys(v) for k, v in node.items()
                if not (str(k).startswith("x-") and k not in CRD_SCHEMA_EXTENSIONS)}
    if isinstance(node, list):
        return [without_doc_keys(v) for v in node]
    return node


def install_crds(kube: Kube, paths: Sequence[Path]) -> list[str]:
    """Apply CRDs for real and wait until each is served (:func:`wait_crds_served`); answers their names."""
    names: list[str] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                kube.apply(without_doc_keys(doc), field_manager=PRECONDITIONS_MANAGER)
                names.append(doc["metadata"]["name"])
    wait_crds_served(kube, names)
    return names


def wait_crds_served(kube: Kube, names: Sequence[str], timeout: float = 60.0) -> None:
    """Wait until each CRD is Established and its objects can be listed: right after Established the API
    server still answers 429 ("storage is (re)initializing") for a while, which a client must not take
    for a refusal."""
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True" and _lists(kube, crd):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not served after {timeout:.0f} s (conditions {conditions})")
            time.sleep(0.1)
    kube.forget_discovery()


def _lists(kube: Kube, crd: dict[str, Any]) -> bool:
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("storage"))
    try:
        kube.request("GET", f"/apis/{spec['group']}/{version}/{spec['names']['plural']}", query={"limit": "1"})
    except ApiError as e:
        if e.status == 429:
            return False
        raise
    return True


#: Makes the object a patch targets, as its owner would have created it, or None when it cannot.
Placeholder = Callable[[dict[str, Any]], dict[str, Any] | None]


def no_placeholder(obj: dict[str, Any]) -> dict[str, Any] | None:
    del obj
    return None


def dry_run(kube: Kube, items: Sequence[Item], *, ephemeral: bool, commit: bool = False,
            placeholder: Placeholder = no_placeholder) -> DryRunReport:
    """Check ``items`` in apply order; see the module docstring for the two modes.

    ``commit`` (ephemeral mode only: tests that need the stack in place) applies each object for
    real instead of dry-running it, with the same preconditions. ``placeholder`` (ephemeral mode) creates
    the target of a patch that does not exist yet, as its owner would (the caller knows the owners).
    """
    if commit and not ephemeral:
        raise ValueError("commit applies for real: only on a throwaway control plane")
    report = DryRunReport(server=kube.server, version=server_version(kube))
    own_namespaces = {i.object["metadata"]["name"] for i in items if i.object.get("kind") == "Namespace"}
    referenced = sorted({ns for i in items if (ns := (i.object.get("metadata") or {}).get("namespace"))}
                        - own_namespaces)
    missing_ns: set[str] = set()
    for ns in sorted(own_namespaces) + referenced:
        exists = kube.get_or_none("v1", "Namespace", ns) is not None
        if ephemeral:
            if ns in own_namespaces:
                ns_obj = next(i.object for i in items if i.object.get("kind") == "Namespace"
                              and i.object["metadata"]["name"] == ns)
                _check(kube, report, next(i for i in items if i.object is ns_obj), commit=False)
                if not exists:
                    kube.apply(ns_obj, field_manager=FIELD_MANAGER)
            elif not exists:
                kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                           field_manager=PRECONDITIONS_MANAGER)
                report.preconditions.append(f"Namespace {ns} (referenced, not created by the stack)")
        elif not exists:
            if ns in own_namespaces:
                missing_ns.add(ns)
            else:
                report.missing.append((f"Namespace {ns}",
                                       "objects of the stack live in this namespace, which the stack does not "
                                       "create and the cluster does not have"))
    for item in items:
        meta = item.object.get("metadata") or {}
        if ephemeral and item.object.get("kind") == "Namespace" and meta.get("name") in own_namespaces:
            continue  # checked above, before it was created
        if meta.get("namespace") in missing_ns:
            report.skipped.append((item.label, f"namespace {meta['namespace']} is created by this stack and "
                                                "does not exist in the cluster yet"))
            continue
        if item.patch:
            try:
                res = kube.resource(item.object["apiVersion"], item.object["kind"])
            except ApiError as e:
                report.refused.append((item.label, e.message))
                continue
            target = kube.get_or_none(item.object["apiVersion"], item.object["kind"], meta.get("name", ""),
                                      meta.get("namespace") if res.namespaced else None)
            if target is None:
                target = placeholder(item.object) if ephemeral else None
                if target is None:
                    report.missing.append((item.label, f"the stack patches {describe(item.object)}, which does "
                                                       "not exist: a patch never creates its target"))
                    continue
                kube.apply(target, field_manager=PRECONDITIONS_MANAGER)
                report.preconditions.append(f"{describe(target)} (patched by the stack, created by its owner)")
        _check(kube, report, item, commit=commit)
    return report


def _check(kube: Kube, report: DryRunReport, item: Item, *, commit: bool) -> None:
    before = len(kube.warnings)
    report.checked += 1
    try:
        kube.apply(item.object, field_manager=FIELD_MANAGER, dry_run=not commit)
    except ApiError as e:
        report.refused.append((item.label, e.message or f"{e.status} {e.reason}"))
    report.warnings.extend((item.label, text) for _, text in kube.warnings[before:])

