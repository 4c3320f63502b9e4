"""CI's preview identity, with the real CLI, provider and control plane: the RBAC the stack grants it
(``nvidia-gpu:cluster.previewIdentity``) gets every object server-side validated at ``pulumi preview``,
while its admission policy keeps it from writing anything; the read-only identity the README used to
recommend previews silently without the server, and the preflight's access check says so.

The change only the server can refuse: the cluster's own admission policy (a platform team's
ValidatingAdmissionPolicy allowing DaemonSets only the built-in critical priority classes) against a
``cluster.priorityClassName`` the stack config accepts (any DNS subdomain).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ApiError, ControlPlane, Kube
from localcluster.objects import wait_for
from nvidia_gpu.components.manifests import previewaccess
from nvidia_gpu.preflight.access import dry_run_findings
from nvidia_gpu.preflight.model import Severity
from tests.cluster.pulumi_project import Project, make_project
from tests.cluster.stack import rendered

STACK = "dev"
CI = "ci"
PREVIEWER = "previewer"
READER = "reader"
NAMESPACE = "nvidia-gpu"
PLATFORM_POLICY = "platform-priority-classes"
PLATFORM_MESSAGE = "platform policy: DaemonSets may only use system-node-critical or system-cluster-critical"
RBAC = "rbac.authorization.k8s.io/v1"
ADMISSION = "admissionregistration.k8s.io/v1"


def _admin_setup(kube: Kube) -> None:
    """The CI namespace with both identities; the reader gets what the README used to recommend for
    previews: get, list and watch on everything."""
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CI}})
    for sa in (PREVIEWER, READER):
        kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": CI}})
    kube.create({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "ci-read-only"},
                 "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]})
    kube.create({"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": "ci-read-only"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ci-read-only"},
                 "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": CI}]})


def _platform_policy(kube: Kube) -> None:
    """What a shared cluster's platform team enforces; no schema knows it, only admission does."""
    kube.create({"apiVersion": ADMISSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": PLATFORM_POLICY},
                 "spec": {"failurePolicy": "Fail",
                          "matchConstraints": {"resourceRules": [
                              {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                               "resources": ["daemonsets"]}]},
                          "validations": [{
                              "expression": "object.spec.template.spec.?priorityClassName.orValue('') in "
                                            "['', 'system-node-critical', 'system-cluster-critical']",
                              "message": PLATFORM_MESSAGE}]}})
    kube.create({"apiVersion": ADMISSION, "kind": "ValidatingAdmissionPolicyBinding",
                 "metadata": {"name": PLATFORM_POLICY},
                 "spec": {"policyName": PLATFORM_POLICY, "validationActions": ["Deny"]}})


def _as(project: Project, kube: Kube, name: str) -> Project:
    """The project's CLI environment with a kubeconfig of the ServiceAccount ``ci/name`` (same context name)."""
    work = Path(project.env["KUBECONFIG"]).parent
    config = yaml.safe_load(Path(project.env["KUBECONFIG"]).read_text())
    config["users"][0]["user"] = {"token": kube.token_for(CI, name)}
    path = work / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return Project(project.directory, {**project.env, "KUBECONFIG": str(path)}, project.stack)


@pytest.fixture(scope="module")
def deployed(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The dev stack with a preview identity, up by the admin (the deploy credentials)."""
    kube = cluster.admin()
    _admin_setup(kube)
    project = make_project(cluster, tmp_path_factory.mktemp("preview-identity"), STACK)
    config = yaml.safe_load(project.config_file().read_text())
    config["config"]["nvidia-gpu:cluster"]["previewIdentity"] = {"kind": "ServiceAccount", "name": PREVIEWER,
                                                                "namespace": CI}
    project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    project.pulumi("stack", "init", STACK)
    project.pulumi("up", "--yes", "--skip-preview")
    _platform_policy(kube)
    return project


def _stack_objects(project: Project) -> list[dict[str, Any]]:
    """The Kubernetes objects the stack's state holds (``pulumi stack export``), with whether each is applied."""
    state = json.loads(project.pulumi("stack", "export").stdout)
    out = []
    for r in state["deployment"]["resources"]:
        inputs = r.get("inputs") or {}
        if r["type"].startswith("kubernetes:") and "apiVersion" in inputs and "kind" in inputs:
            out.append({"apiVersion": inputs["apiVersion"], "kind": inputs["kind"],
                        "namespace": (inputs.get("metadata") or {}).get("namespace"),
                        "read": bool(r.get("external"))})  # a KubernetesRead: read, never applied
    return out


def test_the_role_is_derived_from_what_the_stack_applies(cluster: ControlPlane, deployed: Project) -> None:
    """The live role grants create and patch on exactly the kinds the stack applies that admission sees,
    by the plural the server serves (the guess in ``previewaccess.resource_of`` against discovery), and
    no write at all on the admission kinds."""
    kube = cluster.admin()
    role = kube.get(RBAC, "ClusterRole", previewaccess.role_name(NAMESPACE))
    writes = {(g, r) for rule in role["rules"] if "create" in rule["verbs"]
              for g in rule["apiGroups"] for r in rule["resources"]}
    applied = [o for o in _stack_objects(deployed) if not o["read"]]
    expected = set()
    for o in applied:
        res = kube.resource(o["apiVersion"], o["kind"])
        assert previewaccess.resource_of(o["apiVersion"], o["kind"]).resource == res.plural, o
        if not previewaccess.exempt(o["apiVersion"]):
            expected.add((o["apiVersion"].rpartition("/")[0], res.plural))
    assert writes == expected, (sorted(writes - expected), sorted(expected - writes))
    assert not any(g == "admissionregistration.k8s.io" and set(rule["verbs"]) - set(previewaccess.READ)
                   for rule in role["rules"] for g in rule["apiGroups"])


def test_the_preview_identity_dry_runs_every_object_and_writes_none(cluster: ControlPlane, deployed: Project) -> None:
    """With its own token: a server-side apply dry-run of every object of the stack is accepted (roles and
    bindings included: ``escalate``/``bind`` by name) except the admission kinds (RBAC: no verb); a real
    create, a real patch and a real delete are refused, the writes by the policy's message."""
    admin = cluster.admin()
    me = admin.with_token(admin.token_for(CI, PREVIEWER))
    refused = {}
    for m in rendered(STACK).manifests:
        try:
            me.apply(m.object, dry_run=True, force=True, field_manager="preview-identity-test")
        except ApiError as e:
            refused[m.object["kind"]] = e.status
    assert refused == {"ValidatingAdmissionPolicy": 403, "ValidatingAdmissionPolicyBinding": 403}, refused

    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "written", "namespace": NAMESPACE},
                  "data": {"by": PREVIEWER}}
    me.create(config_map, dry_run=True)
    message = (f"ServiceAccount system:serviceaccount:{CI}:{PREVIEWER} is the {NAMESPACE} stack's preview identity: "
               "it may only dry-run")
    with pytest.raises(ApiError) as create:
        me.create(config_map)
    assert create.value.status == 403 and message in create.value.message, create.value
    daemonset = admin.list("apps/v1", "DaemonSet", NAMESPACE)[0]["metadata"]["name"]
    with pytest.raises(ApiError) as patch:
        me.patch("apps/v1", "DaemonSet", daemonset, {"metadata": {"labels": {"written-by": PREVIEWER}}}, NAMESPACE)
    assert patch.value.status == 403 and message in patch.value.message, patch.value
    assert admin.get_or_none("v1", "ConfigMap", "written", NAMESPACE) is None
    with pytest.raises(ApiError) as delete:
        me.delete("apps/v1", "DaemonSet", daemonset, NAMESPACE)
    assert delete.value.status == 403, delete.value  # RBAC: no delete verb at all
    # The preflight's access check names the kinds it cannot dry-run, and only those.
    (finding,) = dry_run_findings(me, [(o["apiVersion"], o["kind"], o["namespace"])
                                       for o in _stack_objects(deployed) if not o["read"]])
    assert finding.severity is Severity.WARNING
    assert finding.subject == "ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding", finding.line()
    assert "admission never sees these kinds" in finding.message


def test_admission_does_not_see_its_own_kinds(cluster: ControlPlane, deployed: Project) -> None:
    """Why the role grants no write on admission policies: given one, the preview identity really creates a
    policy, its dry-run-only policy notwithstanding (the API server exempts admissionregistration kinds)."""
    admin = cluster.admin()
    grant = {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "test-vap-writer"},
             "rules": [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies"],
                        "verbs": ["create"]}]}
    binding = {"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": "test-vap-writer"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test-vap-writer"},
               "subjects": [{"kind": "ServiceAccount", "name": PREVIEWER, "namespace": CI}]}
    admin.create(grant)
    admin.create(binding)
    me = admin.with_token(admin.token_for(CI, PREVIEWER))
    policy = {"apiVersion": ADMISSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "test-written"},
              "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE"], "resources": ["configmaps"]}]},
                       "validations": [{"expression": "true"}]}}
    try:
        wait_for(lambda: me.can_i("create", "validatingadmissionpolicies", group="admissionregistration.k8s.io"),
                 timeout=10, what="the grant in effect")
        me.create(policy)
        assert admin.get_or_none(ADMISSION, "ValidatingAdmissionPolicy", "test-written") is not None
    finally:
        admin.delete(ADMISSION, "ValidatingAdmissionPolicy", "test-written")
        admin.delete(RBAC, "ClusterRoleBinding", "test-vap-writer")
        admin.delete(RBAC, "ClusterRole", "test-vap-writer")


def _preview_refused_config(project: Project) -> None:
    config = yaml.safe_load(project.config_file().read_text())
    config["config"]["nvidia-gpu:cluster"]["priorityClassName"] = "gpu-agents"
    project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))


def test_pulumi_preview_as_the_preview_identity_shows_the_servers_refusal(cluster: ControlPlane,
                                                                          deployed: Project) -> None:
    """The same change previewed by the two identities: the preview identity's preview fails with the
    cluster's own admission message; the README's old read-only identity's passes as an ordinary update
    (the provider's silent client-side fallback), and the access check warns about every kind."""
    admin = cluster.admin()
    previewer, reader = _as(deployed, admin, PREVIEWER), _as(deployed, admin, READER)
    original = deployed.config_file().read_text()
    try:
        _preview_refused_config(deployed)
        done = previewer.pulumi("preview", check=False)
        out = done.stdout + done.stderr
        assert done.returncode != 0, out[-4000:]
        assert PLATFORM_MESSAGE in out and "DaemonSet" in out, out[-4000:]

        done = reader.pulumi("preview", "--json", check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        ops = {s["op"] for s in json.loads(done.stdout)["steps"]
               if s["urn"].split("::")[2].rsplit("$", 1)[-1] == "kubernetes:apps/v1:DaemonSet"}
        assert ops == {"update"}, ops  # passes as if the cluster would take it: what the warning is for
        # ... and the program's preflight says so in the preview's own output.
        assert f"the server refuses system:serviceaccount:{CI}:{READER} their dry-run" in done.stdout, \
            done.stdout[-4000:]
    finally:
        deployed.config_file().write_text(original)
    me = admin.with_token(admin.token_for(CI, READER))
    findings = dry_run_findings(me, [(o["apiVersion"], o["kind"], o["namespace"])
                                     for o in _stack_objects(deployed) if not o["read"]])
    lines = [f.line() for f in findings]
    assert len(findings) == 2 and all(f.severity is Severity.WARNING for f in findings), lines
    refused = findings[0]
    assert "DaemonSet" in refused.subject and "ConfigMap" in refused.subject, lines
    assert f"the server refuses system:serviceaccount:{CI}:{READER} their dry-run" in refused.message, lines
    assert "nvidia-gpu:cluster.previewIdentity" in refused.message, lines
