"""The eviction guard's decision: an Eviction by a node agent passes only for a pod bound to its node.

The node comes from the caller's bound ServiceAccount token (:data:`nvgpu.evictionguard.NODE_CLAIM`,
which the API server puts into ``userInfo.extra``), the pod's node from the API server itself, so
neither is the caller's word. Everything that cannot be decided is refused (fail closed): a token
without a node claim, a pod the guard cannot read. A pod that does not exist is allowed through: the
eviction then answers 404 itself, and no pod is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from node_agent.admission.review import Request
from node_agent.kube.errors import KubeError, NotFound
from node_agent.kube.transport import Kube
from nvgpu.evictionguard import NODE_CLAIM, denial

#: Answers a pod's ``spec.nodeName`` ("" when unbound); raises NotFound for a pod that is not there.
PodNode = Callable[[str, str], str]


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    code: int = 200
    message: str = ""


def pod_node_from(kube: Kube) -> PodNode:
    """The pod's node as the API server has it (a GET of the pod, with the guard's own identity)."""

    def lookup(namespace: str, name: str) -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
        pod = kube.get_object(path, what=f"get pod {namespace}/{name}")
        return str((pod.get("spec") or {}).get("nodeName") or "")

    return lookup


def judge(request: Request, pod_node: PodNode) -> Verdict:
    """Allowed only for ``CREATE pods/eviction`` by a caller whose token names the pod's node."""
    if (request.resource.group, request.resource.resource, request.sub_resource, request.operation) != (
            "", "pods", "eviction", "CREATE"):
        what = f"{request.operation} {request.resource.resource}/{request.sub_resource}".rstrip("/")
        return Verdict(False, 400, f"the eviction guard judges only CREATE pods/eviction, not {what}")
    claim = request.user_info.extra.get(NODE_CLAIM, ())
    if len(claim) != 1 or not claim[0]:
        return Verdict(False, 403, f"{request.user_info.username}'s token names no node ({NODE_CLAIM}); "
                                   "only a pod-bound token may evict through the eviction guard")
    mine = claim[0]
    try:
        theirs = pod_node(request.namespace, request.name)
    except NotFound:
        return Verdict(True)
    except KubeError as e:
        return Verdict(False, 500, f"the eviction guard cannot read pod {request.namespace}/{request.name}: {e}")
    if theirs != mine:
        return Verdict(False, 403, denial(mine, request.namespace, request.name, theirs or None))
    return Verdict(True)
