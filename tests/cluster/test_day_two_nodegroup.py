"""Day two on a Deckhouse cluster: hand edits of the NodeGroups the stack patches, then ``pulumi destroy``,
with the real CLI, provider, ``kubectl`` and API server (issue 34).

Destroy relinquishes the stack's node template patch (the provider applies an empty patch under the
stack's field manager): it must take off exactly the stack's labels and taints and leave whatever other
managers set, whatever they did. One ``up`` of a four-group stack, one hand edit per NodeGroup:

* gpu-a30: a label ``kubectl patch`` added before the stack and removed after it. kubectl's update
  created the labels map, so it claims the map itself; relinquishing used to empty the map under that
  claim, the API server sent ``labels: null`` and the NodeGroup schema refused it on every retry. The
  ``up`` releases such claims (``nvidia_gpu.preflight.nodetemplate``);
* gpu-l4: a label kubectl added and kept, and one of the stack's keys rewritten by hand (kubectl's from
  then on, as server-side apply has it: destroy leaves it);
* gpu-a100: every node template label deleted by hand (the group's taints, extraTaints included, stay);
* gpu-h100: the NodeGroup itself deleted by hand. The provider relinquishes with an apply, which would
  create the NodeGroup and is refused (``spec`` is required): that destroy fails, and the second one,
  ``pulumi destroy --refresh`` as the README says, finds it gone and finishes.

A second ``up`` then shows the way out for a stack an older version applied (test_3).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane, Kube
from nvgpu import labels
from nvidia_gpu.components.manifests.deckhouse import NODE_GROUP_API, field_manager
from tests.cluster.pulumi_project import Project, make_project
from tests.kit.tools import required_bin

STACK = "dev"
OURS = field_manager("nvidia-gpu")
#: The dev stack's groups kept, by the NodeGroup each patches (the DRA group and monitoring left out: cost).
GROUPS = {"a30-mps": "gpu-a30", "l4-shared": "gpu-l4", "a100-train": "gpu-a100", "h100-mig": "gpu-h100"}


def _kubectl(project: Project, *args: str) -> str:
    """The real ``kubectl`` (its field manager ``kubectl-patch``, merge patches as an operator types them)."""
    done = subprocess.run([str(required_bin("kubectl") / "kubectl"), *args], env=project.env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def _patch_labels(project: Project, node_group: str, values: dict[str, Any] | None) -> None:
    body = {"spec": {"nodeTemplate": {"labels": values}}}
    _kubectl(project, "patch", "nodegroups.deckhouse.io", node_group, "--type=merge", "-p", json.dumps(body))


def _node_group(kube: Kube, name: str) -> Any:
    return kube.get_or_none(NODE_GROUP_API, "NodeGroup", name)


def _template_fields(ng: dict[str, Any], manager: str) -> dict[str, Any] | None:
    """What ``manager`` claims under ``spec.nodeTemplate`` (None: nothing)."""
    for m in ng["metadata"].get("managedFields") or []:
        if m["manager"] == manager:
            found: dict[str, Any] | None = m.get("fieldsV1", {}).get("f:spec", {}).get("f:nodeTemplate")
            return found
    return None


@pytest.fixture(scope="module")
def project(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Project:
    p = make_project(cluster, tmp_path_factory.mktemp("day-two"), STACK)
    config = yaml.safe_load(p.config_file().read_text())
    config["config"]["nvidia-gpu:nodeGroups"] = [g for g in config["config"]["nvidia-gpu:nodeGroups"]
                                                 if g["name"] in GROUPS]
    assert {g["name"]: g["nodeGroup"] for g in config["config"]["nvidia-gpu:nodeGroups"]} == GROUPS
    cluster_config = config["config"]["nvidia-gpu:cluster"]
    cluster_config.pop("dra", None)  # its claim quotas need a DRA group
    cluster_config["monitoring"] = {"enabled": False}
    p.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    p.pulumi("stack", "init", STACK)
    return p


@pytest.fixture(scope="module")
def specs_before(cluster: ControlPlane, project: Project) -> dict[str, Any]:
    """The NodeGroups' specs as the cluster's owner made them, before the stack or any hand edit."""
    return {ng: _node_group(cluster.admin(), ng)["spec"] for ng in GROUPS.values()}


@pytest.mark.timeout(300)  # engine runs on 2 shared cores
def test_1_up_over_a_map_kubectl_created_releases_kubectls_claim_on_it(cluster: ControlPlane, project: Project,
                                                                      specs_before: dict[str, Any]) -> None:
    kube = cluster.admin()
    _patch_labels(project, "gpu-a30", {"team": "inference"})  # creates nodeTemplate.labels
    assert _template_fields(_node_group(kube, "gpu-a30"), "kubectl-patch") == {
        ".": {}, "f:labels": {".": {}, "f:team": {}}}
    done = project.pulumi("up", "--yes", "--skip-preview")
    assert "NodeGroup gpu-a30: released the claims of kubectl-patch on spec.nodeTemplate" in done.stdout, \
        done.stdout[-3000:]
    ng = _node_group(kube, "gpu-a30")
    # kubectl keeps its label and its claim on it; only the claims on the two containers went.
    assert _template_fields(ng, "kubectl-patch") == {"f:labels": {"f:team": {}}}
    assert ng["spec"]["nodeTemplate"]["labels"]["team"] == "inference"
    for name in GROUPS.values():
        assert set(_template_fields(_node_group(kube, name), OURS) or {}) == {"f:labels", "f:taints"}, name


@pytest.mark.timeout(300)  # engine runs on 2 shared cores
def test_2_hand_edits_then_destroy_withdraws_exactly_the_stacks_fields(
        cluster: ControlPlane, project: Project, specs_before: dict[str, Any]) -> None:
    kube = cluster.admin()
    # (a) the label kubectl added before the stack removed, and one more added and removed.
    _patch_labels(project, "gpu-a30", {"team": None})
    _patch_labels(project, "gpu-a30", {"owner": "ml"})
    _patch_labels(project, "gpu-a30", {"owner": None})
    # (b) a label of the platform team's, kept; and one of the stack's keys rewritten by hand, back to its
    # value: the key is kubectl's from then on (server-side apply moves ownership on an update).
    _patch_labels(project, "gpu-l4", {"team": "notebooks"})
    sharing = _node_group(kube, "gpu-l4")["spec"]["nodeTemplate"]["labels"][labels.DEVICE_GPU_CONFIG]
    _patch_labels(project, "gpu-l4", {labels.DEVICE_GPU_CONFIG: "debug"})
    _patch_labels(project, "gpu-l4", {labels.DEVICE_GPU_CONFIG: sharing})
    # (c) every node template label deleted by hand.
    _patch_labels(project, "gpu-a100", None)
    a100 = _node_group(kube, "gpu-a100")["spec"]["nodeTemplate"]
    assert "labels" not in a100 and a100["taints"], a100
    # (d) the NodeGroup deleted.
    _kubectl(project, "delete", "nodegroups.deckhouse.io", "gpu-h100")

    # The provider relinquishes gpu-h100's patch with an apply that would create the NodeGroup: refused
    # (spec is required), so this destroy fails there, and there only.
    done = project.pulumi("destroy", "--yes", check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "h100-mig-node-template" in out and "must be of type object" not in out, out[-4000:]
    assert _node_group(kube, "gpu-h100") is None  # not recreated

    # (e) The second destroy, with a refresh that finds gpu-h100 gone, finishes.
    project.pulumi("destroy", "--yes", "--refresh")
    state = json.loads(project.pulumi("stack", "export").stdout)
    assert not [r["urn"] for r in state["deployment"].get("resources") or []
                if r["type"].startswith("kubernetes:")]

    left = {name: _node_group(kube, name) for name in GROUPS.values()}
    assert left["gpu-h100"] is None
    for name, ng in left.items():
        if ng is not None:
            assert _template_fields(ng, OURS) is None, (name, ng["metadata"]["managedFields"])
    # (a) and (c): back to the spec the owner made (no node template left at all).
    assert left["gpu-a30"]["spec"] == specs_before["gpu-a30"], left["gpu-a30"]["spec"]
    assert left["gpu-a100"]["spec"] == specs_before["gpu-a100"], left["gpu-a100"]["spec"]
    # (b) the platform team's label, the key kubectl rewrote, and nothing else of the stack's (taints gone).
    assert left["gpu-l4"]["spec"] == {**specs_before["gpu-l4"], "nodeTemplate": {
        "labels": {"team": "notebooks", labels.DEVICE_GPU_CONFIG: sharing}}}


@pytest.mark.timeout(300)  # engine runs on 2 shared cores
def test_3_a_stack_an_older_version_applied_needs_one_up_after_its_failed_destroy(
        cluster: ControlPlane, project: Project, specs_before: dict[str, Any]) -> None:
    """What the stack's ``up`` left before the release existed, and a label kubectl added and removed:
    kubectl's bare claim on the node template beside the stack's keys. That destroy fails as issue 34
    reports, and the rest of the stack is gone; one ``pulumi up`` targeted at the patches (the program
    releases the claims whatever it targets) lets the next destroy finish."""
    kube = cluster.admin()
    kube.create({"apiVersion": NODE_GROUP_API, "kind": "NodeGroup", "metadata": {"name": "gpu-h100"},
                 "spec": {"nodeType": "Static"}})  # deleted by hand in test_2
    project.pulumi("up", "--yes", "--skip-preview")
    ng = _node_group(kube, "gpu-a30")
    assert _template_fields(ng, "kubectl-patch") is None
    # The entry kube-apiserver wrote for kubectl in that sequence (tests/nvidia_gpu/components/
    # test_node_template_claims.py); managedFields given in an update are stored as given.
    claim = {"manager": "kubectl-patch", "operation": "Update", "apiVersion": NODE_GROUP_API,
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:nodeTemplate": {".": {}, "f:labels": {}}}}}
    kube.patch(NODE_GROUP_API, "NodeGroup", "gpu-a30", {"metadata": {
        "resourceVersion": ng["metadata"]["resourceVersion"], "managedFields": [*ng["metadata"]["managedFields"],
                                                                                claim]}})
    assert _template_fields(_node_group(kube, "gpu-a30"), "kubectl-patch") == {".": {}, "f:labels": {}}

    done = project.pulumi("destroy", "--yes", check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and 'spec.nodeTemplate.labels: Invalid value: "null"' in out, out[-3000:]

    done = project.pulumi("up", "--yes", "--skip-preview", "--target", "**NodeGroupPatch::*")
    assert "NodeGroup gpu-a30: released the claims of kubectl-patch" in done.stdout, done.stdout[-3000:]
    project.pulumi("destroy", "--yes")
    left = _node_group(kube, "gpu-a30")
    assert left["spec"] == specs_before["gpu-a30"], left["spec"]
    assert _template_fields(left, OURS) is None and _template_fields(left, "kubectl-patch") is None
