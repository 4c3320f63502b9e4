"""The preview identity: what CI's ``pulumi preview`` needs for the server to validate every object, and no more.

The Kubernetes provider previews each object with a server-side apply ``dryRun=All``, which runs the API
server's validation and admission (CRD schemas, CEL rules, the cluster's own admission policies). RBAC
authorizes a dry-run like the write itself (``patch``, and ``create`` for an object not there yet), so a
read-only identity is refused, and the provider then falls back to a client-side diff without a word
(``pkg/provider/provider.go``: ``IsForbidden`` at preview returns the inputs as they are).

So the stack grants the identity it is told (``cluster.previewIdentity``) exactly that on the kinds it
applies, derived from what the program registers (:func:`nvidia_gpu.components.register.recording`),
and a ValidatingAdmissionPolicy refuses that identity every request that is not a dry-run: it can
validate but never write. RBAC checks a role or binding for escalation even on a dry-run, so the role also
has ``escalate`` on the roles the stack creates and ``bind`` on those its bindings name, by name.

Admission never intercepts ``admissionregistration.k8s.io`` kinds (admission policies and webhook
configurations: a policy cannot guard the objects that define policies, or it could lock itself in), so no
policy could keep a write of them to a dry-run: the identity gets only reads on those, and the preview
diffs them client-side (:func:`not_dry_run` names them; the preflight says so in one line).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nvgpu.stackconfig import PreviewIdentity
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.confinement import ADMISSION_API, deny_binding
from nvidia_gpu.components.manifests.meta import app_labels, cluster_object_name

RBAC_API = "rbac.authorization.k8s.io/v1"
COMPONENT = "preview-identity"
#: API groups whose objects no admission policy or webhook sees (kube-apiserver exempts them).
ADMISSION_EXEMPT_GROUPS = frozenset({"admissionregistration.k8s.io"})
READ = ("get", "list", "watch")


@dataclass(frozen=True, order=True)
class ObjectKind:
    """A kind the stack touches, as RBAC names it."""

    group: str
    resource: str
    kind: str


def resource_of(api_version: str, kind: str) -> ObjectKind:
    """The RBAC group and resource of ``kind``: the plural the API server serves it under, guessed the way
    ``kubectl`` and client-go do (``meta.UnsafeGuessKindToResource``), which every kind the stack applies
    follows (``tests/cluster/test_preview_identity.py`` checks them against discovery)."""
    group = api_version.rpartition("/")[0]
    singular = kind.lower()
    if singular.endswith("s"):
        plural = singular + "es"
    elif singular.endswith("y"):
        plural = singular[:-1] + "ies"
    else:
        plural = singular + "s"
    return ObjectKind(group, plural, kind)


def exempt(api_version: str) -> bool:
    """Objects of this API version pass no admission, so a dry-run-only policy cannot hold their writes."""
    return api_version.rpartition("/")[0] in ADMISSION_EXEMPT_GROUPS


def role_name(namespace: str) -> str:
    return cluster_object_name(namespace, COMPONENT)


def policy_name(namespace: str) -> str:
    return cluster_object_name(namespace, "preview-dry-run-only")


@dataclass(frozen=True)
class Applied:
    """One object the stack registers: its manifest and whether it is applied (whole or patched) or read."""

    manifest: Manifest
    writes: bool


def rules(objects: Iterable[Applied]) -> list[dict[str, list[str]]]:
    """The role's rules: reads of every kind the stack touches; ``create`` and ``patch`` (what a server-side
    apply dry-run is authorized as) of every kind it applies that admission sees; ``escalate`` and ``bind``
    by name on its roles."""
    objects = list(objects)
    verbs: dict[ObjectKind, set[str]] = {}
    escalate: dict[str, set[str]] = {"clusterroles": set(), "roles": set()}
    bind: dict[str, set[str]] = {"clusterroles": set(), "roles": set()}
    for o in objects:
        m = o.manifest
        kind = resource_of(m["apiVersion"], m["kind"])
        allowed = verbs.setdefault(kind, set(READ))
        if o.writes and not exempt(m["apiVersion"]):
            allowed.update(("create", "patch"))
        if not o.writes or kind.group != "rbac.authorization.k8s.io":
            continue
        if m["kind"] in ("ClusterRole", "Role"):
            escalate[kind.resource].add(m["metadata"]["name"])
        elif m["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            ref = m["roleRef"]
            bind["clusterroles" if ref["kind"] == "ClusterRole" else "roles"].add(ref["name"])
    by_group: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for kind in sorted(verbs):
        by_group.setdefault((kind.group, tuple(sorted(verbs[kind]))), []).append(kind.resource)
    out = [{"apiGroups": [group], "resources": resources, "verbs": list(vs)}
           for (group, vs), resources in sorted(by_group.items())]
    for verb, names in (("escalate", escalate), ("bind", bind)):
        for resource, named in sorted(names.items()):
            if named:
                out.append({"apiGroups": ["rbac.authorization.k8s.io"], "resources": [resource], "verbs": [verb],
                            "resourceNames": sorted(named)})
    return out


def not_dry_run(objects: Iterable[Applied]) -> list[str]:
    """The kinds the stack applies that the preview identity cannot dry-run (admission does not see them)."""
    return sorted({o.manifest["kind"] for o in objects if o.writes and exempt(o.manifest["apiVersion"])})


def cluster_role_binding(namespace: str, identity: PreviewIdentity) -> Manifest:
    name = role_name(namespace)
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": app_labels(COMPONENT, namespace)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [identity.subject()],
    }


def match_expression(identity: PreviewIdentity) -> str:
    """CEL true for the identity's requests (its name has no quote or backslash: the config refuses them)."""
    if identity.username is not None:
        return f"request.userInfo.username == '{identity.username}'"
    return f"'{identity.name}' in request.userInfo.groups"


def admission_policy(namespace: str, identity: PreviewIdentity) -> Manifest:
    """Refuses the identity every create, update, delete and connect that is not a dry-run, on any resource
    and subresource (reads never reach admission; its RBAC grants no more than create and patch anyway)."""
    who = f"{identity.kind} {identity.username or identity.name}"
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy_name(namespace), "labels": app_labels(COMPONENT, namespace)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE", "CONNECT"],
                 "resources": ["*/*"]},
            ]},
            "matchConditions": [{"name": "is-preview-identity", "expression": match_expression(identity)}],
            "validations": [{
                "expression": "request.dryRun",
                "message": (f"{who} is the {namespace} stack's preview identity: it may only dry-run "
                            "(pulumi preview); writes need the deploy credentials"),
                "reason": "Forbidden",
            }],
        },
    }


def admission_policy_binding(namespace: str) -> Manifest:
    return deny_binding(policy_name(namespace), app_labels(COMPONENT, namespace))


#: What the program's cluster preflight (``nvidia_gpu.preflight``) reads besides the stack's own objects, as
#: ``(apiVersion, kind)``: the nodes and the other installations' agents it checks for collisions, so the
#: preview identity's preview is checked as the deploy's is (``tests/nvidia_gpu/preflight`` holds the
#: preflight's reads to this list).
PREFLIGHT_READS: tuple[tuple[str, str], ...] = (
    ("v1", "Namespace"), ("v1", "Node"), ("v1", "Pod"), ("apps/v1", "DaemonSet"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"), ("node.k8s.io/v1", "RuntimeClass"),
    ("resource.k8s.io/v1", "DeviceClass"), ("nvidia.com/v1", "ClusterPolicy"),
    ("deckhouse.io/v1alpha1", "ModuleConfig"), ("deckhouse.io/v1", "NodeGroup"),
)


def cluster_role(namespace: str, stack_objects: Iterable[Applied]) -> Manifest:
    """The role, from what the stack registers plus the preview identity's own objects (its binding and the
    policy are the stack's too, so a preview dry-runs them like the rest)."""
    name = role_name(namespace)
    stub: Manifest = {"apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": {"name": name}}
    own = [stub, cluster_role_binding(namespace, PreviewIdentity(kind="User", name="-")),
           admission_policy(namespace, PreviewIdentity(kind="User", name="-")), admission_policy_binding(namespace)]
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": app_labels(COMPONENT, namespace)},
        "rules": rules([*stack_objects, *(Applied(m, True) for m in own),
                        *(Applied({"apiVersion": api, "kind": kind, "metadata": {"name": "-"}}, False)
                          for api, kind in PREFLIGHT_READS)]),
    }


def manifests(namespace: str, identity: PreviewIdentity, stack_objects: Iterable[Applied]) -> list[Manifest]:
    """Policy, policy binding, role and binding, in the order they must exist: the identity is bound to its
    role only once the policy holding it to dry-runs is in place (and unbound first on destroy)."""
    return [admission_policy(namespace, identity), admission_policy_binding(namespace),
            cluster_role(namespace, stack_objects), cluster_role_binding(namespace, identity)]
