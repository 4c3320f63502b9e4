"""The eviction guard's manifests (``components/manifests/evictionguard.py``) and where MigProfile puts them.

What the guard decides is tested in ``tests/node_agent/admission``; that the API server calls it for the
manager's evictions only, and refuses the cross-node ones, in ``tests/cluster/test_agent_mig.py``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from nvgpu import evictionguard as contract
from nvgpu import labels
from nvgpu.stackconfig import NodeGroup
from nvidia_gpu.components.manifests import evictionguard, offgpu
from nvidia_gpu.components.manifests.meta import selector_labels
from nvidia_gpu.components.manifests.mig import drain_mode
from nvidia_gpu.components.mig_profile import MigProfile, MigProfileArgs
from nvidia_gpu.policies.k8s_security import rbac_secret_problems, rbac_wildcard_problems
from nvidia_gpu.policies.manifests import Kind
from nvidia_gpu.preview.engine import install_mocks, run_in_engine
from tests.nvidia_gpu.components.component_helpers import MIG_STACK_GROUPS, stack_config

NS = "gpu-system"


def test_emitted_only_where_the_manager_evicts_and_tokens_name_their_node() -> None:
    daemonset = stack_config(MIG_STACK_GROUPS, node_setup="daemonset").cluster
    deckhouse = stack_config(MIG_STACK_GROUPS).cluster
    old = stack_config(MIG_STACK_GROUPS, node_setup="daemonset", kubernetesVersion="1.29").cluster
    assert evictionguard.wanted(daemonset, drain_mode(daemonset))
    assert not evictionguard.wanted(deckhouse, drain_mode(deckhouse))  # node-manager drains; no eviction right
    assert not evictionguard.wanted(old, drain_mode(old))  # no node claim in 1.29 tokens


def test_the_webhook_judges_only_the_managers_evictions_and_fails_closed() -> None:
    cfg = evictionguard.webhook_configuration(NS)
    assert cfg["metadata"]["name"] == contract.configuration_name(NS)
    (hook,) = cfg["webhooks"]
    assert hook["name"] == contract.WEBHOOK_NAME
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods/eviction"], "scope": "Namespaced"}]
    assert hook["matchConditions"] == [{"name": "mig-manager-only", "expression":
                                        f"request.userInfo.username == 'system:serviceaccount:{NS}:mig-manager'"}]
    assert (hook["failurePolicy"], hook["sideEffects"]) == ("Fail", "None")
    assert hook["clientConfig"] == {"service": {"namespace": NS, "name": contract.service_name(),
                                                "path": contract.WEBHOOK_PATH, "port": contract.SERVICE_PORT}}
    assert "caBundle" not in hook["clientConfig"], "the guard owns that field"


def test_the_guard_reads_pods_patches_its_webhook_by_name_and_never_touches_secrets() -> None:
    sa, role, binding = evictionguard.rbac(NS)
    assert sa["automountServiceAccountToken"] is False
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
         "resourceNames": [contract.configuration_name(NS)], "verbs": ["get", "patch"]}]
    kind = Kind("rbac.authorization.k8s.io/v1", "ClusterRole")
    assert not rbac_secret_problems(kind, role) and not rbac_wildcard_problems(kind, role)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": contract.COMPONENT, "namespace": NS}]


def test_one_unprivileged_replica_kept_off_the_gpu_nodes() -> None:
    cfg = stack_config(MIG_STACK_GROUPS, node_setup="daemonset")
    dep = evictionguard.deployment(NS, cfg.cluster, cfg.node_groups)
    spec = dep["spec"]
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and "tolerations" not in pod
    (container,) = pod["containers"]
    assert container["args"] == ["eviction-guard"] and container["image"] == cfg.cluster.agent_image.ref
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exprs = term["matchExpressions"]
    assert {"key": labels.GPU_SETUP_COMPLETE, "operator": "DoesNotExist"} in exprs
    groups = {k: v for g in cfg.node_groups for k, v in g.match_labels.items()}
    for key in groups:
        (excluded,) = [e for e in exprs if e["key"] == key]
        assert excluded["operator"] == "NotIn"
        assert set(excluded["values"]) == {g.match_labels[key] for g in cfg.node_groups if key in g.match_labels}


def _requirement_holds(req: dict[str, Any], node: dict[str, str]) -> bool:
    """Kubernetes' node selector requirement semantics (NotIn and DoesNotExist match a node without the key)."""
    key, op = req["key"], req["operator"]
    if op == "Exists":
        return key in node
    if op == "DoesNotExist":
        return key not in node
    if op == "In":
        return key in node and node[key] in req["values"]
    assert op == "NotIn", req
    return key not in node or node[key] not in req["values"]


def _selector_matches(group: NodeGroup, node: dict[str, str]) -> bool:
    reqs = [{"key": k, "operator": "In", "values": [v]} for k, v in group.match_labels.items()]
    reqs += [r.model_dump() for r in group.match_expressions]
    return all(_requirement_holds(r, node) for r in reqs)


SELECTED_GROUPS = [
    {"name": "h100", "nodeSelector": {"matchLabels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
     "gpu": {"sharing": "Exclusive", "model": "H100-80GB"}},
    {"name": "l4", "nodeSelector": {"matchLabels": {"node.kubernetes.io/instance-type": "g6.12xlarge"},
                                    "matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                                          "values": ["eu-west-1a", "eu-west-1b"]}]},
     "gpu": {"sharing": "Exclusive", "model": "L4"}},
    {"name": "pool", "nodeSelector": {"matchLabels": {"example.com/pool": "gpu", "example.com/team": "vision"},
                                      "matchExpressions": [{"key": "example.com/spot", "operator": "DoesNotExist"}]},
     "gpu": {"sharing": "Exclusive"}},
]


def test_the_guard_may_land_exactly_on_nodes_of_no_group_however_the_groups_select_them() -> None:
    """Groups chosen by several labels and by expressions: every node of a small universe of label values
    is admitted by the guard's affinity exactly when it is in no group and not set up for GPUs."""
    cfg = stack_config(SELECTED_GROUPS, node_setup="daemonset")
    terms = offgpu.off_gpu_nodes(cfg.node_groups)["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert 1 < len(terms) <= offgpu.MAX_AFFINITY_TERMS
    domains: dict[str, list[str | None]] = {
        "node.kubernetes.io/instance-type": [None, "p5.48xlarge", "g6.12xlarge", "m5.large"],
        "topology.kubernetes.io/zone": [None, "eu-west-1a", "eu-west-1c"],
        "example.com/pool": [None, "gpu"], "example.com/team": [None, "vision"],
        "example.com/spot": [None, "true"], labels.GPU_SETUP_COMPLETE: [None, ""]}
    checked = 0
    for values in itertools.product(*domains.values()):
        node = {k: v for k, v in zip(domains, values, strict=True) if v is not None}
        wanted = labels.GPU_SETUP_COMPLETE not in node and not any(_selector_matches(g, node)
                                                                   for g in cfg.node_groups)
        admitted = any(all(_requirement_holds(r, node) for r in t["matchExpressions"]) for t in terms)
        assert admitted == wanted, (node, terms)
        checked += 1
    assert checked == 192


def test_too_many_ways_to_leave_the_groups_fall_back_to_the_gpu_taint() -> None:
    many = [{"name": f"g{i}", "nodeSelector": {"matchLabels": {"example.com/pool": f"p{i}",
                                                               "example.com/rack": f"r{i}"}},
             "gpu": {"sharing": "Exclusive"}} for i in range(6)]  # 2**6 = 64 terms
    cfg = stack_config(many, node_setup="daemonset")
    terms = offgpu.off_gpu_nodes(cfg.node_groups)["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": labels.GPU_SETUP_COMPLETE, "operator": "DoesNotExist"}]}]


def test_the_manager_waits_for_the_guard_which_waits_for_its_webhook() -> None:
    monitor = install_mocks("nvidia-gpu", "test")
    cfg = stack_config(MIG_STACK_GROUPS, node_setup="daemonset")
    run_in_engine(lambda: MigProfile("mig", MigProfileArgs(cluster=cfg.cluster, groups=cfg.node_groups)))
    r = {x.name: x for x in monitor.recorded_resources()}
    guard = "mig-eviction-guard"
    assert {n for n in r if n.startswith(guard)} == {f"{guard}-{s}" for s in (
        "webhook", "ca-only-policy", "ca-only-policy-binding", "sa", "role", "binding", "service", "network-policy",
        "deployment")}
    assert all(r[n].parent_urn == r["mig"].urn for n in r if n.startswith(guard))
    # The guard may patch its webhook only once the policy holding it to the CA bundle is in force.
    assert r[f"{guard}-ca-only-policy-binding"].urn in r[f"{guard}-binding"].dependencies
    assert r[f"{guard}-deployment"].urn in r["mig-manager"].dependencies
    assert {r[f"{guard}-webhook"].urn, r[f"{guard}-binding"].urn} <= set(r[f"{guard}-deployment"].dependencies)
    # Off every group's nodes, the L4 time-slicing group's too (the MIG manager covers only MIG-capable ones).
    (term,) = r[f"{guard}-deployment"].inputs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (excluded,) = [e for e in term["matchExpressions"] if e["key"] == labels.DECKHOUSE_NODE_GROUP]
    assert excluded["values"] == sorted(g.match_labels[labels.DECKHOUSE_NODE_GROUP] for g in cfg.node_groups)


def test_no_guard_on_deckhouse() -> None:
    monitor = install_mocks("nvidia-gpu", "test")
    cfg = stack_config(MIG_STACK_GROUPS)
    run_in_engine(lambda: MigProfile("mig", MigProfileArgs(cluster=cfg.cluster, groups=cfg.node_groups)))
    assert not [x for x in monitor.recorded_resources() if "eviction-guard" in x.name]


@pytest.mark.parametrize("sources", [(), ("10.0.0.0/24", "fd00::/64")])
def test_only_the_webhook_port_is_open_and_only_to_the_api_servers_where_known(sources: tuple[str, ...]) -> None:
    """The guard's NetworkPolicy: ingress to its HTTPS port only, from ``cluster.mig.evictionGuardSources``
    where given (any source otherwise, as the API servers' addresses differ per cluster)."""
    policy = evictionguard.network_policy("nvidia-gpu", sources)
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"] == selector_labels(evictionguard.COMPONENT, "nvidia-gpu")
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": contract.PORT}]
    assert rule.get("from") == ([{"ipBlock": {"cidr": c}} for c in sources] if sources else None)
