"""Objects the cluster tests put into a control plane: kwok Nodes and agent identities.

A kwok Node is an ordinary Node object with the annotation kwok watches for: kwok then plays its
kubelet (Ready condition, leases, pods on it Running), so the real DaemonSet controller and scheduler
treat it like a node of the group whose labels and taints it carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from localcluster.client import Kube
from localcluster.controlplane import KWOK_ANNOTATION

T = TypeVar("T")


def kwok_node(name: str, labels: Mapping[str, str] | None = None,
              taints: Sequence[Mapping[str, str]] = (), *, gpus: int = 0) -> dict[str, Any]:
    """A Node that kwok manages; ``gpus`` sets ``nvidia.com/gpu`` capacity as a device plugin would."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "type": "kwok", **(labels or {})}},
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def create_kwok_node(kube: Kube, name: str, labels: Mapping[str, str] | None = None,
                     taints: Sequence[Mapping[str, str]] = (), *, gpus: int = 0,
                     ready_timeout: float = 30.0) -> dict[str, Any]:
    """Create the Node and wait until kwok has reported it Ready."""
    obj = kwok_node(name, labels, taints, gpus=gpus)
    kube.create(obj)
    if gpus:  # capacity is status: the create drops it, so set it through the status subresource
        kube.patch("v1", "Node", name, {"status": {"capacity": obj["status"]["capacity"],
                                                   "allocatable": obj["status"]["allocatable"]}},
                   subresource="status")

    def ready() -> dict[str, Any] | None:
        node = kube.get("v1", "Node", name)
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return node if conds.get("Ready") == "True" else None

    return wait_for(ready, timeout=ready_timeout, what=f"kwok Node {name} Ready")


def wait_for(probe: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.1,
             what: str = "condition") -> T:
    """Poll ``probe`` until it answers something truthy; raise with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def service_account_kube(admin: Kube, namespace: str, name: str, *, seconds: int = 3600,
                         pod: Mapping[str, Any] | None = None) -> Kube:
    """A connection as ``namespace/name`` with a TokenRequest token; ``pod`` binds it to a Pod object
    (as the kubelet's projected token is), which adds the pod's node name to the identity."""
    body: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": seconds}}
    if pod is not None:
        body["spec"]["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                          "uid": pod["metadata"]["uid"]}
    doc = admin.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body,
                        what=f"TokenRequest for {namespace}/{name}")
    return admin.with_token(str(doc["status"]["token"]))


def write_kubeconfig(kube: Kube, path: Path, user: str = "agent") -> Path:
    path.write_text(kube.kubeconfig_text(user))
    path.chmod(0o600)
    return path
