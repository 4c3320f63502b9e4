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
from functools import lru_cache
from typing import Any

from nvidia_gpu.policies.manifests import as_list, as_map, as_str


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


@dataclass(frozen=True)
class _KeyDemand:
    """Everything one side demands of one label key, folded together."""

    present: bool = False  #: In, Exists, Gt or Lt
    absent: bool = False  #: DoesNotExist
    allowed: frozenset[str] | None = None  #: intersection of In sets (None: any value)
    excluded: frozenset[str] = frozenset()  #: union of NotIn sets

    def combine(self, other: _KeyDemand) -> _KeyDemand | None:
        """Both demands at once, or ``None`` when no label value satisfies them."""
        allowed = (
            self.allowed
            if other.allowed is None
            else (other.allowed if self.allowed is None else self.allowed & other.allowed)
        )
        out = _KeyDemand(
            self.present or other.present, self.absent or other.absent, allowed, self.excluded | other.excluded
        )
        if out.present and out.absent:
            return None
        if out.allowed is not None and not out.allowed - out.excluded:
            return None
        return out


def _demand(r: Requirement) -> _KeyDemand:
    if r.operator == "In":
        return _KeyDemand(present=True, allowed=r.values)
    if r.operator == "NotIn":
        return _KeyDemand(excluded=r.values)
    if r.operator == "DoesNotExist":
        return _KeyDemand(absent=True)
    return _KeyDemand(present=True)  # Exists, Gt, Lt (numeric bounds are not compared)


@lru_cache(maxsize=8192)
def _canonical(term: Term) -> dict[str, _KeyDemand] | None:
    """One demand per key, or ``None`` when the term contradicts itself."""
    out: dict[str, _KeyDemand] = {}
    for r in term:
        current = out.get(r.key)
        demand = _demand(r) if current is None else current.combine(_demand(r))
        if demand is None:
            return None
        out[r.key] = demand
    return out


def _compatible(a: Term, b: Term) -> bool:
    ca, cb = _canonical(a), _canonical(b)
    if ca is None or cb is None:
        return False
    small, large = (ca, cb) if len(ca) <= len(cb) else (cb, ca)
    for key, demand in small.items():
        other = large.get(key)
        if other is not None and demand.combine(other) is None:
            return False
    return True


def overlap(a: NodeSelection, b: NodeSelection) -> bool:
    """Whether some node could match both selections."""
    a_terms = a.terms or ((),)
    b_terms = b.terms or ((),)
    return any(_compatible(ta, tb) for ta in a_terms for tb in b_terms)


def pinned_values(selection: NodeSelection, key: str) -> frozenset[str] | None:
    """Every value of ``key`` a node matching ``selection`` can carry, or ``None`` when any value can."""
    values: set[str] = set()
    for term in selection.terms or ((),):
        demands = _canonical(term)
        if demands is None:
            continue  # a self-contradicting term matches no node
        demand = demands.get(key)
        if demand is None or demand.allowed is None:
            return None
        values |= demand.allowed - demand.excluded
    return frozenset(values)


def candidate_pairs(claims: Mapping[str, Iterable[NodeSelection]]) -> list[tuple[str, str]]:
    """The pairs of names (sorted, each ``a < b``) whose selections :func:`overlap` must still compare.

    Comparing every pair is quadratic: 2,000 node groups are two million pairs. Groups that pin one
    label key (usually Deckhouse's node-group label) to disjoint values cannot overlap, whatever else
    they demand, so only names sharing a pinned value, and names that do not pin the key, are paired.
    """
    names = sorted(claims)
    selections = {n: list(claims[n]) for n in names}
    counts: dict[str, int] = {}
    for n in names:
        keys = {r.key for s in selections[n] for t in s.terms for r in t if r.operator == "In"}
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
    pinned: dict[str, frozenset[str]] = {}
    if counts:
        key = max(sorted(counts), key=lambda k: counts[k])
        for n in names:
            per_claim = [pinned_values(s, key) for s in selections[n]]
            if per_claim and all(v is not None for v in per_claim):
                pinned[n] = frozenset().union(*(v for v in per_claim if v is not None))
    by_value: dict[str, list[str]] = {}
    for n, values in pinned.items():
        for v in values:
            by_value.setdefault(v, []).append(n)
    free = [n for n in names if n not in pinned]
    pairs: set[tuple[str, str]] = set()
    for group in by_value.values():
        pairs.update((a, b) for i, a in enumerate(group) for b in group[i + 1 :])
    for a in free:
        pairs.update((a, b) if a < b else (b, a) for b in names if b != a)
    return sorted((a, b) if a < b else (b, a) for a, b in pairs)
