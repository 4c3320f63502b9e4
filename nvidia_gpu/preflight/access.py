"""Whether the API server will dry-run the stack's objects for the identity the preview runs as.

``pulumi preview`` has the Kubernetes provider server-side apply every object with ``dryRun=All``; RBAC
authorizes that like the write (``patch``, and ``create`` for an object not there yet). Where the server
refuses it (403), the provider falls back to a client-side diff and says nothing
(``pkg/provider/provider.go``, ``IsForbidden`` at preview), so the server's validation and admission,
what a preview against a cluster is for, are skipped without a word. This check asks the server
(SelfSubjectAccessReview, one per kind, namespace and verb: no object is sent) and names those kinds
with the fix, as one warning line each for the two causes.
"""

from __future__ import annotations

from collections.abc import Iterable

from localcluster.client import ApiError, Kube
from nvidia_gpu.components.manifests import previewaccess
from nvidia_gpu.preflight.model import Finding, ReadRefused, Severity

#: What a server-side apply dry-run is authorized as (``create`` only matters for an object not there yet).
DRY_RUN_VERBS = ("patch", "create")


def _whoami(kube: Kube) -> str:
    """The identity's user name (SelfSubjectReview, GA in 1.28), or "this identity" where the server has none."""
    try:
        doc = kube.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    except ApiError:
        return "this identity"
    name = (doc.get("status") or {}).get("userInfo", {}).get("username")
    return str(name) if name else "this identity"


def dry_run_findings(kube: Kube, objects: Iterable[tuple[str, str, str | None]]) -> list[Finding]:
    """Warnings for the kinds the server will not dry-run for ``kube``'s identity, among ``objects``
    (``(apiVersion, kind, namespace)`` of what the stack applies; None for cluster-scoped). A kind the server
    does not serve yet (its CRD comes with the stack) is left out: nothing can be asked of it. Raises
    :class:`ReadRefused` when the server cannot be asked."""
    refused: set[str] = set()
    exempt: set[str] = set()
    asked: dict[tuple[str, str, str], bool] = {}
    for api_version, kind, namespace in sorted(set(objects), key=lambda o: (o[0], o[1], o[2] or "")):
        try:
            res = kube.resource(api_version, kind)
        except ApiError as e:
            if e.status == 404:
                continue
            raise ReadRefused(f"discovery of {kind} {api_version}: {e}") from None
        group = api_version.rpartition("/")[0]
        where = (namespace or "") if res.namespaced else ""
        for verb in DRY_RUN_VERBS:
            key = (f"{group}/{res.plural}", where, verb)
            if key not in asked:
                try:
                    asked[key] = kube.can_i(verb, res.plural, group=group, namespace=where)
                except ApiError as e:
                    raise ReadRefused(f"SelfSubjectAccessReview ({verb} {res.plural}): {e}") from None
            if not asked[key]:
                (exempt if previewaccess.exempt(api_version) else refused).add(kind)
    if not refused and not exempt:
        return []
    who = _whoami(kube)
    findings = []
    if refused:
        findings.append(Finding(Severity.WARNING, ", ".join(sorted(refused)), (
            f"the server refuses {who} their dry-run (RBAC: {' and '.join(DRY_RUN_VERBS)}), so `pulumi preview` "
            "diffs them client-side, without the API server's validation and admission; set "
            "nvidia-gpu:cluster.previewIdentity to this identity and `pulumi up` once with the deploy "
            "credentials (the stack then grants it dry-runs only)")))
    if exempt:
        findings.append(Finding(Severity.WARNING, ", ".join(sorted(exempt)), (
            f"not dry-run by the server for {who}: admission never sees these kinds, so no policy could hold "
            "a write of them to a dry-run and the preview identity gets none; `pulumi preview` diffs them "
            "client-side (the deploy's `pulumi up` is the first the server sees of them)")))
    return findings
