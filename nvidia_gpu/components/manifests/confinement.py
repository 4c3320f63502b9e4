"""Node confinement for the node agents that write Nodes and Pods, enforced by the API server.

RBAC cannot say "your own Node": a ClusterRole that may patch nodes may patch every node, so one
compromised GPU node's labeller could relabel or taint the others, and its MIG manager could delete
any pod in the cluster. A ValidatingAdmissionPolicy can: each agent's token is bound to its pod, and
bound service-account tokens carry the pod's node (``authentication.kubernetes.io/node-name``,
ServiceAccountTokenPodNodeInfo, on by default since 1.30), as the DRA plugin's slice policy uses it.

For the labeller, the node-setup agent and the MIG manager, the policy allows:

* Node updates only of the agent's own Node, and on it only:
  label keys this stack's agents own (:data:`nvgpu.labels.AGENT_LABEL_PREFIXES` and
  :data:`~nvgpu.labels.AGENT_LABEL_KEYS`: the same list the stack config refuses in node selectors);
  annotation keys in :data:`ANNOTATION_PREFIXES`;
  taints other than the ones Kubernetes' own controllers set (:data:`nvgpu.stackconfig.CONTROLLER_TAINTS`,
  and ``node-role.kubernetes.io/*``): removing ``unreachable`` or adding ``out-of-service`` would steer or
  evict workloads; ``spec.unschedulable`` (cordon) only by the MIG manager; no other spec field.
* Pod deletion by the MIG manager only of pods bound to its own Node.
* GPU inventory objects (``gpus.gpu.nvidia-gpu.io``) written by the labeller only for its own Node.

What no admission policy can confine: an Eviction names only the pod, so the policy cannot see the
pod's node. The MIG manager is given ``pods/eviction`` only where it drains itself (``--drain cordon``,
clusters without Deckhouse), and there the eviction guard's webhook, which looks the pod up, keeps those
evictions to its node (``nvidia_gpu.components.manifests.evictionguard``); on Deckhouse, node-manager
drains and the manager has no eviction right.
"""

from __future__ import annotations

from nvgpu import inventory, labels
from nvgpu.stackconfig import CONTROLLER_TAINTS
from nvidia_gpu.components.manifests import Manifest
from nvidia_gpu.components.manifests.meta import app_labels, cluster_object_name
from nvidia_gpu.components.manifests.platform import AgentRole

ADMISSION_API = "admissionregistration.k8s.io/v1"
#: ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) and node-name claims are in tokens from 1.30.
MIN_MINOR = 30
COMPONENT = "node-agents-own-node"
#: The MIG manager's ServiceAccount (``nvidia_gpu.components.manifests.mig.COMPONENT``; not imported:
#: the MIG manifests import this module's neighbours, and the name is part of this policy's contract).
MIG_MANAGER_SA = "mig-manager"
#: Annotation keys the agents write on their Node: ownership records and failure reasons
#: (``gpu.nvidia-gpu.io/``), Deckhouse's disruption and drain handshake (``update.node.deckhouse.io/``).
ANNOTATION_PREFIXES = ("gpu.nvidia-gpu.io/", "update.node.deckhouse.io/", "nvidia.com/")
#: Taint keys under these prefixes belong to Kubernetes (node roles) beside :data:`CONTROLLER_TAINTS`.
RESERVED_TAINT_PREFIXES = ("node-role.kubernetes.io/",)


def _cel_list(items: tuple[str, ...] | frozenset[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in sorted(items)) + "]"


def agent_users(namespace: str) -> list[str]:
    return [f"system:serviceaccount:{namespace}:{sa}"
            for sa in (AgentRole.LABELLER.value, AgentRole.NODE_SETUP.value, MIG_MANAGER_SA)]


def policy_name(namespace: str) -> str:
    return cluster_object_name(namespace, COMPONENT)


def admission_policy(namespace: str) -> Manifest:
    users = agent_users(namespace)
    mig_user = f"system:serviceaccount:{namespace}:{MIG_MANAGER_SA}"
    labeller_user = f"system:serviceaccount:{namespace}:{AgentRole.LABELLER.value}"
    label_ok = (f"(k in {_cel_list(labels.AGENT_LABEL_KEYS)} || "
                + " || ".join(f"k.startsWith('{p}')" for p in labels.AGENT_LABEL_PREFIXES) + ")")
    annotation_ok = "(" + " || ".join(f"k.startsWith('{p}')" for p in ANNOTATION_PREFIXES) + ")"
    taint_reserved = (f"(k in {_cel_list(CONTROLLER_TAINTS)} || "
                      + " || ".join(f"k.startsWith('{p}')" for p in RESERVED_TAINT_PREFIXES) + ")")
    # Keys whose value was added, changed or removed, for labels and annotations; taint keys likewise.
    changed = ("variables.new{0}.filter(k, !(k in variables.old{0}) || variables.old{0}[k] != variables.new{0}[k])"
               " + variables.old{0}.filter(k, !(k in variables.new{0}))")
    same_taint = "o.key == t.key && o.effect == t.effect && o.?value.orValue('') == t.?value.orValue('')"
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy_name(namespace), "labels": app_labels(COMPONENT, namespace)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["pods"]},
                {"apiGroups": [inventory.GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
                 "resources": [inventory.PLURAL, f"{inventory.PLURAL}/status"]},
            ]},
            "matchConditions": [{"name": "is-node-agent",
                                 "expression": f"request.userInfo.username in {_cel_list(tuple(users))}"}],
            "variables": [
                {"name": "agent", "expression": "request.userInfo.username.split(':')[3]"},
                {"name": "userNodeName",
                 "expression": "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                {"name": "isNode", "expression": "request.resource.resource == 'nodes'"},
                {"name": "isPod", "expression": "request.resource.resource == 'pods'"},
                {"name": "targetNode", "expression": (
                    "variables.isNode ? object.metadata.name : variables.isPod ? "
                    "oldObject.spec.?nodeName.orValue('') : "
                    "(request.operation == 'DELETE' ? oldObject : object).spec.?node.orValue('')")},
                {"name": "oldLabels", "expression": "variables.isNode ? oldObject.metadata.?labels.orValue({}) : {}"},
                {"name": "newLabels", "expression": "variables.isNode ? object.metadata.?labels.orValue({}) : {}"},
                {"name": "oldAnnotations",
                 "expression": "variables.isNode ? oldObject.metadata.?annotations.orValue({}) : {}"},
                {"name": "newAnnotations",
                 "expression": "variables.isNode ? object.metadata.?annotations.orValue({}) : {}"},
                {"name": "oldTaints", "expression": "variables.isNode ? oldObject.spec.?taints.orValue([]) : []"},
                {"name": "newTaints", "expression": "variables.isNode ? object.spec.?taints.orValue([]) : []"},
                {"name": "badLabels",
                 "expression": f"({changed.format('Labels')}).filter(k, !{label_ok})"},
                {"name": "badAnnotations",
                 "expression": f"({changed.format('Annotations')}).filter(k, !{annotation_ok})"},
                {"name": "badTaints", "expression": (
                    f"(variables.newTaints.filter(t, !variables.oldTaints.exists(o, {same_taint})) + "
                    f"variables.oldTaints.filter(t, !variables.newTaints.exists(o, {same_taint})))"
                    f".map(t, t.key).filter(k, {taint_reserved})")},
            ],
            # ``reason: Forbidden``: who writes is the problem, not the object (403, not 422 Invalid).
            "validations": [
                {"expression": "variables.userNodeName != ''", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + \" token carries no node name; it must run in "
                                      "a pod on a node\""},
                {"expression": "variables.targetNode == variables.userNodeName", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' on node ' + variables.userNodeName + "
                                      "' may only change its own node, not ' + (variables.isNode ? 'node ' + "
                                      "variables.targetNode : variables.isPod ? (variables.targetNode == '' ? "
                                      "'an unscheduled pod' : 'a pod on node ' + variables.targetNode) : "
                                      "'the GPUs of node ' + (variables.targetNode == '' ? '(none)' : "
                                      "variables.targetNode))"},
                {"expression": f"!variables.isPod || request.userInfo.username == '{mig_user}'",
                 "reason": "Forbidden", "messageExpression": "'the ' + variables.agent + ' may not delete pods'"},
                {"expression": f"variables.isNode || variables.isPod || request.userInfo.username == '{labeller_user}'",
                 "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not write GPU inventory objects'"},
                {"expression": "size(variables.badLabels) == 0", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change node label(s) ' + "
                                      "variables.badLabels.join(', ') + ': it owns only its own GPU labels'"},
                {"expression": "size(variables.badAnnotations) == 0", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change node annotation(s) ' + "
                                      "variables.badAnnotations.join(', ')"},
                {"expression": "size(variables.badTaints) == 0", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change taint(s) ' + "
                                      "variables.badTaints.join(', ') + \" that Kubernetes' controllers own\""},
                {"expression": ("!variables.isNode || (oldObject.spec.?unschedulable.orValue(false) == "
                                f"object.spec.?unschedulable.orValue(false) || request.userInfo.username == "
                                f"'{mig_user}')"),
                 "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not cordon or uncordon its node'"},
                {"expression": ("!variables.isNode || (oldObject.spec.?podCIDR == object.spec.?podCIDR && "
                                "oldObject.spec.?podCIDRs == object.spec.?podCIDRs && "
                                "oldObject.spec.?providerID == object.spec.?providerID)"),
                 "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may change only labels, annotations, taints "
                                      "and cordon on its node'"},
            ],
        },
    }


def admission_policy_binding(namespace: str) -> Manifest:
    name = policy_name(namespace)
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": app_labels(COMPONENT, namespace)},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
