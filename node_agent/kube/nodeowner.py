"""Who owns what on a Node, and the one way the agent's services change one: the Node-ownership module.

Four services write Nodes: the labeller (GPU feature labels, the node group's own labels and taints and
its records of them), node setup (its gate, check, OS and driver-placement labels; its teardown withdraws
what the labeller put on, through the labeller's own plan), the MIG manager (its state, the components it
pauses, its taint, cordon, its side of Deckhouse's disruption handshake) and the driver upgrade controller
(its state and records, its taint, cordon). Each says what it changes as a :class:`NodeChange` that names
its :class:`Writer`, and :func:`patch` sends it; none of them builds a request body or calls
:func:`node_agent.kube.nodes.patch_node` itself. They used to, four ways: the rules below were restated
(and could drift) in each. What this module decides for all of them:

* **Whose keys.** A writer's keys are its :class:`nvgpu.labels.NodeWrites`: for the node agents the very
  lists the stack's admission policy confines their tokens to (``nvidia_gpu.components.manifests.
  confinement``), for the driver upgrade controller (no node agent, so not confined there) its list here.
  The labeller also writes the node group's own labels and taints, whose keys only the stack config names
  (``--node-label``, ``--node-taint``): any key no other writer claims. :func:`patch` refuses a change to a
  key the writer does not own with :class:`NotOwned`, before any request: the refusal the admission policy
  would give, also where no policy runs (before Kubernetes 1.30, or a node agent run by hand), and a
  service that took another's key is a bug found by its own tests.
* **The patch.** One JSON merge patch (:func:`node_agent.kube.nodes.patch_body`), never a strategic merge
  patch and never a read-modify-write of labels: a label or annotation set to ``None`` is deleted, keys not
  named are left alone, so a key another owner set is never overwritten by a stale copy. ``spec.
  unschedulable`` is one field. The taint list is the exception, as a merge patch replaces lists whole: a
  change carrying it carries the list it was computed from (:attr:`NodeChange.taints_read`), by which the
  ownership of each taint added, changed or removed is checked, and other owners' taints are given back as
  read (``timeAdded`` and fields this agent does not model included).
* **Conflicts.** A change carrying the taint list carries the ``resourceVersion`` of the read it was
  computed from (the labeller's gated patches always do), so the API server answers 409
  (:class:`~node_agent.kube.errors.Conflict`) instead of dropping a taint someone added meanwhile. The
  writer then reads again and decides again: the labeller at once, a few times (:func:`decide_and_patch`),
  the MIG manager and the driver upgrade controller on their loop's next pass (their state is on the Node
  and in their journal, so a pass is what a retry is). A writer reading its Node from a watch
  (:class:`~node_agent.kube.ownnode.OwnNodeWatch`) gives :func:`patch` the watch: a patch's answer updates
  the copy, and a 409 makes the next read a GET (the copy was stale).
* **Removing what is ours.** A key is removed only when it is the writer's, and a key two owners may set
  is removed only while it has the value this writer gave it (:func:`labels_to_patch`'s ``remove_if``).
* **Who wrote it.** A writer with a field manager (the driver upgrade controller, which trusts only the
  state it wrote itself: ``node_agent.driverupgrade.nodestate``) names it on every patch
  (``?fieldManager=``); the node agents leave the client's default.

Reads need no owner: the Node as raw JSON is :func:`node_agent.kube.nodes.get_node` (or a watch's copy),
and its parts are :mod:`node_agent.kube.nodes`' readers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from node_agent.kube import nodes
from node_agent.kube.errors import Conflict, Forbidden
from node_agent.kube.transport import Kube
from nvgpu import labels as names
from nvgpu.driver import UPGRADE_TAINT_KEY

log = logging.getLogger(__name__)

Taint = Mapping[str, Any]


class NotOwned(Forbidden):
    """A change to a key its writer does not own, refused before any request (as the admission policy
    refuses it with the agent's token: a ``KubeError``, so each service reports it as it reports that)."""


@dataclass(frozen=True)
class Writer:
    """One service that writes Nodes: what it may change, and how it signs its writes."""

    #: How errors and logs name it ("the MIG manager").
    title: str
    writes: names.NodeWrites
    #: ``?fieldManager=`` on its patches ("": the client's default, ``python-urllib3`` for the agent's transport).
    field_manager: str = ""
    #: Also the node group's own labels and taints (``--node-label``, ``--node-taint``): keys only the stack
    #: names, so any key no other writer claims.
    group_keys: bool = False

    def may_label(self, key: str, value: str | None) -> bool:
        """Whether this writer may set (``value``) or remove (``None``) label ``key``."""
        own = self.writes.may_set_label(key) if value is not None else self.writes.may_remove_label(key)
        return own or (self.group_keys and claimant_of_label(key, self) is None)

    def may_annotate(self, key: str, value: str | None) -> bool:
        """Whether this writer may set (``value``) or remove (``None``) annotation ``key``."""
        return self.writes.may_set_annotation(key) if value is not None else self.writes.may_remove_annotation(key)

    def may_taint(self, key: str) -> bool:
        """Whether this writer may add, change or remove taints with ``key``."""
        return self.writes.may_set_taint(key) or (self.group_keys and claimant_of_taint(key, self) is None)


#: The labeller: GPU feature discovery's labels, the node group's labels and taints, its records of those.
LABELLER = Writer("the labeller", names.LABELLER_WRITES, group_keys=True)
#: Node setup, its monitor, ``vfio prepare --patch-node`` and teardown (which withdraws the labeller's keys
#: through the labeller's own plan, as :data:`LABELLER`).
NODE_SETUP = Writer("node setup", names.NODE_SETUP_WRITES)
MIG_MANAGER = Writer("the MIG manager", names.MIG_MANAGER_WRITES)
#: The driver upgrade controller: its state label and annotations, its taint, cordon; it requests a
#: disruption (Deckhouse's handshake) and clears the handshake when the node is back.
DRIVER_UPGRADE = Writer("the driver upgrade controller", names.NodeWrites(
    set_labels=(names.DRIVER_UPGRADE_KEYS,),
    set_annotations=(names.DRIVER_UPGRADE_KEYS, names.KeySet(keys=(names.DISRUPTION_REQUIRED,))),
    remove_annotations=(names.KeySet(keys=(names.DISRUPTION_APPROVED,)),),
    set_taints=(names.KeySet(keys=(UPGRADE_TAINT_KEY,)),), cordon=True),
    field_manager="nvidia-gpu-driver-upgrade")
WRITERS: tuple[Writer, ...] = (LABELLER, NODE_SETUP, MIG_MANAGER, DRIVER_UPGRADE)


def claimant_of_label(key: str, besides: Writer | None = None) -> Writer | None:
    """The writer (other than ``besides``) whose own label ``key`` is, if any."""
    return next((w for w in WRITERS if w is not besides and w.writes.may_set_label(key)), None)


def claimant_of_taint(key: str, besides: Writer | None = None) -> Writer | None:
    """The writer (other than ``besides``) whose own taint key ``key`` is, if any."""
    return next((w for w in WRITERS if w is not besides and w.writes.may_set_taint(key)), None)


@dataclass(frozen=True)
class NodeChange:
    """One writer's change of a Node: what one merge patch carries."""

    writer: Writer
    labels: Mapping[str, str | None] = field(default_factory=dict)  #: ``None`` deletes
    annotations: Mapping[str, str | None] = field(default_factory=dict)  #: ``None`` deletes
    #: The whole new taint list (None: unchanged), other owners' taints as read.
    taints: tuple[Taint, ...] | None = None
    #: The list ``taints`` was computed from, as read: what tells the taints changed from those kept.
    taints_read: tuple[Taint, ...] = ()
    unschedulable: bool | None = None
    #: Apply only to this version of the Node (409 otherwise): set with ``taints``.
    resource_version: str = ""

    @property
    def empty(self) -> bool:
        return not self.labels and not self.annotations and self.taints is None and self.unschedulable is None

    def body(self) -> dict[str, Any]:
        """The JSON merge patch; an empty change is ``{"metadata": {}}`` (no change, answered with the Node)."""
        return nodes.patch_body(labels=self.labels, annotations=self.annotations, taints=self.taints,
                                unschedulable=self.unschedulable,
                                resource_version=self.resource_version) or {"metadata": {}}

    def not_owned(self) -> list[str]:
        """What of this change its writer does not own (empty: all of it is the writer's)."""
        w = self.writer
        out = [f"label {k}" for k, v in self.labels.items() if not w.may_label(k, v)]
        out += [f"annotation {k}" for k, v in self.annotations.items() if not w.may_annotate(k, v)]
        if self.taints is not None:
            out += [f"taint {k}" for k in sorted(changed_taint_keys(self.taints_read, self.taints))
                    if not w.may_taint(k)]
        if self.unschedulable is not None and not w.writes.cordon:
            out.append("spec.unschedulable")
        return out


def _taint_id(t: Taint) -> tuple[str, str, str]:
    """A taint as the API server tells two apart (``timeAdded`` aside)."""
    return str(t.get("key") or ""), str(t.get("effect") or ""), str(t.get("value") or "")


def changed_taint_keys(before: Iterable[Taint], after: Iterable[Taint]) -> set[str]:
    """The keys of the taints added, changed or removed from ``before`` to ``after``."""
    old, new = {_taint_id(t) for t in before}, {_taint_id(t) for t in after}
    return {key for key, _, _ in old ^ new}


def retaint(read: Iterable[Taint], key: str, add: Taint | None = None) -> tuple[dict[str, Any], ...]:
    """``read`` without its ``key`` taints and with ``add`` (when given) at the end; the others as read."""
    kept = tuple(dict(t) for t in read if t.get("key") != key)
    return (*kept, dict(add)) if add is not None else kept


def labels_to_patch(current: Mapping[str, str], wanted: Mapping[str, str | None], *,
                    remove_if: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The label entries that make ``current`` carry ``wanted`` (``None``: absent), nothing for what is so
    already; ``remove_if``: keys removed only while they have the value given (another owner's value stays)."""
    wanted = {**wanted, **{k: None for k, v in (remove_if or {}).items() if current.get(k) == v}}
    return {k: v for k, v in wanted.items() if current.get(k) != v and not (v is None and k not in current)}


class NodeCache(Protocol):
    """A watched copy of the Node (:class:`~node_agent.kube.ownnode.OwnNodeWatch`) that a patch keeps current."""

    def offer(self, obj: Mapping[str, Any]) -> None: ...

    def invalidate(self) -> None: ...


def patch(kube: Kube, name: str, change: NodeChange, *, what: str = "patch",
          cache: NodeCache | None = None) -> dict[str, Any]:
    """Send ``change`` to Node ``name`` (one merge patch, signed with its writer's field manager); answers
    the Node afterwards. :class:`NotOwned` when the change touches a key its writer does not own; with
    ``cache``, the answer is offered to it and a 409 invalidates it."""
    refused = change.not_owned()
    if refused:
        raise NotOwned(f"{what} node {name}: not {change.writer.title}'s to change: {', '.join(refused)}")
    try:
        obj = nodes.patch_node(kube, name, change.body(), what, field_manager=change.writer.field_manager)
    except Conflict:
        if cache is not None:
            cache.invalidate()
        raise
    if cache is not None:
        cache.offer(obj)
    return obj


Read = TypeVar("Read")
Decision = TypeVar("Decision")


def decide_and_patch(read: Callable[[], Read], decide: Callable[[Read], Decision | None],
                     write: Callable[[Decision], object], *, attempts: int, node: str) -> Decision | None:
    """Read the Node, decide, write; on a 409 (the Node changed since the read) read and decide again, up to
    ``attempts`` times in all, then let the last :class:`~node_agent.kube.errors.Conflict` through. Answers
    what was written, or None when ``decide`` found nothing to write."""
    for attempt in range(1, attempts + 1):
        decided = decide(read())
        if decided is None:
            return None
        try:
            write(decided)
        except Conflict:
            if attempt == attempts:
                raise
            log.info("node changed while patching, re-reading node=%s attempt=%d", node, attempt)
            continue
        return decided
    raise AssertionError("unreachable: the last attempt returns or raises")
