"""Pure pieces of the pack: node-selection overlap, config reconciliation, the preview-style report."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvgpu.stackconfig import CONFIG_FILE_ENV
from nvidia_gpu.policies.node_selection import (
    NodeSelection,
    Requirement,
    candidate_pairs,
    label_selection,
    node_selection,
    overlap,
    pinned_values,
)
from nvidia_gpu.policies.stack_facts import config_values, parse_minor
from nvidia_gpu.preview.policyrun.analyzer_client import Diagnostic, reconcile_config
from nvidia_gpu.preview.policyrun.report import format_policies, summary_line
from nvidia_gpu.sdk.analyzer import PackInfo, PolicyInfo, policy_level


def _sel(*reqs: tuple[str, str, tuple[str, ...]]) -> NodeSelection:
    return NodeSelection((tuple(Requirement(k, op, frozenset(v)) for k, op, v in reqs),))


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (_sel(("pool", "In", ("a",))), _sel(("pool", "In", ("b",))), False),
        (_sel(("pool", "In", ("a", "b"))), _sel(("pool", "In", ("b",))), True),
        (_sel(("pool", "Exists", ())), _sel(("pool", "DoesNotExist", ())), False),
        (_sel(("pool", "NotIn", ("a",))), _sel(("pool", "DoesNotExist", ())), True),
        (_sel(("pool", "NotIn", ("a",))), _sel(("pool", "In", ("a",))), False),
        (_sel(("zone", "In", ("z1",))), _sel(("pool", "In", ("a",))), True),
        (_sel(("pool", "Gt", ("3",))), _sel(("pool", "Lt", ("2",))), True),  # numeric bounds are not compared
        (NodeSelection(()), _sel(("pool", "In", ("a",))), True),
        (_sel(("pool", "In", ("a",)), ("pool", "In", ("b",))), NodeSelection(()), False),  # contradicts itself
    ],
)
def test_overlap(a: NodeSelection, b: NodeSelection, expected: bool) -> None:
    assert overlap(a, b) is expected
    assert overlap(b, a) is expected


_REQUIREMENTS = st.builds(
    Requirement,
    st.sampled_from(["pool", "zone", "gpu"]),
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.frozensets(st.sampled_from(["a", "b", "c"]), max_size=2),
)
_TERMS = st.tuples(_REQUIREMENTS, _REQUIREMENTS).map(tuple)
_SELECTIONS = st.builds(NodeSelection, st.lists(_TERMS, max_size=2).map(tuple))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefgh"), st.lists(_SELECTIONS, min_size=1, max_size=2), max_size=8))
def test_candidate_pairs_keep_every_overlapping_pair(claims: dict[str, list[NodeSelection]]) -> None:
    """The index may only skip pairs that cannot overlap: every pair the brute force finds is a candidate."""
    names = sorted(claims)
    overlapping = {
        (a, b) for i, a in enumerate(names) for b in names[i + 1 :]
        if any(overlap(x, y) for x in claims[a] for y in claims[b])
    }
    candidates = candidate_pairs(claims)
    assert overlapping <= set(candidates)
    assert candidates == sorted(set(candidates)) and all(a < b for a, b in candidates)


def test_candidate_pairs_of_groups_pinned_to_distinct_values_are_linear() -> None:
    claims = {
        f"g{i:04d}": [label_selection({"node.deckhouse.io/group": f"gpu-{i}", "gpu": "yes"})] for i in range(2000)
    }
    claims["shared"] = [label_selection({"node.deckhouse.io/group": "gpu-7"})]
    claims["anywhere"] = [NodeSelection(())]
    pairs = candidate_pairs(claims)
    assert ("g0007", "shared") in pairs
    assert sum(1 for p in pairs if "anywhere" in p) == 2001
    assert len(pairs) == 2002


def test_pinned_values_ignore_contradicting_terms_and_stop_at_unpinned_ones() -> None:
    pool_a = (Requirement("pool", "In", frozenset({"a", "b"})), Requirement("pool", "NotIn", frozenset({"b"})))
    never = (Requirement("pool", "Exists"), Requirement("pool", "DoesNotExist"))
    assert pinned_values(NodeSelection((pool_a, never)), "pool") == frozenset({"a"})
    assert pinned_values(NodeSelection((pool_a, (Requirement("zone", "In", frozenset({"z"})),))), "pool") is None
    assert pinned_values(NodeSelection(()), "pool") is None


def test_node_selection_ands_the_node_selector_into_every_affinity_term() -> None:
    spec = {
        "nodeSelector": {"gpu": "yes"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
        ]}}},
    }
    selection = node_selection(spec)
    assert selection.describe() == "{gpu=yes, pool=a} or {gpu=yes, pool=b}"
    assert selection.requires("gpu") and not selection.requires("pool-x")
    assert not overlap(selection, label_selection({"gpu": "no"}))


def _info() -> PackInfo:
    return PackInfo("p", "1.0.0", (
        PolicyInfo("a", "A.", "mandatory", {"limit": {"type": "integer", "maximum": 5}}),
        PolicyInfo("b", "B.", "advisory", {}),
    ))


def test_reconcile_gives_every_policy_an_explicit_level() -> None:
    out = reconcile_config(_info(), {"a": {"limit": 3}})
    assert policy_level(out["a"]) == "mandatory" and dict(out["a"].properties) == {"limit": 3}
    assert policy_level(out["b"]) == "advisory"


def test_reconcile_all_then_per_policy_levels() -> None:
    out = reconcile_config(_info(), {"all": "disabled", "b": {"enforcementLevel": "mandatory"}})
    assert (policy_level(out["a"]), policy_level(out["b"])) == ("disabled", "mandatory")


def _diag(policy: str, level: str, message: str, resource: str = "") -> Diagnostic:
    return Diagnostic(policy, "p", "1.0.0", message.split("\n", maxsplit=1)[0], message, level, f"urn:{resource}",
                      "kubernetes:apps/v1:DaemonSet" if resource else "", resource)


def test_report_lists_mandatory_before_advisory_like_pulumi_preview() -> None:
    diags = [_diag("z-advisory", "advisory", "Z.\nsoft"), _diag("a", "mandatory", "A.\nhard\n", "dp")]
    assert format_policies(_info(), diags, source="local: policies", project="proj", stack="dev") == (
        "Policies:\n"
        "    ❌ p@v1.0.0 (local: policies)\n"
        "        - [mandatory]  a  (kubernetes:apps/v1:DaemonSet: dp)\n"
        "          A.\n"
        "          hard\n"
        "        - [advisory]  z-advisory  (pulumi:pulumi:Stack: proj-dev)\n"
        "          Z.\n"
        "          soft"
    )
    assert summary_line(diags) == "Policy violations: 1 mandatory, 1 advisory"
    assert format_policies(_info(), diags[:1], source="local: x", project="p", stack="s").splitlines()[1] == (
        "    ✅ p@v1.0.0 (local: x)"
    )


def test_stack_config_values_from_the_cli_environment() -> None:
    env = {"PULUMI_CONFIG": '{"nvidia-gpu:cluster": "{\\"kubernetesVersion\\": \\"1.33\\"}", '
                            '"nvidia-gpu:config:flag": "x", "other:key": "y"}'}
    assert config_values(env) == {"cluster": {"kubernetesVersion": "1.33"}, "flag": "x"}
    assert config_values({"PULUMI_CONFIG": "not json"}) == {}
    assert (parse_minor("v1.34.2"), parse_minor("1.30"), parse_minor("latest")) == (34, 30, None)


def test_stack_config_values_from_the_offline_clients_file(tmp_path: Path) -> None:
    """The file the offline client names wins over the variable; an unreadable one is no config."""
    path = tmp_path / "config.json"
    path.write_text('{"nvidia-gpu:flag": "from-file"}')
    env = {CONFIG_FILE_ENV: str(path), "PULUMI_CONFIG": '{"nvidia-gpu:flag": "from-env"}'}
    assert config_values(env) == {"flag": "from-file"}
    assert config_values({CONFIG_FILE_ENV: str(tmp_path / "missing.json")}) == {}
