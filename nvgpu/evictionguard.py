"""The eviction guard's contract: the admission webhook that keeps the MIG manager's evictions on its node.

Where the MIG manager drains its own node (``--drain cordon``, clusters without Deckhouse) it needs
``pods/eviction``, and RBAC grants that for every pod in the cluster. No ValidatingAdmissionPolicy can
narrow it: an Eviction names only the pod, and the API server admits the Eviction object, never the
pod it deletes. A webhook can look the pod up. The guard answers only for the MIG manager's own
ServiceAccount (a ``matchCondition``), so the cluster's other evictions never wait on it, and it fails
closed (``failurePolicy: Fail``): when the guard is down the manager cannot evict, and retries.

Shared by the stack (which emits the guard's Deployment, Service, RBAC and webhook configuration) and
the agent (``node_agent.admission``, which serves it and keeps the webhook's CA bundle current), so the
names, the port and the message are spelled once.
"""

from __future__ import annotations

COMPONENT = "eviction-guard"
#: The one webhook in the configuration, and the path the guard serves it on.
WEBHOOK_NAME = "evictions.mig-manager.nvidia-gpu.io"
WEBHOOK_PATH = "/validate-eviction"
#: The container's HTTPS port (unprivileged) and the Service's.
PORT = 8443
SERVICE_PORT = 443
#: The bound ServiceAccount token's claim naming the node its pod runs on (Kubernetes 1.30+).
NODE_CLAIM = "authentication.kubernetes.io/node-name"
#: The manager name of the guard's writes to the webhook configuration (it owns only ``caBundle``).
FIELD_MANAGER = "nvidia-gpu-eviction-guard"


def service_name() -> str:
    return COMPONENT


def configuration_name(namespace: str) -> str:
    """Cluster-scoped, so prefixed with the stack's namespace like the stack's other cluster objects."""
    return f"{namespace}-{COMPONENT}"


def service_hosts(namespace: str) -> tuple[str, ...]:
    """The names the API server may dial the Service by; each is in the serving certificate."""
    svc = service_name()
    return (f"{svc}.{namespace}.svc", f"{svc}.{namespace}.svc.cluster.local", f"{svc}.{namespace}", svc)


def denial(agent_node: str, namespace: str, pod: str, pod_node: str | None) -> str:
    """Why an eviction is refused; the same words the tests and the runbook quote."""
    where = f"on node {pod_node}" if pod_node else "bound to no node"
    return (f"the mig-manager on node {agent_node} may only evict pods on its own node, "
            f"not {namespace}/{pod} {where}")
