"""Other nvidia-gpu stacks on the target cluster: what this stack would collide with before it applies.

Three collisions the Kubernetes provider would find only halfway through ``up`` (its preview forces the
dry-run of objects new to the stack, so an apply conflict never shows there):

- a shared definition (:mod:`nvidia_gpu.components.manifests.shared`) that exists and is not an
  nvidia-gpu stack's (it would be taken over, then garbage-collected with this stack's namespace), or
  is another stack's and defined otherwise (another version, another DRA driver): the dry-run apply
  names the fields and who holds them;
- the stack's namespace, when another stack's (its ClusterRoles, admission policies and field managers
  are named after it, so the two stacks would fight over every one);
- a Deckhouse NodeGroup another stack already patches (its node template's labels and taints).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from nvgpu import labels
from nvgpu.stackconfig import NodeSetupBackend, StackConfig
from nvidia_gpu.components.manifests import deckhouse
from nvidia_gpu.components.manifests.meta import PART_OF
from nvidia_gpu.components.manifests.shared import SharedObject, shared_objects
from nvidia_gpu.preflight.model import ApplyProbe, ClusterReader, Finding, Severity

#: The dry-run's field manager: not any stack's, so every field some stack holds with another value shows.
PROBE_MANAGER = "nvidia-gpu-preflight"
_PART_OF = "app.kubernetes.io/part-of"
_INSTANCE = "app.kubernetes.io/instance"


def _subject(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _owning_namespaces(live: dict[str, Any]) -> set[str]:
    """The stacks (by namespace) that own a shared object: its owner references to Namespaces, or, for an
    object an older version created, its instance label."""
    meta = live.get("metadata") or {}
    owners = {str(r.get("name")) for r in meta.get("ownerReferences") or []
              if isinstance(r, dict) and r.get("kind") == "Namespace" and r.get("apiVersion") == "v1"}
    if owners:
        return owners
    instance = (meta.get("labels") or {}).get(_INSTANCE)
    return {str(instance)} if instance and (meta.get("labels") or {}).get(_PART_OF) == PART_OF else set()


def _managers_of_owner(live: dict[str, Any], uid: str | None) -> set[str]:
    """The field managers that hold this stack's owner reference: this stack's own appliers."""
    if not uid:
        return set()
    key = "k:" + json.dumps({"uid": uid}, separators=(",", ":"))
    out = set()
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:ownerReferences") or {}
        if key in fields:
            out.add(str(entry.get("manager")))
    return out


def _managers(live: dict[str, Any]) -> list[str]:
    return sorted({str(m.get("manager")) for m in (live.get("metadata") or {}).get("managedFields") or []})


def _shared(obj: SharedObject, live: dict[str, Any], namespace: str, namespace_uid: str | None,
            probe: ApplyProbe) -> Finding | None:
    subject = _subject(obj.manifest)
    stacks = _owning_namespaces(live)
    ours = (((live.get("metadata") or {}).get("labels") or {}).get(_PART_OF) == PART_OF)
    if not ours and not stacks:
        managers = ", ".join(_managers(live)) or "no field manager"
        fix = (f"set {obj.opt_out} to use it as it is" if obj.opt_out
               else "remove it, or run this stack on another cluster")
        return Finding(Severity.ERROR, subject, (
            f"exists and is not an nvidia-gpu stack's (managed by {managers}): applying the stack's would take it "
            f"over, and the garbage collector would delete it with this stack's namespace; {fix}"))
    others = sorted(stacks - {namespace})
    if not others:
        return None  # this stack's alone (or an nvidia-gpu object of no known stack: co-owned as is)
    desired = {**obj.manifest, "metadata": {k: v for k, v in obj.manifest["metadata"].items()
                                            if k != "ownerReferences"}}
    mine = _managers_of_owner(live, namespace_uid)
    clashes = [c for c in probe.conflicts(desired, PROBE_MANAGER) if c.manager not in mine]
    if not clashes:
        return None
    fields = ", ".join(sorted({c.field for c in clashes}))
    holders = ", ".join(sorted({c.manager for c in clashes}))
    where = ", ".join(others)
    return Finding(Severity.ERROR, subject, (
        f"shared with the nvidia-gpu stack in namespace {where}, which defines {fields} otherwise (held by "
        f"{holders}): every stack on a cluster must apply it alike; run them at the same nvidia-gpu version and "
        "settings (upgrade them together)" + (f", or set {obj.opt_out} in this stack" if obj.opt_out else "")))


def _namespace(live: dict[str, Any] | None, namespace: str, stack: str) -> Finding | None:
    if live is None:
        return None
    owner = ((live.get("metadata") or {}).get("annotations") or {}).get(labels.STACK_ANNOTATION)
    if not owner or owner == stack:
        return None
    return Finding(Severity.ERROR, f"Namespace/{namespace}", (
        f"belongs to the Pulumi stack {owner} (annotation {labels.STACK_ANNOTATION}); this stack ({stack}) "
        "needs its own nvidia-gpu:cluster.namespace, since its ClusterRoles, admission policies and field "
        "managers are named after it. A renamed stack takes it over with: kubectl annotate namespace "
        f"{namespace} {labels.STACK_ANNOTATION}={stack} --overwrite"))


def _node_groups(config: StackConfig, cluster: ClusterReader) -> Iterable[Finding]:
    namespace = config.cluster.namespace
    ours = deckhouse.field_manager(namespace)
    prefix = deckhouse.field_manager("")
    for group in config.node_groups:
        if group.node_group is None:
            continue
        live = cluster.get(deckhouse.NODE_GROUP_API, "NodeGroup", group.node_group)
        if live is None:
            continue
        others = sorted(m for m in _managers(live) if m.startswith(prefix) and m != ours)
        if others:
            stacks = ", ".join(m.removeprefix(prefix) for m in others)
            yield Finding(Severity.ERROR, f"NodeGroup/{group.node_group}", (
                f"nodeGroups[{group.name}]: already patched by the nvidia-gpu stack in namespace {stacks} (field "
                f"manager {', '.join(others)}): a Deckhouse NodeGroup's GPU labels, taints and setup steps belong "
                "to one stack; give this group its own NodeGroup, or remove the group from the other stack first"))


def findings(config: StackConfig, stack: str, cluster: ClusterReader, probe: ApplyProbe) -> list[Finding]:
    """Every collision with other stacks (or other installers of the shared definitions) on the cluster."""
    namespace = config.cluster.namespace
    out: list[Finding] = []
    live_ns = cluster.get("v1", "Namespace", namespace)
    found = _namespace(live_ns, namespace, stack)
    if found is not None:
        return [found]  # every other check would blame the same stack again
    uid = str((live_ns or {}).get("metadata", {}).get("uid") or "") or None
    for obj in shared_objects(config):
        meta = obj.manifest["metadata"]
        live = cluster.get(obj.manifest["apiVersion"], obj.manifest["kind"], meta["name"])
        if live is not None:
            clash = _shared(obj, live, namespace, uid, probe)
            if clash is not None:
                out.append(clash)
    if config.cluster.node_setup is NodeSetupBackend.DECKHOUSE:
        out += _node_groups(config, cluster)
    return out
