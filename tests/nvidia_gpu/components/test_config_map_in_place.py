"""Fixed-name ConfigMaps that agents read are updated in place whatever provider the user hands the component
(``register_config_map``): the ConfigMap resource holds no content, its ``<name>-data`` ConfigMapPatch holds it.

The real provider's behaviour (no replace with a provider lacking ``enableConfigMapMutable``, the upgrade of
a stack deployed before the split) is tested in ``tests/cluster/test_configmap_in_place.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvgpu.stackconfig import load_stack_file
from nvidia_gpu.components.manifests.dra import UNINSTALL_MARKER
from nvidia_gpu.components.program import build_stack
from nvidia_gpu.components.register import PATCH_FORCE_ANNOTATION, config_map_parts
from nvidia_gpu.preview.model import RecordedResource
from nvidia_gpu.preview.render import render_manifests
from tests.nvidia_gpu.components.component_helpers import ROOT_STACKS, Engine, engine, of_kind  # noqa: F401

MANIFEST: dict[str, Any] = {
    "apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "device-plugin-config-a", "namespace": "ns", "labels": {"team": "ml"}},
    "data": {"TimeSlicing": "version: v1\n"},
}


def test_the_split_gives_the_content_and_only_it_to_the_forced_patch() -> None:
    obj, patch = config_map_parts(MANIFEST)
    assert obj == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": MANIFEST["metadata"]}
    # No labels on the patch: every field it names is one it owns, so the labels stay the ConfigMap's.
    assert patch == {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "device-plugin-config-a", "namespace": "ns",
                                  "annotations": {PATCH_FORCE_ANNOTATION: "true"}},
                     "data": MANIFEST["data"]}
    assert "data" in MANIFEST  # the caller's manifest is left as it was


def _stack(engine: Engine, path: Path) -> tuple[RecordedResource, ...]:  # noqa: F811
    cfg = load_stack_file(path)
    return engine.run(lambda: build_stack(cfg))


def _pairs(resources: tuple[RecordedResource, ...]) -> dict[str, tuple[RecordedResource, RecordedResource | None]]:
    patches = {r.inputs["metadata"]["name"]: r for r in of_kind(resources, "ConfigMap") if r.is_patch}
    return {r.inputs["metadata"]["name"]: (r, patches.get(r.inputs["metadata"]["name"]))
            for r in of_kind(resources, "ConfigMap") if not r.is_patch}


@pytest.mark.parametrize("stack", ROOT_STACKS, ids=lambda p: p.name)
def test_every_config_map_an_agent_reads_is_split(engine: Engine, stack: Path) -> None:  # noqa: F811
    resources = _stack(engine, stack)
    pairs = _pairs(resources)
    assert any(n.startswith("device-plugin-config-") for n in pairs), sorted(pairs)
    for name, (whole, patch) in pairs.items():
        if name == UNINSTALL_MARKER:
            # Read by the DRA plugins for its existence and finalizers only; its content never changes
            # but with the driver's name, when deleting it (the plugins withdraw the old driver's
            # slices) is what should happen.
            assert patch is None and "data" in whole.inputs
            continue
        assert patch is not None, f"ConfigMap {name} has no data patch"
        assert not {"data", "binaryData"} & set(whole.inputs), name
        assert whole.ignore_changes == ("data", "binaryData"), name  # a stack deployed before the split
        assert whole.delete_before_replace and not whole.retain_on_delete
        assert patch.type_token == "kubernetes:core/v1:ConfigMapPatch" and patch.name == f"{whole.name}-data"
        assert patch.parent_urn == whole.parent_urn and whole.urn in patch.dependencies
        assert patch.retain_on_delete and not patch.ignore_changes  # never relinquished: see register_config_map
        assert set(patch.inputs["metadata"]) == {"name", "namespace", "annotations"}
        assert patch.inputs["metadata"]["namespace"] == whole.inputs["metadata"]["namespace"]
        assert patch.inputs["metadata"]["annotations"] == {PATCH_FORCE_ANNOTATION: "true"}
        assert patch.inputs["data"], name


@pytest.mark.parametrize("stack", ROOT_STACKS, ids=lambda p: p.name)
def test_a_workload_that_mounts_a_config_map_waits_for_its_content(engine: Engine, stack: Path) -> None:  # noqa: F811
    resources = _stack(engine, stack)
    pairs = _pairs(resources)
    checked = 0
    for workload in [*of_kind(resources, "DaemonSet"), *of_kind(resources, "Deployment")]:
        pod = workload.inputs["spec"]["template"]["spec"]
        mounted = {v["configMap"]["name"] for v in pod.get("volumes") or [] if "configMap" in v}
        for name in mounted & set(pairs):
            patch = pairs[name][1]
            assert patch is not None and patch.urn in workload.dependencies, (workload.name, name)
            checked += 1
    assert checked, "no workload mounts a ConfigMap"


@pytest.mark.parametrize("stack", ROOT_STACKS, ids=lambda p: p.name)
def test_the_preview_shows_one_object_per_config_map_with_its_content(engine: Engine, stack: Path) -> None:  # noqa: F811
    resources = _stack(engine, stack)
    pairs = _pairs(resources)
    files = [m for m in render_manifests(resources) if m.kind == "ConfigMap"]
    assert sorted(m.name for m in files) == sorted(pairs)
    for m in files:
        whole, patch = pairs[m.name]
        assert not m.patch and m.resource is whole
        if patch is not None:
            assert m.object["data"] == patch.inputs["data"]
            assert m.object["metadata"]["labels"] == whole.inputs["metadata"]["labels"]
            assert m.object["metadata"]["annotations"] == {PATCH_FORCE_ANNOTATION: "true"}
