"""Node selection of a pod spec as data, and whether two selections can claim the same node.

A pod lands on a node that matches its ``nodeSelector`` AND one of the required node-affinity terms.
We model that as a disjunction of terms, each a conjunction of label requirements. Two selections
overlap when some term of one and some term of the other can be satisfied by one node. The check
is conservative: only contradictions Kubernetes itself would see (disjoint ``In`` sets, ``In`` or
``Exists`` against ``DoesNotExist``, ``NotIn`` removing every allowed value) make terms disjoint;
``Gt``/``Lt`` never do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.manifests import as_list, as_map, as_str


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  #: In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: frozenset[str] = frozenset()


Term = tuple[Requirement, ...]


@dataclass(frozen=True)
class NodeSelection:
    """OR of terms; an empty tuple of terms means "every node"."""

    terms: tuple[Term, ...]

    def requires(self, key: str) -> bool:
        """Every term demands that the node carries ``key`` (``Exists`` or ``In``)."""
        if not self.terms:
            return False
        return all(any(r.key == key and r.operator in ("Exists", "In") for r in term) for term in self.terms)

    def describe(self) -> str:
        if not self.terms:
            return "every node"
        return " or ".join("{" + ", ".join(_describe(r) for r in term) + "}" for term in self.terms)


def _describe(r: Requirement) -> str:
    if r.operator == "In" and len(r.values) == 1:
        return f"{r.key}={next(iter(r.values))}"
    if r.operator in ("Exists", "DoesNotExist"):
        return f"{r.key} {r.operator}"
    return f"{r.key} {r.operator} ({', '.join(sorted(r.values))})"


def node_selection(spec: Mapping[str, Any]) -> NodeSelection:
    """Read ``nodeSelector`` and required node affinity from a pod spec."""
    base = tuple(
        Requirement(str(k), "In", frozenset({v}))
        for k, v in as_map(spec.get("nodeSelector")).items()
        if isinstance(v, str)
    )
    affinity = as_map(as_map(spec.get("affinity")).get("nodeAffinity"))
    required = as_map(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms: list[Term] = []
    for raw in as_list(required.get("nodeSelectorTerms")):
        reqs = [_requirement(e) for e in as_list(as_map(raw).get("matchExpressions"))]
        terms.append(base + tuple(r for r in reqs if r is not None))
    if not terms:
        return NodeSelection((base,) if base else ())
    return NodeSelection(tuple(terms))


def _requirement(raw: Any) -> Requirement | None:
    expr = as_map(raw)
    key, op = as_str(expr.get("key")), as_str(expr.get("operator"))
    if not key or not op:
        return None
    values = frozenset(v for v in as_list(expr.get("values")) if isinstance(v, str))
    return Requirement(key, op, values)


def label_selection(match_labels: Mapping[str, Any], match_expressions: Iterable[Any] = ()) -> NodeSelection:
    """A Kubernetes ``LabelSelector`` (matchLabels + matchExpressions) as a one-term selection."""
    term = tuple(Requirement(str(k), "In", frozenset({v})) for k, v in match_labels.items() if isinstance(v, str))
    term += tuple(r for r in (_requirement(e) for e in match_expressions) if r is not None)
    return NodeSelection((term,) if term else ())


def _term_satisfiable(reqs: Iterable[Requirement]) -> bool:
    by_key: dict[str, list[Requirement]] = {}
    for r in reqs:
        by_key.setdefault(r.key, []).append(r)
    for group in by_key.values():
        present = any(r.operator in ("In", "Exists", "Gt", "Lt") for r in group)
        absent = any(r.operator == "DoesNotExist" for r in group)
        if present and absent:
            return False
        allowed: frozenset[str] | None = None
        for r in group:
            if r.operator == "In":
                allowed = r.values if allowed is None else allowed & r.values
        if allowed is None:
            continue
        for r in group:
            if r.operator == "NotIn":
                allowed = allowed - r.values
        if not allowed:
            return False
    return True


def overlap(a: NodeSelection, b: NodeSelection) -> bool:
    """Whether some node could match both selections."""
    a_terms = a.terms or ((),)
    b_terms = b.terms or ((),)
    return any(_term_satisfiable(ta + tb) for ta in a_terms for tb in b_terms)
