"""Other managers' claims on a NodeGroup's node template containers, released so that ``destroy`` can
withdraw the stack's labels (``deckhouse.released_container_claims``).

The ``managedFields`` below are the ones kube-apiserver 1.34 wrote for the sequences named (measured with
``kubectl patch`` against the local control plane; ``tests/cluster/test_day_two_nodegroup.py`` runs them
end to end with the real CLI and provider).
"""

from __future__ import annotations

import copy
from typing import Any

from nvidia_gpu.components.manifests.deckhouse import field_manager, released_container_claims

OURS = field_manager("nvidia-gpu")
CREATOR = {"manager": "kubectl-create", "operation": "Update", "apiVersion": "deckhouse.io/v1",
           "fieldsV1": {"f:spec": {".": {}, "f:nodeType": {}}}}
STACK = {"manager": OURS, "operation": "Apply", "apiVersion": "deckhouse.io/v1",
         "fieldsV1": {"f:spec": {"f:nodeTemplate": {"f:labels": {"f:nvidia.com/gpu.present": {}},
                                                    "f:taints": {}}}}}


def kubectl(template: dict[str, Any]) -> dict[str, Any]:
    return {"manager": "kubectl-patch", "operation": "Update", "apiVersion": "deckhouse.io/v1",
            "fieldsV1": {"f:spec": {"f:nodeTemplate": template}}}


def test_a_map_kubectl_created_keeps_kubectls_label_and_loses_only_the_claims_on_the_containers() -> None:
    # `kubectl patch` added the first label (team) before the stack: its update created both containers.
    fields = [CREATOR, STACK, kubectl({".": {}, "f:labels": {".": {}, "f:team": {}}})]
    before = copy.deepcopy(fields)
    assert released_container_claims(fields, OURS) == [CREATOR, STACK, kubectl({"f:labels": {"f:team": {}}})]
    assert fields == before  # not changed in place: the caller writes the new list conditionally


def test_a_bare_claim_left_after_kubectl_removed_its_label_goes_with_the_whole_entry() -> None:
    # The label removed again: kubectl claims the two containers and nothing inside them; this is the
    # state in which relinquishing the stack's keys left `labels: null` (refused by the NodeGroup schema).
    fields = [CREATOR, STACK, kubectl({".": {}, "f:labels": {}})]
    assert released_container_claims(fields, OURS) == [CREATOR, STACK]


def test_a_bare_claim_on_the_node_template_itself_goes() -> None:
    # kubectl created the node template with a labels map, and later deleted the whole map.
    assert released_container_claims([CREATOR, STACK, kubectl({})], OURS) == [CREATOR, STACK]


def test_claims_on_keys_and_on_other_fields_are_kept() -> None:
    annotations = kubectl({".": {}, "f:annotations": {".": {}, "f:owner": {}}, "f:labels": {"f:team": {}}})
    fields = [CREATOR, STACK, annotations]
    assert released_container_claims(fields, OURS) == [CREATOR, STACK, kubectl(
        {"f:annotations": {".": {}, "f:owner": {}}, "f:labels": {"f:team": {}}})]
    # Nothing to release: None, so the program writes nothing.
    assert released_container_claims([CREATOR, STACK, kubectl({"f:labels": {"f:team": {}}})], OURS) is None
    assert released_container_claims([CREATOR, STACK], OURS) is None


def test_an_entry_with_other_spec_fields_keeps_them() -> None:
    owner = {"manager": "deckhouse-controller", "operation": "Update", "apiVersion": "deckhouse.io/v1",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}},
                          "f:spec": {"f:nodeType": {}, "f:nodeTemplate": {".": {}}}}}
    assert released_container_claims([owner, STACK], OURS) == [
        {**owner, "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}, "f:spec": {"f:nodeType": {}}}}, STACK]


def test_our_own_entry_is_never_touched() -> None:
    ours = {**STACK, "fieldsV1": {"f:spec": {"f:nodeTemplate": {".": {}, "f:labels": {".": {}}}}}}
    assert released_container_claims([CREATOR, ours], OURS) is None
