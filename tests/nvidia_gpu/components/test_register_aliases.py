"""Registrations keep the aliases pulumi_kubernetes' typed classes declare, so moving a kind to another API
version (DeviceClass v1beta2 -> v1) is an update of the same resource, not a delete-then-create."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

from nvidia_gpu.components.register import aliases


def _typed_aliases(module: str, kind: str) -> set[str]:
    cls = getattr(importlib.import_module(f"pulumi_kubernetes.{module}"), kind)
    return set(re.findall(r'pulumi\.Alias\(type_="([^"]+)"\)', inspect.getsource(cls._internal_init)))


@pytest.mark.parametrize(("api_version", "kind", "module"), [
    ("resource.k8s.io/v1", "DeviceClass", "resource.v1"),
    ("resource.k8s.io/v1", "ResourceClaimTemplate", "resource.v1"),
    ("node.k8s.io/v1", "RuntimeClass", "node.v1"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "admissionregistration.v1"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "rbac.v1"),
])
def test_the_typed_classes_aliases_are_kept(api_version: str, kind: str, module: str) -> None:
    assert set(aliases(api_version, kind)) == _typed_aliases(module, kind)


def test_kinds_without_typed_classes_have_none() -> None:
    assert aliases("deckhouse.io/v1", "NodeGroup", patch=True) == ()
    assert aliases("v1", "Namespace") == ()

