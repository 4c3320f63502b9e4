"""The components as a multi-language Pulumi package, used by a Pulumi YAML program with the real engine.

``provider/PulumiPlugin.yaml`` makes the repository a source-based component package; the YAML program
names it under ``packages:`` (what ``pulumi package add`` writes), the engine starts the package through
the Python language host, Pulumi's component provider host serves ``nvidia_gpu.package`` and infers its
schema, and the YAML language host (tools/pulumi-yaml) builds the resources from it. The program
previews, deploys to the local control plane (the DaemonSets roll out on a kwok node) and is destroyed.

TypeScript and Go programs, through the SDKs ``pulumi package gen-sdk`` generates, are
``test_component_sdks.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane
from localcluster.objects import create_kwok_node, wait_for
from nvidia_gpu.components import registry
from nvidia_gpu.components.register import PROVIDER_VERSION
from tests.cluster.pulumi_project import REPO, SETUP, Project, make_project
from tests.kit.tools import required_bin

NAMESPACE = "yaml-gpu"
POOL = "example.com/gpu-pool"

CLUSTER = {
    "kubernetesVersion": "1.34",
    "namespace": NAMESPACE,
    "nodeSetup": "daemonset",
    "agentImage": {"repository": "registry.example.com/platform/nvidia-gpu-agent", "tag": "0.1.0"},
    "runtimeClass": {"create": False},
}
GROUP: dict[str, Any] = {
    "name": "l4-shared",
    "nodeSelector": {"matchLabels": {POOL: "yaml"}},
    "gpu": {"model": "L4", "sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4}},
}


def _program(group: dict[str, Any]) -> dict[str, Any]:
    """A Pulumi YAML program that uses the package: a provider, the platform and one node group."""
    in_cluster = {"providers": ["${k8s}"]}
    return {
        "name": "gpu-yaml",
        "runtime": "yaml",
        "packages": {"nvidia-gpu": str(REPO / "provider")},
        "variables": {"cluster": CLUSTER},
        "resources": {
            "k8s": {"type": "pulumi:providers:kubernetes",
                    "properties": {"enableServerSideApply": True, "enableConfigMapMutable": True}},
            "gpu": {"type": "nvidia-gpu:index:GpuPlatform",
                    "properties": {"cluster": "${cluster}", "extraLabels": {"team": "yaml"}},
                    "options": in_cluster},
            "l4": {"type": "nvidia-gpu:index:GpuNodeGroup",
                   "properties": {"cluster": "${cluster}", "group": group, "extraLabels": {"team": "yaml"}},
                   "options": {**in_cluster, "dependsOn": ["${gpu}"]}},
        },
        "outputs": {"namespace": "${gpu.namespace}", "nodeLabels": "${l4.nodeLabels}"},
    }


def _yaml_project(cluster: ControlPlane, work: Path, group: dict[str, Any]) -> Project:
    bin_dir = required_bin("pulumi-language-yaml", "pulumi-resource-kubernetes")
    project = make_project(cluster, work)
    # `pulumi package get-schema`/`add` install the package's own plugins (the kubernetes provider its
    # environment declares) instead of taking them from PATH; offline, from the pinned build.
    project.pulumi("plugin", "install", "resource", "kubernetes", PROVIDER_VERSION, "--file",
                   str((bin_dir / "pulumi-resource-kubernetes").resolve()))
    for name in ("__main__.py", f"Pulumi.{project.stack}.yaml"):
        (project.directory / name).unlink()
    # Through JSON: fresh objects everywhere, so the dump has no YAML aliases (Pulumi YAML refuses them).
    program = json.loads(json.dumps(_program(group)))
    (project.directory / "Pulumi.yaml").write_text(yaml.safe_dump(program, sort_keys=False))
    project.env.pop("PYTHONPATH", None)  # the package runs in the repository's venv, as PulumiPlugin.yaml says
    project.pulumi("stack", "init", project.stack)
    return project


def test_the_package_schema_is_inferred_from_the_components(cluster: ControlPlane, tmp_path: Path) -> None:
    project = _yaml_project(cluster, tmp_path / "schema", GROUP)
    schema = json.loads(project.pulumi("package", "get-schema", str(REPO / "provider")).stdout)
    assert schema["name"] == "nvidia-gpu"
    resources = schema["resources"]
    assert sorted(resources) == sorted(c.token for c in registry.COMPONENTS)  # every component, SharingPolicy too
    group = resources["nvidia-gpu:index:GpuNodeGroup"]
    assert group["isComponent"] is True
    assert sorted(group["requiredInputs"]) == ["cluster", "group"]
    assert {"namespace", "agentImage", "extraLabels"} <= set(group["inputProperties"])
    assert "nvidia-gpu:nodeGroups" in group["inputProperties"]["group"]["description"]
    assert set(group["properties"]) == {"nodeLabels", "nodeTaints"}
    assert set(resources["nvidia-gpu:index:GpuPlatform"]["properties"]) == {"namespace", "serviceAccounts"}


def test_a_bad_group_fails_the_preview_naming_the_component_and_field(cluster: ControlPlane, tmp_path: Path) -> None:
    bad = {**GROUP, "gpu": {**GROUP["gpu"], "timeSlicing": {"partitionCount": 1}}}
    project = _yaml_project(cluster, tmp_path / "bad", bad)
    done = project.pulumi("preview", check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "group.gpu.timeSlicing.partitionCount" in out and "greater than or equal to 2" in out, out[-3000:]
    assert "Traceback" not in out and "package.py" not in out, out[-3000:]
    assert cluster.admin().get_or_none("v1", "Namespace", NAMESPACE) is None


@pytest.mark.timeout(600)
def test_a_yaml_program_previews_deploys_and_destroys(cluster: ControlPlane, tmp_path: Path) -> None:
    kube = cluster.admin()
    create_kwok_node(kube, "yaml-l4", {POOL: "yaml", SETUP: ""})
    project = _yaml_project(cluster, tmp_path / "yaml", GROUP)

    preview = json.loads(project.pulumi("preview", "--json").stdout)
    types = {s["urn"].split("::")[-2] for s in preview["steps"]}
    assert {"nvidia-gpu:index:GpuPlatform", "nvidia-gpu:index:GpuNodeGroup"} <= {t.split("$")[-1] for t in types}

    project.pulumi("up", "--yes", "--skip-preview")
    outputs = json.loads(project.pulumi("stack", "output", "--json").stdout)
    assert outputs["namespace"] == NAMESPACE
    assert outputs["nodeLabels"]["node.deckhouse.io/device-gpu.config"] == "TimeSlicing"
    assert outputs["nodeLabels"]["gpu.nvidia-gpu.io/node-group"] == "l4-shared"
    daemonsets = {d["metadata"]["name"]: d for d in kube.list("apps/v1", "DaemonSet", NAMESPACE)}
    assert len(daemonsets) == 3, sorted(daemonsets)  # node setup, the labeller, the device plugin
    for name, ds in daemonsets.items():
        assert ds["metadata"]["labels"]["team"] == "yaml", name
        assert ds["status"].get("numberReady", 0) >= 1, (name, ds["status"])  # the provider awaited the rollout
    # The components' children sit under the package's components, as in a Python program.
    state = json.loads(project.pulumi("stack", "export").stdout)["deployment"]["resources"]
    parents = {r["urn"].split("::")[-1]: r.get("parent", "") for r in state}
    assert parents["l4-labeller"].endswith("nvidia-gpu:index:GpuNodeGroup::l4"), parents
    project.pulumi("up", "--yes", "--expect-no-changes")

    project.pulumi("destroy", "--yes")
    wait_for(lambda: kube.get_or_none("v1", "Namespace", NAMESPACE) is None, timeout=60, what="the namespace gone")
    assert kube.list("apps/v1", "DaemonSet", NAMESPACE) == []
