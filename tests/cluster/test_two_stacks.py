"""Two stacks on one cluster with the real Pulumi CLI and provider: both up, destroyed in either order.

The shared definitions (the GPU CRD, the ``nvidia`` RuntimeClass, the DRA DeviceClasses) are applied by
both stacks alike and co-owned; each stack's Namespace owns them, Pulumi retains them on destroy, and the
garbage collector deletes them with the last owning namespace (see
``nvidia_gpu.components.manifests.shared``). A third stack that would collide (another stack's namespace,
another stack's NodeGroup, DeviceClasses of another DRA driver) is stopped by the program's preflight
in ``pulumi preview``, before anything is applied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane, Kube
from localcluster.objects import wait_for
from tests.cluster.pulumi_project import Project, make_project, settled, snapshot

SHARED = [("apiextensions.k8s.io/v1", "CustomResourceDefinition", "gpus.gpu.nvidia-gpu.io"),
          ("node.k8s.io/v1", "RuntimeClass", "nvidia"),
          ("resource.k8s.io/v1", "DeviceClass", "gpu.nvidia.com"),
          ("resource.k8s.io/v1", "DeviceClass", "mig.nvidia.com"),
          ("resource.k8s.io/v1", "DeviceClass", "vfio.gpu.nvidia.com")]


def _stack(cluster: ControlPlane, work: Path, name: str, namespace: str, groups: list[dict[str, Any]],
           **dra: Any) -> Project:
    """Stack ``name`` of the project (the dev stack's config with its own namespace and node groups, and
    monitoring off: fewer objects), in a directory and state backend of its own."""
    project = make_project(cluster, work, "dev")
    config = yaml.safe_load(project.config_file().read_text())
    project.config_file().unlink()
    project.stack = name
    settings = config["config"]["nvidia-gpu:cluster"]
    settings.update(namespace=namespace, monitoring={"enabled": False})
    settings["dra"] = {"driverName": "gpu.nvidia.com", **dra}
    config["config"]["nvidia-gpu:nodeGroups"] = groups
    project.config_file().write_text(yaml.safe_dump(config, sort_keys=False))
    project.pulumi("stack", "init", name)
    return project


def _group(name: str, node_group: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "nodeGroup": node_group, "gpu": {"model": "L4", "sharing": "Exclusive"}, **extra}


def _owners(kube: Kube) -> dict[str, list[str]]:
    out = {}
    for api, kind, name in SHARED:
        live = kube.get_or_none(api, kind, name)
        out[name] = sorted(r["name"] for r in (live or {}).get("metadata", {}).get("ownerReferences") or [])
    return out


def _gone(kube: Kube, namespace: str) -> None:
    wait_for(lambda: kube.get_or_none("v1", "Namespace", namespace) is None, timeout=90,
             what=f"namespace {namespace} gone")


@pytest.fixture(scope="module")
def stacks(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, Project]:
    a = _stack(cluster, tmp_path_factory.mktemp("stack-a"), "a", "gpu-a",
               [_group("l4", "gpu-l4"), _group("h200", "gpu-h200", allocationMode="dra")])
    b = _stack(cluster, tmp_path_factory.mktemp("stack-b"), "b", "gpu-b",
               [_group("a30", "gpu-a30"), _group("h100", "gpu-h100", allocationMode="dra")])
    return a, b


@pytest.mark.timeout(900)
def test_two_stacks_share_the_cluster_wide_definitions_and_destroy_in_either_order(
        cluster: ControlPlane, stacks: tuple[Project, Project]) -> None:
    a, b = stacks
    kube = cluster.admin()
    before = snapshot(kube)
    for first, second, first_ns, second_ns in ((a, b, "gpu-a", "gpu-b"), (b, a, "gpu-b", "gpu-a")):
        first.pulumi("up", "--yes", "--skip-preview")
        # The second stack's preview runs the preflight against the first stack's objects: no collision.
        done = second.pulumi("preview")
        assert "error" not in done.stdout.lower(), done.stdout[-4000:]
        second.pulumi("up", "--yes", "--skip-preview")
        assert _owners(kube) == dict.fromkeys((n for _, _, n in SHARED), sorted([first_ns, second_ns]))
        first.pulumi("destroy", "--yes")
        _gone(kube, first_ns)
        # The garbage collector drops the destroyed stack's owner reference; the definitions stay for the other.
        alone = {n: [second_ns] for _, _, n in SHARED}
        wait_for(lambda: _owners(kube) == alone, timeout=60,  # noqa: B023
                 what="the shared definitions owned by the remaining stack alone")
        assert [d["metadata"]["name"] for d in kube.list("apps/v1", "DaemonSet", second_ns)], "the other stack runs"
        # The provider saw the collector's change to the shared objects' ownerReferences (a field the stack
        # sets): the next up re-applies their metadata, and then nothing changes.
        diff = second.pulumi("preview", "--diff").stdout
        assert "ownerReferences" in diff, diff[-4000:]
        second.pulumi("up", "--yes", "--skip-preview")
        second.pulumi("up", "--yes", "--expect-no-changes", "--skip-preview")
        second.pulumi("destroy", "--yes")
        _gone(kube, second_ns)
        after = settled(kube, before)
        assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                                 if before.get(k) != after.get(k)}


@pytest.mark.timeout(600)
def test_a_stack_that_would_collide_is_stopped_by_its_preview(
        cluster: ControlPlane, stacks: tuple[Project, Project], tmp_path_factory: pytest.TempPathFactory) -> None:
    """With stack a up: a stack on a's namespace is refused in one line; one on a's NodeGroup, with another
    DRA driver's DeviceClasses, gets one line per collision, and nothing is applied."""
    a, _ = stacks
    kube = cluster.admin()
    a.pulumi("up", "--yes", "--skip-preview")
    try:
        same_ns = _stack(cluster, tmp_path_factory.mktemp("stack-c"), "c", "gpu-a", [_group("a30", "gpu-a30")])
        done = same_ns.pulumi("preview", check=False)
        assert done.returncode != 0
        text = " ".join(done.stdout.split())
        assert ("Namespace/gpu-a: belongs to the Pulumi stack nvidia-gpu/a (annotation gpu.nvidia-gpu.io/stack); "
                "this stack (nvidia-gpu/c) needs its own nvidia-gpu:cluster.namespace") in text, done.stdout[-4000:]
        assert "Traceback" not in done.stdout + done.stderr
        other = _stack(cluster, tmp_path_factory.mktemp("stack-d"), "d", "gpu-d",
                       [_group("l4", "gpu-l4"), _group("h100", "gpu-h100", allocationMode="dra")],
                       driverName="gpu.example.com")
        before = snapshot(kube)
        done = other.pulumi("preview", check=False)
        text = " ".join(done.stdout.split())
        assert done.returncode != 0
        assert ("NodeGroup/gpu-l4: nodeGroups[l4]: already patched by the nvidia-gpu stack in namespace gpu-a "
                "(field manager nvidia-gpu.gpu-a)") in text, done.stdout[-4000:]
        for name in ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"):
            assert (f"DeviceClass/{name}: shared with the nvidia-gpu stack in namespace gpu-a, which defines "
                    ".spec.selectors otherwise") in text, done.stdout[-4000:]
        assert snapshot(kube) == before
    finally:
        a.pulumi("destroy", "--yes")
        _gone(kube, "gpu-a")
