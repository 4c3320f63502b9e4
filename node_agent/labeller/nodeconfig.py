"""The node group's own labels and taints on the agent's Node: parsing the labeller's flags and planning one patch.

Off Deckhouse there is no NodeGroup node template, so the labeller (``labels --patch-node``) applies
what ``nvgpu.nodelabels`` says a group's nodes carry: ``--node-label KEY=VALUE`` and
``--node-taint KEY=VALUE:EFFECT`` (or ``KEY:EFFECT``). This module is pure: it validates the flags and
turns a snapshot of the Node into a merge patch, so the rules are tested without an API server.

Ownership: the labeller records the label keys and taints (``key:effect``) it set in two annotations
(``nvgpu.labels.OWNED_NODE_LABELS`` / ``OWNED_NODE_TAINTS``). A later run removes an owned label or
taint that is no longer requested, and never touches anything it did not set: a label or taint that
was already on the Node with the requested value (put there by node provisioning, say) is left
unowned, so dropping it from the stack leaves it alone. Taints live in one list that a merge patch
replaces whole, so the new list keeps every foreign taint exactly as read (``timeAdded`` included)
and the patch carries the Node's ``resourceVersion``: a concurrent taint change (the MIG manager's
``mig-reconfigure``) makes the API server answer 409 and the caller re-reads instead of losing it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from node_agent.kube.nodeowner import LABELLER, claimant_of_label, claimant_of_taint
from node_agent.labeller import gfd
from nvgpu import labels as names
from nvgpu.taints import NodeTaint

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: Both ``fullmatch``ed: ``re.match`` with ``$`` took ``--node-label pool=a100\n``, which the API server refuses.
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: Labels other parts of the agent own: node setup's gate labels (the labeller must never fake them) and the
#: MIG manager's state and ``nvidia.com/gpu.deploy.*`` pause labels (pinning them would fight a reconfiguration).
#: Every other writer's own key is refused too (:func:`node_agent.kube.nodeowner.claimant_of_label`).
RESERVED_LABELS = frozenset({names.GPU_SETUP_COMPLETE, names.GPU_VFIO_READY, names.MIG_CONFIG_STATE})
RESERVED_LABEL_PREFIXES = (names.GPU_DEPLOY_PREFIX,)
#: The MIG manager sets and clears this taint around a reconfiguration (and the driver upgrade its own:
#: :func:`node_agent.kube.nodeowner.claimant_of_taint`).
RESERVED_TAINTS = frozenset({names.MIG_RECONFIGURE_TAINT_KEY})


class NodeConfigError(ValueError):
    """A bad ``--node-label`` / ``--node-taint`` value; the message names the flag and the value."""


def _key_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"prefix {prefix!r} must be a DNS subdomain (lowercase, at most 253 characters)"
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        return ("name must be 1 to 63 characters of letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def _value_problem(value: str) -> str | None:
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        return ("value must be empty or at most 63 characters of letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def parse_label(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the value may be empty) into a checked pair."""
    key, eq, value = text.partition("=")
    problem = "expected KEY=VALUE" if not eq else _key_problem(key) or _value_problem(value)
    if problem is None and (key in RESERVED_LABELS or key.startswith(RESERVED_LABEL_PREFIXES)):
        problem = f"{key} is set by node setup or the MIG manager, not the labeller"
    if problem is None and (owner := claimant_of_label(key, LABELLER)) is not None:
        problem = f"{key} is set by {owner.title}, not the labeller"
    if problem is None and gfd.owned(key):
        problem = f"{key} is a feature-discovery label the labeller computes from the GPUs"
    if problem:
        raise NodeConfigError(f"--node-label {text!r}: {problem}")
    return key, value


def parse_taint(text: str) -> NodeTaint:
    """``KEY=VALUE:EFFECT`` or ``KEY:EFFECT`` (kubectl's taint syntax) into a checked taint."""
    head, colon, effect = text.rpartition(":")
    key, _, value = head.partition("=")
    if not colon:
        problem: str | None = "expected KEY=VALUE:EFFECT or KEY:EFFECT"
    elif effect not in TAINT_EFFECTS:
        problem = f"effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}"
    elif key in RESERVED_TAINTS:
        problem = f"{key} is set and cleared by the MIG manager, not the labeller"
    elif (owner := claimant_of_taint(key, LABELLER)) is not None:
        problem = f"{key} is set and cleared by {owner.title}, not the labeller"
    else:
        problem = _key_problem(key) or _value_problem(value)
    if problem:
        raise NodeConfigError(f"--node-taint {text!r}: {problem}")
    return NodeTaint(key, value, effect)


@dataclass(frozen=True)
class Requested:
    """What the stack wants on the Node (possibly nothing: then every owned label and taint goes)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[NodeTaint, ...] = ()

    @classmethod
    def from_flags(cls, label_flags: Sequence[str], taint_flags: Sequence[str]) -> Requested:
        pairs = [parse_label(t) for t in label_flags]
        keys = [k for k, _ in pairs]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise NodeConfigError(f"--node-label: key {', '.join(repeated)} given more than once")
        taints = [parse_taint(t) for t in taint_flags]
        slots = [f"{t.key}:{t.effect}" for t in taints]
        repeated = sorted({s for s in slots if slots.count(s) > 1})
        if repeated:
            raise NodeConfigError(f"--node-taint: {', '.join(repeated)} given more than once (one value per "
                                  "key and effect)")
        return cls(dict(pairs), tuple(taints))


@dataclass(frozen=True)
class NodeSnapshot:
    """The parts of a Node the plan reads; taints as the API returned them (foreign ones are re-sent verbatim)."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    resource_version: str = ""


@dataclass(frozen=True)
class NodePlan:
    labels: dict[str, str | None]  #: merge-patch entries (``None`` deletes)
    annotations: dict[str, str | None]
    taints: tuple[dict[str, Any], ...] | None  #: the whole new list, or None when unchanged
    #: The list ``taints`` was computed from, as read (the ownership check tells the changed taints by it).
    taints_read: tuple[Mapping[str, Any], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.labels and not self.annotations and self.taints is None


def _owned(annotations: Mapping[str, str], key: str) -> set[str]:
    return {k for k in annotations.get(key, "").split(",") if k}


def _slot(key: str, effect: str) -> str:
    return f"{key}:{effect}"


def _annotation(current: Mapping[str, str], key: str, owned: set[str]) -> dict[str, str | None]:
    text = ",".join(sorted(owned)) or None
    return {} if current.get(key) == text else {key: text}


def plan(node: NodeSnapshot, want: Requested) -> NodePlan:
    """The merge patch that makes ``node`` carry ``want`` and drops what the labeller owned but no longer wants."""
    owned_labels = _owned(node.annotations, names.OWNED_NODE_LABELS)
    label_patch: dict[str, str | None] = {k: v for k, v in want.labels.items() if node.labels.get(k) != v}
    label_patch |= {k: None for k in sorted(owned_labels - set(want.labels)) if k in node.labels}
    new_owned_labels = {k for k in want.labels if k in owned_labels or k in label_patch}

    owned_taints = _owned(node.annotations, names.OWNED_NODE_TAINTS)
    wanted = {_slot(t.key, t.effect): t for t in want.taints}
    present = {_slot(str(t.get("key")), str(t.get("effect"))): str(t.get("value") or "") for t in node.taints}
    new_list: list[dict[str, Any]] = []
    for t in node.taints:
        slot = _slot(str(t.get("key")), str(t.get("effect")))
        if slot in wanted:
            new_list.append(dict(t) if present[slot] == wanted[slot].value else wanted[slot].as_dict())
        elif slot not in owned_taints:
            new_list.append(dict(t))
    new_list += [t.as_dict() for s, t in wanted.items() if s not in present]
    new_owned_taints = {s for s, t in wanted.items() if s in owned_taints or present.get(s) != t.value}
    unchanged = [dict(t) for t in node.taints] == new_list

    annotations = _annotation(node.annotations, names.OWNED_NODE_LABELS, new_owned_labels)
    annotations |= _annotation(node.annotations, names.OWNED_NODE_TAINTS, new_owned_taints)
    return NodePlan(label_patch, annotations, None if unchanged else tuple(new_list), node.taints)
