"""The eviction guard: the webhook that keeps a self-draining MIG manager's evictions on its own node.

Emitted only where the manager drains itself (``--drain cordon``, the ``daemonset`` node-setup backend)
and tokens carry their pod's node (Kubernetes 1.30+). See :mod:`nvgpu.evictionguard` for why a
ValidatingAdmissionPolicy cannot do this and what the guard decides.

What the stack registers, in this order (each waits for the one before):

1. the ValidatingWebhookConfiguration: for ``CREATE pods/eviction`` by the MIG manager's ServiceAccount
   only (a ``matchCondition``), ``failurePolicy: Fail``, no ``caBundle`` (the guard sets that one field,
   so server-side apply leaves it to the guard);
2. a ValidatingAdmissionPolicy (:func:`ca_only_policy`) holding the guard's own writes to that
   configuration to the one field it owns, each webhook's ``clientConfig.caBundle``: RBAC can name the
   object but not the field, and a guard token that may patch the rest could re-point the webhook at
   any other request (a user's Secret writes, to another URL and CA), switch it to ``failurePolicy:
   Ignore`` or make every eviction fail;
3. the guard's RBAC: read pods, read and patch only this configuration (no Secrets: the guard's key never
   leaves its process, see ``node_agent.admission.certificates``), bound only once the policy is in place;
4. the Service and the Deployment (one replica, replaced with ``Recreate``, unprivileged, kept off the GPU
   nodes so a compromised GPU node never holds the token that may re-point the webhook), ready only once
   the configuration trusts the guard's CA; not awaited by ``pulumi up`` (``pulumi.com/skipAwait``), as a
   cluster may have no node for it yet;
5. then the MIG manager (``nvidia_gpu.components.mig_profile``); any eviction it asks for before the guard
   serves is refused (fail closed) and retried.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvgpu import evictionguard as contract
from nvgpu.stackconfig import Cluster, NodeGroup
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.confinement import MIG_MANAGER_SA, MIN_MINOR, deny_binding
from nvidia_gpu.components.manifests.meta import app_labels, cluster_object_name, selector_labels
from nvidia_gpu.components.manifests.offgpu import controller_deployment
from nvidia_gpu.components.manifests.workloads import AGENT

ADMISSION_API = "admissionregistration.k8s.io/v1"
RBAC_API = "rbac.authorization.k8s.io/v1"
COMPONENT = contract.COMPONENT
#: A webhook call is one GET of the pod; five seconds is long for it and short for a drain's retry.
TIMEOUT_S = 5
RESOURCES = {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}
def wanted(cluster: Cluster, drain: str) -> bool:
    """Whether the stack emits the guard: the manager evicts (``cordon``) and tokens name their node."""
    return drain == "cordon" and cluster.kubernetes_minor >= MIN_MINOR


def _meta(namespace: str, cluster: Cluster | None = None) -> dict[str, str]:
    return app_labels(COMPONENT, namespace, version=cluster.agent_image.tag if cluster else None)


def webhook_configuration(namespace: str) -> Manifest:
    manager = f"system:serviceaccount:{namespace}:{MIG_MANAGER_SA}"
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": contract.configuration_name(namespace), "labels": _meta(namespace)},
        "webhooks": [{
            "name": contract.WEBHOOK_NAME,
            "clientConfig": {"service": {"namespace": namespace, "name": contract.service_name(),
                                         "path": contract.WEBHOOK_PATH, "port": contract.SERVICE_PORT}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods/eviction"], "scope": "Namespaced"}],
            # Only the MIG manager's evictions wait on the guard; nobody else's ever does.
            "matchConditions": [{"name": "mig-manager-only",
                                 "expression": f"request.userInfo.username == '{manager}'"}],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_S,
            "admissionReviewVersions": ["v1"],
        }],
    }


#: Every field of a webhook but ``clientConfig.caBundle`` (admissionregistration.k8s.io/v1
#: ValidatingWebhook): the guard's token may change none of them.
_WEBHOOK_FIELDS = ("rules", "failurePolicy", "matchPolicy", "namespaceSelector", "objectSelector", "sideEffects",
                   "timeoutSeconds", "admissionReviewVersions", "matchConditions")
#: Metadata the guard's token may not change either (owner references would let the garbage collector
#: delete the configuration; finalizers would hold a deletion up).
_METADATA_FIELDS = ("labels", "annotations", "ownerReferences", "finalizers")


def ca_only_policy_name(namespace: str) -> str:
    return f"{contract.configuration_name(namespace)}-ca-only"


def guard_user(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:{COMPONENT}"


def ca_only_policy(namespace: str) -> Manifest:
    """The guard's writes to its webhook configuration change each webhook's ``caBundle`` and nothing else.

    The webhooks are matched by name (unique in a configuration), so the guard may neither add, remove nor
    rename one; every other field of each, and the configuration's labels, annotations, owner references
    and finalizers, must be what they were. ``reason: Forbidden``: who writes is the problem."""
    same_webhook = " && ".join(
        ["o.name == w.name", "o.clientConfig.?url == w.clientConfig.?url",
         "o.clientConfig.?service == w.clientConfig.?service",
         *(f"o.?{f} == w.?{f}" for f in _WEBHOOK_FIELDS)])
    same_metadata = " && ".join(f"object.metadata.?{f} == oldObject.metadata.?{f}" for f in _METADATA_FIELDS)
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": ca_only_policy_name(namespace), "labels": _meta(namespace)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": ["admissionregistration.k8s.io"], "apiVersions": ["v1"],
                 "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["validatingwebhookconfigurations"]}]},
            "matchConditions": [{"name": "is-eviction-guard",
                                 "expression": f"request.userInfo.username == '{guard_user(namespace)}'"}],
            "variables": [
                {"name": "old", "expression": "oldObject == null ? [] : oldObject.?webhooks.orValue([])"},
                {"name": "new", "expression": "object == null ? [] : object.?webhooks.orValue([])"},
            ],
            "validations": [
                {"expression": (f"request.operation == 'UPDATE' && "
                                f"object.metadata.name == '{contract.configuration_name(namespace)}'"),
                 "reason": "Forbidden",
                 "message": f"the eviction guard may only update the CA bundle of "
                            f"{contract.configuration_name(namespace)}"},
                {"expression": ("request.operation != 'UPDATE' || (size(variables.new) == size(variables.old) && "
                                f"variables.new.all(w, variables.old.exists(o, {same_webhook})))"),
                 "reason": "Forbidden",
                 "message": "the eviction guard may change only its webhooks' clientConfig.caBundle"},
                {"expression": f"request.operation != 'UPDATE' || ({same_metadata})", "reason": "Forbidden",
                 "message": "the eviction guard may not change the configuration's labels, annotations, owner "
                            "references or finalizers"},
            ],
        },
    }


def ca_only_policy_binding(namespace: str) -> Manifest:
    return deny_binding(ca_only_policy_name(namespace), _meta(namespace))


def rbac(namespace: str) -> tuple[Manifest, ...]:
    """ServiceAccount, ClusterRole and binding: read pods, read and patch the one webhook configuration."""
    name = cluster_object_name(namespace, COMPONENT)
    meta = _meta(namespace)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": {"name": COMPONENT, "namespace": namespace, "labels": meta},
          "automountServiceAccountToken": False}
    subject = [{"kind": "ServiceAccount", "name": COMPONENT, "namespace": namespace}]
    cluster_role = {
        "apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": {"name": name, "labels": meta},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
             "resourceNames": [contract.configuration_name(namespace)], "verbs": ["get", "patch"]},
        ]}
    cluster_binding = {
        "apiVersion": RBAC_API, "kind": "ClusterRoleBinding", "metadata": {"name": name, "labels": meta},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subject}
    return sa, cluster_role, cluster_binding


def service(namespace: str) -> Manifest:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": contract.service_name(), "namespace": namespace, "labels": _meta(namespace)},
        "spec": {"selector": selector_labels(COMPONENT, namespace),
                 "ports": [{"name": "https", "port": contract.SERVICE_PORT, "targetPort": "https",
                            "protocol": "TCP"}]},
    }


def network_policy(namespace: str, sources: Sequence[str]) -> Manifest:
    """Ingress to the guard's pod: only its webhook port, and only from ``sources`` (the API servers' source
    addresses, ``cluster.mig.evictionGuardSources``) where they are given; no other port, ever. Where the
    cluster's network plugin enforces NetworkPolicy; elsewhere the object is inert. Egress stays open: the
    guard reads pods from and patches its CA into the API server, whose address the stack does not know."""
    rule: dict[str, object] = {"ports": [{"protocol": "TCP", "port": contract.PORT}]}
    if sources:
        rule["from"] = [{"ipBlock": {"cidr": str(c)}} for c in sources]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": COMPONENT, "namespace": namespace, "labels": _meta(namespace)},
        "spec": {"podSelector": {"matchLabels": selector_labels(COMPONENT, namespace)},
                 "policyTypes": ["Ingress"], "ingress": [rule]},
    }


def deployment(namespace: str, cluster: Cluster, groups: Sequence[NodeGroup]) -> Manifest:
    """The guard's Deployment: until it serves, the manager's evictions are refused (fail closed) and retried."""
    probe = {"scheme": "HTTPS", "port": "https"}
    container = {
        "name": COMPONENT,
        "image": cluster.agent_image.ref,
        "imagePullPolicy": cluster.agent_image.pull_policy,
        "command": list(AGENT),
        "args": ["eviction-guard"],
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "https", "containerPort": contract.PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", **probe}, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", **probe}, "periodSeconds": 20, "failureThreshold": 3},
        "resources": RESOURCES,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return controller_deployment(COMPONENT, namespace, _meta(namespace, cluster), groups, container,
                                 volumes=[{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}])
