"""The labeller's node-group labels and taints: flag validation, the ownership rules, and Node patches over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node_agent.cli import build_parser
from node_agent.cli.context import AgentContext
from node_agent.kube.errors import Conflict
from node_agent.labeller import labels as labels_cmd
from node_agent.labeller import nodepatch
from node_agent.labeller.nodeconfig import NodeConfigError, NodeSnapshot, Requested, parse_label, parse_taint, plan
from nvgpu import labels
from nvgpu.driver import UPGRADE_TAINT_KEY
from nvgpu.taints import NodeTaint
from tests.kit.fakehost import build_fake_host
from tests.node_agent.agent_testkit import ApiServer, Cli

NODE = "gpu-node-1"
GPU_TAINT = "nvidia.com/gpu=present:NoSchedule"
FOREIGN_TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-11-30T04:00:00Z"}
GROUP_FLAGS = ["--node-label", "node.deckhouse.io/gpu=", "--node-label", "node.deckhouse.io/device-gpu.config=MIG",
               "--node-label", "nvidia.com/mig.config=all-1g.10gb", "--node-label", "gpu.nvidia-gpu.io/node-group=h100",
               "--node-taint", GPU_TAINT, "--node-taint", "dedicated=ml:NoExecute"]


def _node(server: ApiServer) -> Any:
    return server.core().read_node(NODE)


def _taints(server: ApiServer) -> list[dict[str, Any]]:
    """The taints as the API server stores them (raw JSON, not the client's re-serialized models)."""
    raw = json.loads(server.core().read_node(NODE, _preload_content=False).data)
    return list(raw.get("spec", {}).get("taints") or [])


def _set_taints(server: ApiServer, taints: list[dict[str, Any]]) -> None:
    server.core().patch_node(NODE, {"spec": {"taints": taints}}, _content_type="application/merge-patch+json")


def _label(cli: Cli, host_root: Path, server: ApiServer, *flags: str) -> tuple[int, Any]:
    return cli(host_root, "simulated:l4x2", "labels", "--patch-node", "--no-timestamp", *flags, node=NODE,
               kubeconfig=server.kubeconfig)


# --- flags ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "pair"), [
    ("node.deckhouse.io/gpu=", ("node.deckhouse.io/gpu", "")),
    ("nvidia.com/mig.config=custom-h100-0a1b2c3d", ("nvidia.com/mig.config", "custom-h100-0a1b2c3d")),
    ("team=ml", ("team", "ml")),
])
def test_good_labels(text: str, pair: tuple[str, str]) -> None:
    assert parse_label(text) == pair


@pytest.mark.parametrize(("text", "problem"), [
    ("node.deckhouse.io/gpu", "expected KEY=VALUE"),
    ("Bad_Prefix.io/x=1", "prefix 'Bad_Prefix.io' must be a DNS subdomain"),
    ("x/-dash=1", "name must be 1 to 63 characters"),
    ("team=has space", "value must be empty or at most 63 characters"),
    (f"team={'v' * 64}", "value must be empty or at most 63 characters"),
    ("node.deckhouse.io/gpu-setup-complete=", "set by node setup or the MIG manager"),
    ("nvidia.com/gpu.product=fake", "feature-discovery label"),
    ("nvidia.com/gpu.deploy.device-plugin=true", "set by node setup or the MIG manager"),
])
def test_bad_labels_name_the_flag_and_value(text: str, problem: str) -> None:
    with pytest.raises(NodeConfigError) as err:
        parse_label(text)
    assert str(err.value).startswith(f"--node-label {text!r}: ") and problem in str(err.value)


@pytest.mark.parametrize(("text", "taint"), [
    (GPU_TAINT, NodeTaint("nvidia.com/gpu", "present", "NoSchedule")),
    ("dedicated:PreferNoSchedule", NodeTaint("dedicated", "", "PreferNoSchedule")),
])
def test_good_taints_round_trip(text: str, taint: NodeTaint) -> None:
    assert parse_taint(text) == taint
    assert taint.flag() == text


@pytest.mark.parametrize(("text", "problem"), [
    ("nvidia.com/gpu=present", "expected KEY=VALUE:EFFECT or KEY:EFFECT"),
    ("nvidia.com/gpu=present:NoScheduleX",
     "effect 'NoScheduleX' is not one of NoSchedule, PreferNoSchedule, NoExecute"),
    ("=present:NoSchedule", "name must be 1 to 63 characters"),
    ("gpu=bad value:NoSchedule", "value must be empty"),
    ("mig-reconfigure=true:NoSchedule", "set and cleared by the MIG manager"),
])
def test_bad_taints_name_the_flag_and_value(text: str, problem: str) -> None:
    with pytest.raises(NodeConfigError) as err:
        parse_taint(text)
    assert str(err.value).startswith(f"--node-taint {text!r}: ") and problem in str(err.value)


def test_another_writers_keys_are_refused() -> None:
    """Keys node_agent.kube.nodeowner gives another writer: the labeller would fight it over them."""
    with pytest.raises(NodeConfigError, match="is set by node setup, not the labeller"):
        parse_label(f"{labels.NODE_CHECK}=ok")
    with pytest.raises(NodeConfigError, match="set and cleared by the driver upgrade controller"):
        parse_taint(f"{UPGRADE_TAINT_KEY}=true:NoSchedule")


def test_repeated_keys_are_refused() -> None:
    with pytest.raises(NodeConfigError, match="--node-label: key team given more than once"):
        Requested.from_flags(["team=a", "team=b"], [])
    with pytest.raises(NodeConfigError, match="--node-taint: gpu:NoSchedule given more than once"):
        Requested.from_flags([], ["gpu=a:NoSchedule", "gpu=b:NoSchedule"])
    assert len(Requested.from_flags([], ["gpu=a:NoSchedule", "gpu=a:NoExecute"]).taints) == 2


def test_cli_reports_bad_flags_with_exit_2(tmp_path: Path, cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    host = build_fake_host(tmp_path, "t4x1")
    assert cli(host.root, "simulated:t4x1", "labels", "--patch-node", "--node-taint", "gpu:Never", node=NODE)[0] == 2
    assert "--node-taint 'gpu:Never': effect 'Never'" in capsys.readouterr().err
    assert cli(host.root, "simulated:t4x1", "labels", "--node-label", "team=ml")[0] == 2
    assert "--node-label needs --patch-node" in capsys.readouterr().err


# --- the plan --------------------------------------------------------------------------------------------


def test_plan_keeps_foreign_taints_verbatim_and_updates_ours_in_place() -> None:
    node = NodeSnapshot(labels={}, annotations={labels.OWNED_NODE_TAINTS: "dedicated:NoExecute"},
                        taints=({"key": "dedicated", "value": "old", "effect": "NoExecute"}, FOREIGN_TAINT))
    p = plan(node, Requested({}, (NodeTaint("dedicated", "ml", "NoExecute"), NodeTaint("nvidia.com/gpu", "present",
                                                                                         "NoSchedule"))))
    assert p.taints == ({"key": "dedicated", "value": "ml", "effect": "NoExecute"}, FOREIGN_TAINT,
                        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    assert p.annotations == {labels.OWNED_NODE_TAINTS: "dedicated:NoExecute,nvidia.com/gpu:NoSchedule"}


def test_plan_never_claims_what_others_set_and_is_idempotent() -> None:
    preset = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    node = NodeSnapshot(labels={"node.deckhouse.io/gpu": ""}, annotations={}, taints=(preset,))
    want = Requested({"node.deckhouse.io/gpu": "", "team": "ml"}, (NodeTaint("nvidia.com/gpu", "present",
                                                                              "NoSchedule"),))
    p = plan(node, want)
    assert (p.labels, p.taints) == ({"team": "ml"}, None)
    assert p.annotations == {labels.OWNED_NODE_LABELS: "team"}  # the preset label and taint stay the owner's
    after = NodeSnapshot(labels={"node.deckhouse.io/gpu": "", "team": "ml"},
                         annotations={labels.OWNED_NODE_LABELS: "team"}, taints=(preset,))
    assert plan(after, want).empty
    dropped = plan(after, Requested())
    assert (dropped.labels, dropped.taints) == ({"team": None}, None)
    assert dropped.annotations == {labels.OWNED_NODE_LABELS: None}


# --- the Node over HTTP (kmock) -------------------------------------------------------------------------


def test_group_labels_and_taints_reach_the_node(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    api_server.set_labels(NODE, {"team": "ml", "node.deckhouse.io/gpu": ""})
    _set_taints(api_server, [FOREIGN_TAINT])
    code, doc = _label(cli, host.root, api_server, *GROUP_FLAGS)
    assert code == 0, doc
    got = api_server.labels(NODE)
    assert {k: got[k] for k in ("node.deckhouse.io/device-gpu.config", "nvidia.com/mig.config",
                                 "gpu.nvidia-gpu.io/node-group", "team", "node.deckhouse.io/gpu")} == {
        "node.deckhouse.io/device-gpu.config": "MIG", "nvidia.com/mig.config": "all-1g.10gb",
        "gpu.nvidia-gpu.io/node-group": "h100", "team": "ml", "node.deckhouse.io/gpu": ""}
    assert got["nvidia.com/gpu.product"] == "NVIDIA-L4"  # GFD labels travel in the same patch
    assert _taints(api_server) == [FOREIGN_TAINT, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                                   {"key": "dedicated", "value": "ml", "effect": "NoExecute"}]
    annotations = _node(api_server).metadata.annotations
    assert annotations[labels.OWNED_NODE_LABELS] == ("gpu.nvidia-gpu.io/node-group,node.deckhouse.io/device-gpu.config,"
                                                     "nvidia.com/mig.config")
    assert annotations[labels.OWNED_NODE_TAINTS] == "dedicated:NoExecute,nvidia.com/gpu:NoSchedule"
    code, doc = _label(cli, host.root, api_server, *GROUP_FLAGS)
    assert (code, doc["nodeChanges"], doc["nodeTaints"]) == (0, {}, None)


def test_labels_and_taints_no_longer_requested_are_removed_if_ours(tmp_path: Path, cli: Cli,
                                                                    api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    api_server.set_labels(NODE, {"node.deckhouse.io/gpu": ""})  # node provisioning's, not the labeller's
    assert _label(cli, host.root, api_server, *GROUP_FLAGS)[0] == 0
    _set_taints(api_server, [*_taints(api_server), {"key": "mig-reconfigure", "value": "true", "effect": "NoSchedule"}])
    code, doc = _label(cli, host.root, api_server, "--node-label", "node.deckhouse.io/device-gpu.config=Exclusive",
                       "--node-label", "nvidia.com/mig.config=all-disabled")
    assert code == 0, doc
    got = api_server.labels(NODE)
    assert (got["node.deckhouse.io/device-gpu.config"], got["nvidia.com/mig.config"]) == ("Exclusive", "all-disabled")
    assert "gpu.nvidia-gpu.io/node-group" not in got
    assert got["node.deckhouse.io/gpu"] == ""  # never ours, so never removed
    assert _taints(api_server) == [{"key": "mig-reconfigure", "value": "true", "effect": "NoSchedule"}]
    assert labels.OWNED_NODE_TAINTS not in (_node(api_server).metadata.annotations or {})
    code, doc = _label(cli, host.root, api_server)  # nothing requested: every owned label goes
    got = api_server.labels(NODE)
    assert "nvidia.com/mig.config" not in got and got["node.deckhouse.io/gpu"] == ""
    assert labels.OWNED_NODE_LABELS not in (_node(api_server).metadata.annotations or {})


def test_nvml_failure_still_applies_the_group_config(tmp_path: Path, cli: Cli, api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    assert host.machine is not None
    host.machine.fail_init()
    code, doc = _label(cli, host.root, api_server, "--node-taint", GPU_TAINT)
    assert code == 1 and "NVML" in doc["error"]
    assert _taints(api_server) == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


class _ConflictOnce:
    """``nodepatch`` stand-ins whose first patch meets a Node that changed underneath (HTTP 409)."""

    def __init__(self) -> None:
        self.versions = iter(["7", "8"])
        self.patched: list[tuple[Any, str]] = []

    def snapshot(self, api: Any, node: str) -> NodeSnapshot:
        taints = () if not self.patched else ({"key": "mig-reconfigure", "value": "true", "effect": "NoSchedule"},)
        return NodeSnapshot({}, {}, taints, next(self.versions))

    def apply_plan(self, api: Any, node: str, plan: Any, resource_version: str = "") -> None:
        self.patched.append((plan, resource_version))
        if len(self.patched) == 1:
            raise Conflict("patch node: 409 Conflict")


def test_a_conflict_rereads_the_node_and_keeps_the_new_taint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = _ConflictOnce()
    monkeypatch.setattr(AgentContext, "node_api", lambda self: object())
    monkeypatch.setattr(labels_cmd, "snapshot", api.snapshot)
    monkeypatch.setattr(labels_cmd, "apply_plan", api.apply_plan)
    host = build_fake_host(tmp_path, None)
    ctx = AgentContext.from_args(_labels_args(host.root))
    changes, taints = labels_cmd.patch_node(ctx, Requested({}, (parse_taint(GPU_TAINT),)), None)
    assert changes == {}  # no label changes: only the taint list and the ownership annotation
    assert [rv for _, rv in api.patched] == ["7", "8"]
    assert taints == ({"key": "mig-reconfigure", "value": "true", "effect": "NoSchedule"},
                      {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})


def _labels_args(root: Path) -> Any:
    return build_parser("labels").parse_args(["--host-root", str(root), "--host-exec", "direct", "--nvml",
                                               "simulated:t4x1", "--node-name", NODE, "labels", "--patch-node"])


def test_patch_body_guards_the_taint_list_with_the_resource_version() -> None:
    want = Requested({"team": "ml"}, (parse_taint(GPU_TAINT),))
    p = plan(NodeSnapshot({}, {}, (), "42"), want)
    assert nodepatch.patch_body(p, "42") == {
        "metadata": {"labels": {"team": "ml"}, "resourceVersion": "42",
                     "annotations": {labels.OWNED_NODE_LABELS: "team",
                                     labels.OWNED_NODE_TAINTS: "nvidia.com/gpu:NoSchedule"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}
