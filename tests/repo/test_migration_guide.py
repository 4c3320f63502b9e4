"""docs/migration.md against the code it describes: its stack files validate, its preview outputs are the
migration preflight's output for the cluster it describes, its commands are the ones the preflight's
messages give, and following them makes the preflight clean (the chart's affinity keeps the plugin off
exactly the nodes handed over). ``tests/cluster/test_preflight_migration.py`` runs the operator handover
against a real API server."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvgpu.stackconfig import StackConfig, load_stack_text
from nvidia_gpu.preflight import migration
from nvidia_gpu.preflight.model import Severity
from tests.kit.fake_reader import FakeReader

GUIDE = Path(__file__).resolve().parents[2] / migration.GUIDE
MARKER = re.compile(r"^\s*<!--\s*migration-test:\s*([a-z0-9-]+)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```([a-z]*)\s*$")
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
#: NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/values.yaml: the chart's default affinity.
CHART_DEFAULT_TERMS = [
    [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}],
    [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]}],
    [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
]


def guide_blocks() -> dict[str, str]:
    """name -> text of every fenced block with a ``<!-- migration-test: NAME -->`` line before it."""
    lines = GUIDE.read_text(encoding="utf-8").splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        fence = FENCE.match(line)
        marker = MARKER.match(lines[i - 1]) if i and fence else None
        if fence is None or marker is None:
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        assert marker.group(1) not in out, f"{marker.group(1)} named twice"
        out[marker.group(1)] = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
    return out


BLOCKS = guide_blocks()


def stack(name: str) -> StackConfig:
    return load_stack_text(BLOCKS[name], f"{GUIDE.name}:{name}")


def commands(name: str) -> list[str]:
    return [line for line in BLOCKS[name].splitlines() if line.strip()]


def preview_lines(name: str) -> list[str]:
    return [line for line in BLOCKS[name].splitlines() if line.strip()]


def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {}}


def daemonset(name: str, namespace: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}, **meta},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def operand(operand: str, name: str, **meta: Any) -> dict[str, Any]:
    return daemonset(name, "gpu-operator", {"nodeSelector": {migration.DEPLOY_PREFIX + operand: "true"},
                                            "tolerations": TOLERATE_GPU,
                                            "containers": [{"name": name, "image": f"nvcr.io/nvidia/{name}:1"}]},
                     **meta)


def operator_cluster(**node_labels: str) -> FakeReader:
    """The guide's GPU Operator cluster: the ClusterPolicy in NVIDIADriver mode (the guide's first step),
    three A100 nodes and the operands of a default install (the group's driver DaemonSet is the stack's)."""
    labels = {"pool": "a100", "nvidia.com/mig.capable": "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
              **node_labels}
    driver = operand("driver", "nvidia-gpu-driver-ubuntu22.04-7c6d5b4f9",
                     ownerReferences=[{"kind": "NVIDIADriver", "name": "nvidia-gpu-driver-a100"}])
    return FakeReader().add(
        {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
         "spec": {"driver": {"useNvidiaDriverCRD": True}}},
        *(node(f"a100-{i}", labels) for i in range(3)),
        operand("device-plugin", "nvidia-device-plugin-daemonset"), operand("gpu-feature-discovery",
                                                                             "gpu-feature-discovery"),
        operand("mig-manager", "nvidia-mig-manager"), operand("operator-validator", "nvidia-operator-validator"),
        operand("dcgm", "nvidia-dcgm"), operand("dcgm-exporter", "nvidia-dcgm-exporter"),
        operand("container-toolkit", "nvidia-container-toolkit-daemonset"), driver)


def chart_cluster(affinity_terms: list[list[dict[str, Any]]], **node_labels: str) -> FakeReader:
    plugin = daemonset("nvdp-nvidia-device-plugin", "nvidia-device-plugin", {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in affinity_terms]}}},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, *TOLERATE_GPU],
        "containers": [{"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                        "command": ["nvidia-device-plugin"]}]},
        annotations={migration.HELM_RELEASE: "nvdp", migration.HELM_NAMESPACE: "nvidia-device-plugin"})
    labels = {"pool": "l4", "feature.node.kubernetes.io/pci-10de.present": "true", **node_labels}
    return FakeReader().add(*(node(f"l4-{i}", labels) for i in range(2)), plugin)


def chart_stack() -> StackConfig:
    """The stack the chart section talks about: the operator example's cluster with a group on pool=l4."""
    text = BLOCKS["operator-stack"].split("  nvidia-gpu:nodeGroups:")[0]
    return load_stack_text(text + "  nvidia-gpu:nodeGroups:\n    - name: l4\n      nodeSelector:\n"
                                  "        matchLabels:\n          pool: l4\n", "chart example")


def deckhouse_cluster(**spec: Any) -> FakeReader:
    return FakeReader().add(
        {"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": "gpu-a30"},
         "spec": {"nodeType": "Static", **spec}},
        {"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": "gpu"},
         "spec": {"enabled": True, "version": 1, "settings": {}}})


def test_the_guides_stack_files_validate() -> None:
    assert [g.name for g in stack("operator-stack").node_groups] == ["a100"]
    assert [g.node_group for g in stack("deckhouse-stack").node_groups] == ["gpu-a30"]


def test_the_operator_preview_is_the_preflights_output() -> None:
    found = migration.findings(stack("operator-stack"), operator_cluster())
    assert preview_lines("operator-preview") == [f.line() for f in found if f.severity is Severity.ERROR]
    # The guide says the dcgm-exporter and the toolkit follow as warnings, the toolkit's asking for two settings.
    warnings = [f for f in found if f.severity is Severity.WARNING]
    assert [f.subject for f in warnings] == [
        "DaemonSet/gpu-operator/nvidia-dcgm-exporter", "DaemonSet/gpu-operator/nvidia-container-toolkit-daemonset"]
    settings = (f"{migration.TOOLKIT_ENVVAR_ENV}=false", f"{migration.TOOLKIT_VOLUME_MOUNTS_ENV}=true")
    assert all(s in warnings[1].message and f"`{s}`" in GUIDE.read_text() for s in settings)


def _error_keys(config: StackConfig, reader: FakeReader) -> list[str]:
    """The deploy label of each operand the preview refuses, in the preview's order."""
    keys = []
    for f in migration.findings(config, reader):
        if f.severity is not Severity.ERROR:
            continue
        ds = next(o for o in reader.objects if o["kind"] == "DaemonSet"
                  and f.subject == f"DaemonSet/{o['metadata']['namespace']}/{o['metadata']['name']}")
        found = migration.classify(ds)
        assert found is not None
        keys.append(migration.deploy_label(found.role))
    return keys


def test_the_operator_handover_is_the_messages_commands_and_clears_the_preview() -> None:
    config = stack("operator-stack")
    group = config.node_groups[0]
    keys = _error_keys(config, operator_cluster())
    errors = [f for f in migration.findings(config, operator_cluster()) if f.severity is Severity.ERROR]
    assert commands("operator-handover") == [migration.label_command(group, k) for k in keys]
    assert all(c in f.message for c, f in zip(commands("operator-handover"), errors, strict=True))
    handed = migration.findings(config, operator_cluster(**dict.fromkeys(keys, "false")))
    assert [f for f in handed if f.severity is Severity.ERROR] == []
    [rollback] = commands("operator-rollback")
    assert rollback == f"kubectl label nodes -l '{migration.selector_text(group)}' " + " ".join(f"{k}-" for k in keys)
    # The Deckhouse variant of the handover, as the preview gives it for a group with nodeGroup.
    assert migration.node_template_command("<name>", keys[0]) in GUIDE.read_text()


def test_the_chart_preview_and_handover() -> None:
    config = chart_stack()
    found = migration.findings(config, chart_cluster(CHART_DEFAULT_TERMS))
    assert preview_lines("chart-preview") == [f.line() for f in found]
    helm, label = commands("chart-handover")
    assert helm == migration.helm_command("nvdp", "nvidia-device-plugin", "-f affinity.yaml",
                                          chart="nvdp/nvidia-device-plugin")
    assert migration.helm_command("nvdp", "nvidia-device-plugin", "-f affinity.yaml") in found[0].message
    key = migration.deploy_label(migration.Role.DEVICE_PLUGIN)
    assert label == migration.label_command(config.node_groups[0], key) and label in found[0].message


def test_the_guides_affinity_is_the_charts_with_the_handover_term_and_keeps_it_off_only_handed_over_nodes() -> None:
    values = yaml.safe_load(BLOCKS["chart-affinity"])
    terms = [t["matchExpressions"] for t in
             values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]
    handover: dict[str, Any] = {"key": migration.deploy_label(migration.Role.DEVICE_PLUGIN), "operator": "NotIn",
                                "values": ["false"]}
    assert terms == [[*t, handover] for t in CHART_DEFAULT_TERMS]
    config = chart_stack()
    assert len(migration.findings(config, chart_cluster(terms))) == 1  # the upgrade alone moves nothing
    assert migration.findings(config, chart_cluster(terms, **{handover["key"]: "false"})) == []


def test_the_deckhouse_preview_and_handover() -> None:
    config = stack("deckhouse-stack")
    found = migration.findings(config, deckhouse_cluster(gpu={"sharing": "TimeSlicing",
                                                              "timeSlicing": {"partitionCount": 4}}))
    assert preview_lines("deckhouse-preview") == [f.line() for f in found]
    assert commands("deckhouse-handover") == [migration.remove_gpu_command("gpu-a30")]
    [after] = migration.findings(config, deckhouse_cluster())
    assert after.severity is Severity.WARNING and migration.module_off_command() in after.message
    assert migration.module_off_command() in GUIDE.read_text()


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def test_the_sections_the_messages_cite_exist() -> None:
    source = Path(migration.__file__).read_text()
    cited = set(re.findall(r"\{GUIDE\}#([a-z0-9-]+)", source))
    headings = {_slug(m) for m in re.findall(r"^#+ (.+)$", GUIDE.read_text(), flags=re.MULTILINE)}
    assert cited and cited <= headings, cited - headings


DEPLOY_KEY = re.compile(r"nvidia\.com/gpu\.deploy\.([a-z]+(?:-[a-z]+)*)")


@pytest.mark.parametrize("key", sorted(set(DEPLOY_KEY.findall(GUIDE.read_text()))))
def test_every_deploy_label_the_guide_names_is_one_the_detection_knows(key: str) -> None:
    assert key in {r.value for r in migration.Role} | {"operands"}, key
