"""Before ``pulumi up`` applies the node template patches: other managers' claims on the NodeGroups'
``spec.nodeTemplate`` and ``labels`` containers released, so that ``pulumi destroy`` can withdraw ours.

The one write the program makes itself rather than through the provider, because the provider cannot
make it: server-side apply never moves a claim on a container (only conflicting values move), and it
refuses ``managedFields`` in an applied object. ``destroy`` does not run the program, so the release
must already be in place when it runs; every ``up`` (not a preview) makes it, which also repairs a stack
whose patches an older version applied. See :func:`nvidia_gpu.components.manifests.deckhouse.
released_container_claims` for the mechanism; only the ``managedFields`` of the NodeGroups the stack
patches change, under the object's ``resourceVersion`` (a concurrent writer makes it read and try again).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from localcluster.client import ApiError, Kube
from nvgpu.stackconfig import NodeSetupBackend, StackConfig
from nvidia_gpu.components.manifests import deckhouse
from nvidia_gpu.preflight.model import ReadRefused
from nvidia_gpu.preflight.reader import connect

#: Reads and writes per NodeGroup when another writer keeps changing it between the two.
ATTEMPTS = 3


class ReleaseFailed(RuntimeError):
    """The API server refused the release (RBAC, validation): one line naming the NodeGroup."""


def release(kube: Kube, node_group: str, manager: str) -> list[str]:
    """Release the claims on one NodeGroup; the managers whose claims went (empty: nothing to do, or the
    NodeGroup is gone, which the program's read of it reports at preview)."""
    for _ in range(ATTEMPTS):
        live = kube.get_or_none(deckhouse.NODE_GROUP_API, "NodeGroup", node_group)
        if not isinstance(live, dict):
            return []
        meta = live.get("metadata") or {}
        before = meta.get("managedFields") or []
        after = deckhouse.released_container_claims(before, manager)
        if after is None:
            return []
        # The resourceVersion makes the write conditional: 409 when another writer got there first.
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "managedFields": after}}
        try:
            kube.patch(deckhouse.NODE_GROUP_API, "NodeGroup", node_group, patch)
        except ApiError as e:
            if e.status == 409:
                continue  # changed since the read: read again
            raise ReleaseFailed(f"NodeGroup {node_group}: releasing other managers' claims on spec.nodeTemplate "
                                f"(so that destroy can withdraw this stack's labels) was refused: {e.status} "
                                f"{e.reason}: {e.message}") from None
        return sorted({str(m.get("manager")) for m in before if m not in after})
    raise ReleaseFailed(f"NodeGroup {node_group}: changed by another writer on each of {ATTEMPTS} attempts to "
                        "release other managers' claims on spec.nodeTemplate; run `pulumi up` again")


def run(config: StackConfig, kubeconfigs: Sequence[Path]) -> list[str]:
    """Release the claims on every NodeGroup the stack patches; one line per NodeGroup changed. Nothing
    to do under the daemonset backend, or without a kubeconfig file (the provider then says why it
    cannot connect)."""
    if config.cluster.node_setup is not NodeSetupBackend.DECKHOUSE:
        return []
    try:
        kube = connect(kubeconfigs, config.cluster.kube_context)
    except ReadRefused:
        return []
    if kube is None:
        return []
    manager = deckhouse.field_manager(config.cluster.namespace)
    lines = []
    for name in sorted({g.node_group for g in config.node_groups if g.node_group}):
        try:
            managers = release(kube, name, manager)
        except (ApiError, OSError) as e:
            raise ReleaseFailed(f"NodeGroup {name}: cannot read it to release other managers' claims on "
                                f"spec.nodeTemplate: {e}") from None
        if managers:
            lines.append(f"NodeGroup {name}: released the claims of {', '.join(managers)} on spec.nodeTemplate "
                         "itself (their labels stay theirs), so that destroy can withdraw this stack's")
    return lines
