"""The eviction guard as the stack deploys it, against the real API server, served from this process.

The stack's own manifests (``nvidia_gpu.components.manifests.evictionguard``): the guard's ServiceAccount
and ClusterRole, and the ValidatingWebhookConfiguration with one change, its ``clientConfig``: a URL on
loopback instead of the Service (no pod network here). The guard runs with its ServiceAccount's token, so
RBAC judges its pod reads and its CA-bundle patch as in a cluster; its certificate names 127.0.0.1 too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster import Kube
from localcluster.objects import service_account_kube, wait_for, write_kubeconfig
from node_agent.admission.server import EvictionGuard, GuardSettings
from node_agent.kube.transport import Kube as AgentKube
from nvgpu import evictionguard as contract
from nvidia_gpu.components.manifests import evictionguard as manifests


@dataclass
class RunningGuard:
    guard: EvictionGuard
    configuration: dict[str, Any]


def webhook_at(namespace: str, url: str) -> dict[str, Any]:
    """The stack's webhook configuration, pointed at ``url``."""
    configuration = copy.deepcopy(manifests.webhook_configuration(namespace))
    (hook,) = configuration["webhooks"]
    hook["clientConfig"] = {"url": url}
    return configuration


@contextmanager
def running_guard(kube: Kube, namespace: str, directory: Path) -> Iterator[RunningGuard]:
    """The guard serving on loopback and trusted by the API server; removed again afterwards."""
    # The policy first, as the stack registers it: the guard may patch only once it holds.
    objects = (manifests.ca_only_policy(namespace), manifests.ca_only_policy_binding(namespace),
               *manifests.rbac(namespace))
    for obj in objects:
        kube.apply(obj)
    sa = service_account_kube(kube, namespace, contract.COMPONENT)
    directory.mkdir(parents=True, exist_ok=True)
    agent_kube = AgentKube.connect(write_kubeconfig(sa, directory / "eviction-guard.kubeconfig",
                                                    user=contract.COMPONENT))
    settings = GuardSettings(namespace=namespace, configuration=contract.configuration_name(namespace),
                             hosts=(*contract.service_hosts(namespace), "127.0.0.1"), listen=("127.0.0.1", 0),
                             retry_s=0.2)
    guard = EvictionGuard(settings, agent_kube)
    configuration = webhook_at(namespace, f"https://127.0.0.1:{guard.port}{contract.WEBHOOK_PATH}")
    kube.apply(configuration)
    guard.start()
    try:
        wait_for(lambda: guard.trusted.is_set() or None, timeout=30, interval=0.1,
                 what="the webhook configuration trusting the guard's CA")
        yield RunningGuard(guard, configuration)
    finally:
        guard.stop()
        kube.delete("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
                    configuration["metadata"]["name"])
        for obj in reversed(objects):
            kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"],
                        obj["metadata"].get("namespace"))
