"""Node confinement for the node agents that write Nodes and Pods, enforced by the API server.

RBAC cannot say "your own Node": a ClusterRole that may patch nodes may patch every node, so one
compromised GPU node's labeller could relabel or taint the others, and its MIG manager could delete
any pod in the cluster. A ValidatingAdmissionPolicy can: each agent's token is bound to its pod, and
bound service-account tokens carry the pod's node (``authentication.kubernetes.io/node-name``,
ServiceAccountTokenPodNodeInfo, on by default since 1.30), as the DRA plugin's slice policy uses it.

For the labeller, the node-setup agent and the MIG manager, the policy allows:

* Node updates only of the agent's own Node, and on it only the label, annotation and taint keys its own
  role writes (:class:`nvgpu.labels.NodeWrites`, one list per agent: the labeller's GPU and group labels
  and the node groups' taints, node setup's gate and check labels, the MIG manager's state and its side of
  Deckhouse's disruption handshake, which it may request and clear but never approve), some of them only to
  remove (teardown withdraws the labeller's); never a taint Kubernetes' own controllers set
  (:data:`nvgpu.stackconfig.CONTROLLER_TAINTS`, ``node-role.kubernetes.io/*``): removing ``unreachable`` or
  adding ``out-of-service`` would steer or evict workloads; never the driver upgrade's state, which its
  controller trusts; never owner references (the garbage collector would delete the Node) or finalizers;
  ``spec.unschedulable`` (cordon) only by the MIG manager; no other spec field.
* Pod deletion by the MIG manager only of pods bound to its own Node.
* GPU inventory objects (``gpus.gpu.nvidia-gpu.io``) written by the labeller only for its own Node, named
  ``<node>-gpu<index>`` after it, labelled with it and owned by it alone (no squatting on a name another
  node's labeller will need).

What no admission policy can confine: an Eviction names only the pod, so the policy cannot see the
pod's node. The MIG manager is given ``pods/eviction`` only where it drains itself (``--drain cordon``,
clusters without Deckhouse), and there the eviction guard's webhook, which looks the pod up, keeps those
evictions to its node (``nvidia_gpu.components.manifests.evictionguard``); on Deckhouse, node-manager
drains and the manager has no eviction right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
#: Taint keys under these prefixes belong to Kubernetes (node roles) beside :data:`CONTROLLER_TAINTS`.
RESERVED_TAINT_PREFIXES = ("node-role.kubernetes.io/",)


def _cel_list(items: tuple[str, ...] | frozenset[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in sorted(items)) + "]"


#: The DRA kubelet plugin's ServiceAccount (``nvidia_gpu.components.manifests.dra.SERVICE_ACCOUNT``; not
#: imported, for the reason the MIG manager's is not): it records Events on its Node.
DRA_PLUGIN_SA = "dra-kubelet-plugin"
#: Where node Events go (as the kubelet's own; ``node_agent.kube.events``).
NODE_EVENT_NAMESPACE = "default"
#: The node agents that record Events on their Node (the others have no right to, and the policy agrees).
EVENT_WRITERS = (MIG_MANAGER_SA, DRA_PLUGIN_SA)


def agent_users(namespace: str) -> list[str]:
    return [f"system:serviceaccount:{namespace}:{sa}"
            for sa in (AgentRole.LABELLER.value, AgentRole.NODE_SETUP.value, MIG_MANAGER_SA, DRA_PLUGIN_SA)]


def policy_name(namespace: str) -> str:
    return cluster_object_name(namespace, COMPONENT)


def _in(sets: Sequence[labels.KeySet], var: str = "k") -> str:
    """CEL: ``var`` is one of the keys of ``sets`` (``false`` for none)."""
    alternatives = []
    for ks in sets:
        if ks.keys:
            alternatives.append(f"{var} in {_cel_list(ks.keys)}")
        if ks.prefixes:
            terms = ["(" + " || ".join(f"{var}.startsWith('{p}')" for p in ks.prefixes) + ")"]
            if ks.except_keys:
                terms.append(f"!({var} in {_cel_list(ks.except_keys)})")
            terms += [f"!{var}.startsWith('{p}')" for p in ks.except_prefixes]
            alternatives.append("(" + " && ".join(terms) + ")")
    return "(" + " || ".join(alternatives) + ")" if alternatives else "false"


def _gpu_client(pod: str) -> str:
    """CEL: ``pod`` is a GPU client the MIG manager stops (``node_agent.mig.executor``'s test, the same three
    ways): a DaemonSet's pod that asks for ``nvidia.com/*``, carries a known GPU agent's label, or is placed by
    a ``nvidia.com/gpu.deploy.*`` label."""
    asks = ("[c.?resources.?requests.orValue({}), c.?resources.?limits.orValue({})]"
            ".exists(m, m.exists(k, k.startsWith('nvidia.com/')))")
    agent = " || ".join(f"{pod}.metadata.?labels[?'{k}'].orValue('') == '{v}'" for k, v in labels.GPU_AGENT_POD_LABELS)
    deploy = f"k.startsWith('{labels.GPU_DEPLOY_PREFIX}')"
    placed = (f"{pod}.spec.?nodeSelector.orValue({{}}).exists(k, {deploy}) || "
              f"{pod}.spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution."
              f"?nodeSelectorTerms.orValue([]).exists(t, t.?matchExpressions.orValue([]).exists(e, "
              f"e.key.startsWith('{labels.GPU_DEPLOY_PREFIX}')))")
    return (f"{pod}.metadata.?ownerReferences.orValue([]).exists(r, r.kind == 'DaemonSet') && ("
            f"{pod}.spec.containers.exists(c, {asks}) || "
            f"{pod}.spec.?initContainers.orValue([]).exists(c, {asks}) || {agent} || {placed})")


def writes() -> dict[str, labels.NodeWrites]:
    """Each node agent's ServiceAccount name and what its role writes on its own Node (:mod:`nvgpu.labels`)."""
    return {AgentRole.LABELLER.value: labels.LABELLER_WRITES, AgentRole.NODE_SETUP.value: labels.NODE_SETUP_WRITES,
            MIG_MANAGER_SA: labels.MIG_MANAGER_WRITES}


def _per_agent(rule: Callable[[labels.NodeWrites], str]) -> str:
    """CEL: ``rule`` for the requesting agent's role (a chain of conditionals on ``variables.agent``)."""
    expr = "false"
    for name, w in reversed(writes().items()):
        expr = f"(variables.agent == '{name}' ? {rule(w)} : {expr})"
    return expr


def admission_policy(namespace: str, group_taint_keys: Sequence[str] = ()) -> Manifest:
    """The own-node policy; ``group_taint_keys``: the taint keys the node groups declare (the GPU taint and
    their extra taints), which the labeller may set and node setup's teardown may withdraw."""
    users = agent_users(namespace)
    mig_user = f"system:serviceaccount:{namespace}:{MIG_MANAGER_SA}"
    labeller_user = f"system:serviceaccount:{namespace}:{AgentRole.LABELLER.value}"
    group_taints = labels.KeySet(keys=tuple(sorted({labels.GPU_TAINT_KEY, *group_taint_keys})))

    def taint_sets(w: labels.NodeWrites, removing: bool) -> tuple[labels.KeySet, ...]:
        own = w.set_taints
        if w.group_taints == "set" or (removing and w.group_taints == "remove"):
            own = (*own, group_taints)
        return own

    set_label = _per_agent(lambda w: _in(w.set_labels))
    remove_label = _per_agent(lambda w: _in((*w.set_labels, *w.remove_labels)))
    set_annotation = _per_agent(lambda w: _in(w.set_annotations))
    remove_annotation = _per_agent(lambda w: _in((*w.set_annotations, *w.remove_annotations)))
    set_taint = _per_agent(lambda w: _in(taint_sets(w, False)))
    remove_taint = _per_agent(lambda w: _in(taint_sets(w, True)))
    event_writers = tuple(f"system:serviceaccount:{namespace}:{sa}" for sa in EVENT_WRITERS)
    cordoners = tuple(f"system:serviceaccount:{namespace}:{n}" for n, w in writes().items() if w.cordon)
    taint_reserved = (f"(k in {_cel_list(CONTROLLER_TAINTS)} || "
                      + " || ".join(f"k.startsWith('{p}')" for p in RESERVED_TAINT_PREFIXES) + ")")
    # Keys whose value was added or changed, and keys removed, for labels and annotations.
    changed = "variables.new{0}.filter(k, !(k in variables.old{0}) || variables.old{0}[k] != variables.new{0}[k])"
    removed = "variables.old{0}.filter(k, !(k in variables.new{0}))"
    same_taint = "o.key == t.key && o.effect == t.effect && o.?value.orValue('') == t.?value.orValue('')"
    gpu_name = (f"object.metadata.name == object.spec.node + '-gpu' + string(object.spec.index) && "
                f"object.metadata.?labels[?'{inventory.NODE_LABEL}'].orValue('') == object.spec.node && "
                "object.metadata.?ownerReferences.orValue([]).all(r, r.kind == 'Node' && r.name == object.spec.node)")
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
                {"apiGroups": ["", "events.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["events"]},
            ]},
            "matchConditions": [{"name": "is-node-agent",
                                 "expression": f"request.userInfo.username in {_cel_list(tuple(users))}"}],
            "variables": [
                {"name": "agent", "expression": "request.userInfo.username.split(':')[3]"},
                {"name": "userNodeName",
                 "expression": "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                {"name": "isNode", "expression": "request.resource.resource == 'nodes'"},
                {"name": "isPod", "expression": "request.resource.resource == 'pods'"},
                {"name": "isEvent", "expression": "request.resource.resource == 'events'"},
                # An Event's subject: ``involvedObject`` (core/v1) or ``regarding`` (events.k8s.io/v1).
                {"name": "eventSubject", "expression": (
                    "!variables.isEvent ? {} : request.resource.group == 'events.k8s.io' ? "
                    "object.?regarding.orValue({}) : object.?involvedObject.orValue({})")},
                {"name": "targetNode", "expression": (
                    "variables.isNode ? object.metadata.name : variables.isPod ? "
                    "oldObject.spec.?nodeName.orValue('') : variables.isEvent ? "
                    "(variables.eventSubject.?kind.orValue('') == 'Node' ? variables.eventSubject.?name.orValue('') "
                    ": '') : (request.operation == 'DELETE' ? oldObject : object).spec.?node.orValue('')")},
                {"name": "oldLabels", "expression": "variables.isNode ? oldObject.metadata.?labels.orValue({}) : {}"},
                {"name": "newLabels", "expression": "variables.isNode ? object.metadata.?labels.orValue({}) : {}"},
                {"name": "oldAnnotations",
                 "expression": "variables.isNode ? oldObject.metadata.?annotations.orValue({}) : {}"},
                {"name": "newAnnotations",
                 "expression": "variables.isNode ? object.metadata.?annotations.orValue({}) : {}"},
                {"name": "oldTaints", "expression": "variables.isNode ? oldObject.spec.?taints.orValue([]) : []"},
                {"name": "newTaints", "expression": "variables.isNode ? object.spec.?taints.orValue([]) : []"},
                {"name": "addedTaints", "expression": (
                    f"variables.newTaints.filter(t, !variables.oldTaints.exists(o, {same_taint})).map(t, t.key)")},
                {"name": "removedTaints", "expression": (
                    f"variables.oldTaints.filter(t, !variables.newTaints.exists(o, {same_taint})).map(t, t.key)")},
                {"name": "badLabels", "expression": (
                    f"({changed.format('Labels')}).filter(k, !{set_label}) + "
                    f"({removed.format('Labels')}).filter(k, !{remove_label})")},
                {"name": "badAnnotations", "expression": (
                    f"({changed.format('Annotations')}).filter(k, !{set_annotation}) + "
                    f"({removed.format('Annotations')}).filter(k, !{remove_annotation})")},
                {"name": "reservedTaints", "expression": (
                    f"(variables.addedTaints + variables.removedTaints).filter(k, {taint_reserved})")},
                {"name": "badTaints", "expression": (
                    f"variables.addedTaints.filter(k, !{set_taint}) + "
                    f"variables.removedTaints.filter(k, !{remove_taint})")},
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
                                      "variables.isEvent ? (variables.targetNode == '' ? 'an event about anything "
                                      "but a node' : 'an event about node ' + variables.targetNode) : "
                                      "'the GPUs of node ' + (variables.targetNode == '' ? '(none)' : "
                                      "variables.targetNode))"},
                {"expression": f"!variables.isEvent || object.metadata.namespace == '{NODE_EVENT_NAMESPACE}'",
                 "reason": "Forbidden",
                 "messageExpression": (f"'the ' + variables.agent + ' may record events only in "
                                       f"{NODE_EVENT_NAMESPACE}, as the kubelet does for nodes'")},
                {"expression": f"!variables.isEvent || request.userInfo.username in {_cel_list(event_writers)}",
                 "reason": "Forbidden", "messageExpression": "'the ' + variables.agent + ' may not record events'"},
                {"expression": f"!variables.isPod || request.userInfo.username == '{mig_user}'",
                 "reason": "Forbidden", "messageExpression": "'the ' + variables.agent + ' may not delete pods'"},
                # Only what the manager stops before it changes the GPUs: a DaemonSet's pod that holds them.
                {"expression": f"!variables.isPod || ({_gpu_client('oldObject')})", "reason": "Forbidden",
                 "messageExpression": ("'the ' + variables.agent + ' may delete only GPU agents\\' pods (a "
                                       "DaemonSet\\'s pod that asks for nvidia.com/ resources, is a known GPU "
                                       "agent or waits on a nvidia.com/gpu.deploy label), not ' + "
                                       "oldObject.metadata.namespace + '/' + oldObject.metadata.name")},
                {"expression": (f"variables.isNode || variables.isPod || variables.isEvent || "
                                f"request.userInfo.username == '{labeller_user}'"),
                 "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not write GPU inventory objects'"},
                # A GPU object's name is its node's (``<node>-gpu<index>``), and so are its node label and its
                # owner: no labeller may take the name another node's labeller will need.
                {"expression": ("variables.isNode || variables.isPod || variables.isEvent || "
                                f"request.operation == 'DELETE' || ({gpu_name})"),
                 "reason": "Forbidden",
                 "messageExpression": (f"'the ' + variables.agent + ' may name a GPU object only <node>-gpu<index> "
                                       f"of its own node, with its node in the {inventory.NODE_LABEL} label and as "
                                       "its only owner, not ' + object.metadata.name")},
                {"expression": ("!variables.isNode || (object.metadata.?ownerReferences == "
                                "oldObject.metadata.?ownerReferences && object.metadata.?finalizers == "
                                "oldObject.metadata.?finalizers)"),
                 "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change its node\\'s owner references "
                                      "or finalizers'"},
                {"expression": "size(variables.badLabels) == 0", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change node label(s) ' + "
                                      "variables.badLabels.join(', ') + ': not labels its role writes'"},
                {"expression": "size(variables.badAnnotations) == 0", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change node annotation(s) ' + "
                                      "variables.badAnnotations.join(', ') + ': not annotations its role writes'"},
                {"expression": "size(variables.reservedTaints) == 0", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change taint(s) ' + "
                                      "variables.reservedTaints.join(', ') + \" that Kubernetes' controllers own\""},
                {"expression": "size(variables.badTaints) == 0", "reason": "Forbidden",
                 "messageExpression": "'the ' + variables.agent + ' may not change taint(s) ' + "
                                      "variables.badTaints.join(', ') + ': not taints its role or the node groups "
                                      "declare'"},
                {"expression": ("!variables.isNode || (oldObject.spec.?unschedulable.orValue(false) == "
                                "object.spec.?unschedulable.orValue(false) || request.userInfo.username in "
                                f"{_cel_list(cordoners)})"),
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
    return deny_binding(policy_name(namespace), app_labels(COMPONENT, namespace))


def deny_binding(policy: str, labels: dict[str, str]) -> Manifest:
    """The binding that puts ``policy`` in force for every request it matches (refusing, not warning)."""
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy, "labels": labels},
        "spec": {"policyName": policy, "validationActions": ["Deny"]},
    }
