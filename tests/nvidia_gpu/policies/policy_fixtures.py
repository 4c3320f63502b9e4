"""Builders for the manifests the policy tests feed in, and direct calls into the policies.

Policies are called the way the reference's "direct calls" option describes: ``ResourceValidationArgs`` /
``StackValidationArgs`` built by hand and a ``report_violation`` that records messages, so each test
asserts the exact text a rule reports. Nothing here constructs a ``PolicyPack``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from nvgpu import labels
from nvidia_gpu.policies.pack import POLICIES

DS_TYPE = "kubernetes:apps/v1:DaemonSet"
CM_TYPE = "kubernetes:core/v1:ConfigMap"
NS_TYPE = "kubernetes:core/v1:Namespace"
ROLE_TYPE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
DEVICE_CLASS_TYPE = "kubernetes:resource.k8s.io/v1:DeviceClass"
NODE_GROUP_PATCH_TYPE = "kubernetes:deckhouse.io/v1:NodeGroupPatch"
IMAGE = "registry.example.com/nvidia-gpu-agent:0.1.0"


def _opts() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def policy(name: str) -> ResourceValidationPolicy | StackValidationPolicy:
    return next(p for p in POLICIES if p.name == name)


def check(
    name: str, resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any] | None = None
) -> list[str]:
    """Run one resource policy on one resource; return the reported messages."""
    p = policy(name)
    assert isinstance(p, ResourceValidationPolicy)
    out: list[str] = []
    args = ResourceValidationArgs(resource_type, props, f"urn:pulumi:t::p::{resource_type}::x", "x", _opts(), None,
                                  dict(config or {}))

    def report(message: str, urn: str | None = None) -> None:
        out.append(message)

    p.validate(args, report)
    return out


def check_stack(
    name: str, resources: Sequence[tuple[str, Mapping[str, Any]]], config: Mapping[str, Any] | None = None
) -> list[tuple[str, str | None]]:
    """Run one stack policy; resources get URNs ``urn:<i>``; returns ``(message, urn)`` pairs."""
    p = policy(name)
    assert isinstance(p, StackValidationPolicy)
    out: list[tuple[str, str | None]] = []
    res = [PolicyResource(t, props, f"urn:{i}", f"r{i}", _opts(), None, None, [], {})
           for i, (t, props) in enumerate(resources)]

    def report(message: str, urn: str | None = None) -> None:
        out.append((message, urn))

    p.validate(StackValidationArgs(res, dict(config or {})), report)
    return out


def pulumi_config(values: Mapping[str, Any]) -> str:
    """``PULUMI_CONFIG`` as the CLI sets it: full keys, structured values as JSON text."""
    return json.dumps({f"nvidia-gpu:{k}": json.dumps(v) for k, v in values.items()})


def container(name: str = "agent", **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": IMAGE,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
    }
    c.update(extra)
    return c


def gpu_terms(group: str = "h100", *, gate: bool = True, extra: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    exprs = [{"key": labels.DECKHOUSE_NODE_GROUP, "operator": "In", "values": [group]}, *extra]
    if gate:
        exprs.append({"key": labels.GPU_SETUP_COMPLETE, "operator": "Exists"})
    return [{"matchExpressions": exprs}]


GPU_TOLERATION = {"key": labels.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def daemonset(
    name: str = "device-plugin-h100",
    *,
    role: str = "device-plugin",
    group: str | None = "h100",
    terms: list[dict[str, Any]] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    **pod: Any,
) -> dict[str, Any]:
    meta_labels = {"app.kubernetes.io/name": role, "app.kubernetes.io/component": role}
    if group is not None:
        meta_labels[labels.NODE_GROUP] = group
    spec: dict[str, Any] = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms if terms is not None else gpu_terms(group or "h100")}}},
        "tolerations": tolerations if tolerations is not None else [dict(GPU_TOLERATION)],
        "containers": containers if containers is not None else [container(role)],
        **pod,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "nvidia-gpu", "labels": meta_labels},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": role}},
                 "template": {"metadata": {"labels": dict(meta_labels)}, "spec": spec}},
    }


def config_map(data: Mapping[str, Any], name: str = "cfg", labels_: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "nvidia-gpu", "labels": dict(labels_ or {})},
        "data": {k: v if isinstance(v, str) else yaml.safe_dump(v) for k, v in data.items()},
    }


def mig_doc(configs: Mapping[str, Any]) -> dict[str, Any]:
    return {"version": "v1", "mig-configs": copy.deepcopy(dict(configs))}


def mig_entry(devices: Mapping[str, int], **extra: Any) -> dict[str, Any]:
    return {"devices": "all", "mig-enabled": True, "mig-devices": dict(devices), **extra}


def node_group_patch(name: str, node_labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": name},
            "spec": {"nodeTemplate": {"labels": dict(node_labels)}}}


def namespace(name: str = "nvidia-gpu", labels_: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels_ or {})}}


def cluster_role(rules: list[dict[str, Any]], name: str = "reader") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
            "rules": rules}


def device_class(*expressions: str, name: str = "gpu.nvidia.com", api: str = "resource.k8s.io/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}
