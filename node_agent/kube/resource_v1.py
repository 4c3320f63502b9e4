"""``resource.k8s.io/v1``: the ResourceSlices a DRA driver publishes for its Node and the claims it prepares."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from node_agent.kube.transport import Kube

GROUP = "/apis/resource.k8s.io/v1"
SLICES = f"{GROUP}/resourceslices"


def get_claim(kube: Kube, namespace: str, name: str, timeout_s: float | None = None) -> dict[str, Any]:
    path = f"{GROUP}/namespaces/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}"
    return kube.get_object(path, timeout=timeout_s, what=f"get ResourceClaim {namespace}/{name}")


def list_slices(kube: Kube, driver: str, node: str | None = None) -> list[dict[str, Any]]:
    """The driver's slices (on ``node`` when given); filtered again here, as the selector is only an
    optimisation and the ownership rule is the driver's."""
    selector = f"spec.driver={driver}" + (f",spec.nodeName={node}" if node is not None else "")
    items = kube.items(SLICES, query={"fieldSelector": selector}, what="list ResourceSlices")
    return [s for s in items if (s.get("spec") or {}).get("driver") == driver
            and (node is None or (s.get("spec") or {}).get("nodeName") == node)]


def create_slice(kube: Kube, body: dict[str, Any]) -> None:
    kube.create(SLICES, body, what=f"create ResourceSlice {body['metadata']['name']}")


def patch_slice(kube: Kube, name: str, body: dict[str, Any]) -> None:
    kube.merge_patch(f"{SLICES}/{quote(name, safe='')}", body, what=f"patch ResourceSlice {name}")


def delete_slice(kube: Kube, name: str) -> None:
    kube.delete(f"{SLICES}/{quote(name, safe='')}", what=f"delete ResourceSlice {name}")
