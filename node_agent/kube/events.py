"""Events on the agent's own Node, so ``kubectl describe node`` shows what an agent did and why.

core/v1 Events in ``default`` with ``involvedObject`` the Node, as kubelet writes its own node events
(``kubectl describe node`` and ``kubectl get events`` both list them; events.k8s.io/v1 would need a
second RBAC rule for nothing more). ``generateName`` lets the API server pick a unique name, so two
agents on one Node never collide. Messages are cut to 1024 characters, the API server's limit.
"""

from __future__ import annotations

import time

from node_agent.kube.transport import Kube

#: Node events live in ``default``, as kubelet's do.
EVENT_NAMESPACE = "default"


def node_event_body(node: str, node_uid: str, *, component: str, reason: str, message: str,
                    warning: bool) -> dict[str, object]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid},
        "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
        "source": {"component": component, "host": node},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


def post_node_event(kube: Kube, node: str, node_uid: str, *, component: str, reason: str, message: str,
                    warning: bool) -> None:
    """Record one Event on the Node (raises like :meth:`Kube.request`; callers decide if it matters)."""
    body = node_event_body(node, node_uid, component=component, reason=reason, message=message, warning=warning)
    kube.create(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body, what=f"create event {reason} on node {node}")
