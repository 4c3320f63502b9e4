"""Run agents as the DaemonSets would: with the identity of their pod on a kwok Node.

The DaemonSet controller and the scheduler put the agent's pod on the node (kwok marks it Running);
a TokenRequest bound to that pod gives the same token the kubelet would mount into it, carrying the
ServiceAccount, the pod and the node name (``authentication.kubernetes.io/node-name``), so RBAC and
the stack's admission policies judge the agent exactly as in a cluster.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster import Kube
from localcluster.objects import kwok_node, service_account_kube, wait_for, write_kubeconfig
from nvgpu import labels as names_
from tests.kit.ports import private_ports

NS = "nvidia-gpu"
REPO = Path(__file__).resolve().parents[2]


def daemonset_pod(kube: Kube, daemonset: str, node: str, *, namespace: str = NS,
                  timeout: float = 120.0) -> dict[str, Any]:
    """The pod of ``daemonset`` on ``node`` once it is Running."""

    def find() -> dict[str, Any] | None:
        for pod in kube.list("v1", "Pod", namespace, fieldSelector=f"spec.nodeName={node}"):
            owners = pod["metadata"].get("ownerReferences", [])
            ours = any(o.get("kind") == "DaemonSet" and o.get("name") == daemonset for o in owners)
            running = pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
            if ours and running:
                return pod  # type: ignore[no-any-return]
        return None

    return wait_for(find, timeout=timeout, interval=0.2, what=f"{daemonset} pod Running on {node}")


@dataclass(frozen=True)
class AgentIdentity:
    """The pod an agent stands in for, a connection as its ServiceAccount, and a kubeconfig file."""

    pod: dict[str, Any]
    kube: Kube
    kubeconfig: Path

    @property
    def service_account(self) -> str:
        return str(self.pod["spec"]["serviceAccountName"])


def identity(kube: Kube, daemonset: str, node: str, directory: Path, *, namespace: str = NS) -> AgentIdentity:
    """The identity of ``daemonset``'s pod on ``node``: a token bound to that pod, in a kubeconfig."""
    pod = daemonset_pod(kube, daemonset, node, namespace=namespace)
    sa = service_account_kube(kube, namespace, pod["spec"]["serviceAccountName"], pod=pod)
    directory.mkdir(parents=True, exist_ok=True)
    path = write_kubeconfig(sa, directory / f"{daemonset}-{node}.kubeconfig", user=pod["spec"]["serviceAccountName"])
    return AgentIdentity(pod=pod, kube=sa, kubeconfig=path)


def agent_command(*args: str) -> list[str]:
    """``python -m node_agent ARGS`` with this interpreter (the image's entry point), a rendered fixed port
    replaced by a free one (``tests.kit.ports.private_ports``)."""
    return [sys.executable, "-m", "node_agent", *private_ports(args)]


def run_agent(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A one-shot agent command as a process; stdout and stderr captured."""
    return subprocess.run(agent_command(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env, check=False)


def config_map_files(data: Mapping[str, str], directory: Path) -> Path:
    """A ConfigMap's ``data`` as the kubelet mounts it: one file per key in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in data.items():
        (directory / name).write_text(text)
    return directory


def with_config_dir(args: list[str], configs: Path) -> list[str]:
    """A container's arguments with ``--config-dir`` (where the ConfigMap is mounted in the pod) moved to
    ``configs`` (:func:`config_map_files`); arguments without one are returned as they are."""
    return [str(configs) if i and args[i - 1] == "--config-dir" else a for i, a in enumerate(args)]


def container_env(container: dict[str, Any], node: str) -> dict[str, str]:
    """A rendered container's env as the kubelet gives it to a pod on ``node`` (plain values, and the
    ``fieldRef: spec.nodeName`` the agents use for ``NODE_NAME``; any other source is refused)."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            # A live pod's spec carries the defaulted apiVersion; a rendered one does not.
            ref = {k: v for k, v in var["valueFrom"].get("fieldRef", {}).items() if (k, v) != ("apiVersion", "v1")}
            assert var["valueFrom"] == {"fieldRef": var["valueFrom"].get("fieldRef")} and ref == {
                "fieldPath": "spec.nodeName"}, var
            env[var["name"]] = node
    return env


def read_node(kube: Kube, name: str) -> dict[str, Any]:
    node: dict[str, Any] = kube.get("v1", "Node", name)
    return node


def node_labels(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("labels") or {})


def node_annotations(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("annotations") or {})


def node_taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node["spec"].get("taints") or [])


def one_run(args: list[str]) -> list[str]:
    """The DaemonSet's arguments without ``--loop --interval N``: one labelling run that prints its result."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--loop":
            continue
        elif a in ("--interval", "--iterations"):
            skip = True
        else:
            out.append(a)
    return out


def create_group_nodes(kube: Kube, stack: Any, node_group: str, names: Sequence[str]) -> None:
    """kwok Nodes of a Deckhouse NodeGroup, as Deckhouse makes them from the stack's node template (its
    labels and taints) and past node setup, so the group's DaemonSets schedule their pods there."""
    template = dict(stack.object("NodeGroup", node_group)["spec"]["nodeTemplate"])
    labels = {names_.DECKHOUSE_NODE_GROUP: node_group, **template.get("labels", {}), names_.GPU_SETUP_COMPLETE: ""}
    for name in names:
        kube.create(kwok_node(name, labels, template.get("taints", [])))
