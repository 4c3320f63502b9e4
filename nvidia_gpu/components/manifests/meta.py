"""Names and ``app.kubernetes.io/*`` labels shared by every object the stack creates.

Kubernetes names are derived from the stack namespace and the node group so two stacks on one
cluster (or two groups in one stack) never collide, and selectors only ever use the stable subset.
"""

from __future__ import annotations

from nvgpu import labels

PART_OF = "nvidia-gpu"
MANAGED_BY = "pulumi"


def app_labels(
    component: str, instance: str, node_group: str | None = None, version: str | None = None
) -> dict[str, str]:
    """The recommended label set; ``version`` is added only when it is a valid label value (a tag)."""
    out = {
        "app.kubernetes.io/name": component,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
    if version:
        out["app.kubernetes.io/version"] = version
    if node_group is not None:
        out[labels.NODE_GROUP] = node_group
    return out


def shared_labels(component: str) -> dict[str, str]:
    """The labels of a cluster-wide definition every stack on a cluster applies alike (see
    :mod:`nvidia_gpu.components.manifests.shared`): nothing that names the stack or its version, so two
    stacks' server-side applies hold the same values and co-own them instead of conflicting."""
    return {
        "app.kubernetes.io/name": component,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector_labels(component: str, instance: str) -> dict[str, str]:
    """The immutable subset used in DaemonSet selectors (changing it would force a replace)."""
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/instance": instance}


def group_object_name(component: str, group: str) -> str:
    """``<component>-<group>``: namespaced objects of one node group."""
    return f"{component}-{group}"


def cluster_object_name(namespace: str, component: str) -> str:
    """``<namespace>-<component>``: cluster-scoped objects, unique per stack namespace."""
    return f"{namespace}-{component}"
