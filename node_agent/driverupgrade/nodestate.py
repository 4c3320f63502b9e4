"""What the driver upgrade controller trusts of a Node's upgrade state: what it wrote itself.

The state lives on the Node (:mod:`node_agent.driverupgrade.machine`), where other clients write too. A
node agent's credentials, or a person's ``kubectl label``, could set ``upgrade-failed`` on a node and stop
the rollout, set a later state and skip a node's drain, or rewrite the cordon record and have a node an
operator cordoned given back. The API server records which field manager last changed each label and
annotation (``metadata.managedFields``, operation ``Update``: the request's ``?fieldManager=``, else the
prefix of its User-Agent, ``python-urllib3`` for the agent's transport). The controller names itself
(:data:`FIELD_MANAGER`) on every Node write and reads its state keys (:data:`OWN_KEYS`) back only where
that record names it. A key another manager changed is forged: logged, reported, not acted on.

What the controller's view is then: with each state it writes a record of it (:data:`RECORD_ANNOTATION`:
the state, when it began by the wall clock, the boot and monotonic reading it was written at, the
was-cordoned value) in the same patch as the label, so the two share one managedFields entry. A forged
key reads as the record says (the record's state for the label, its values for the annotations), or as
absent without a record of the controller's own. The controller writes that view back
(:attr:`Trusted.restore_labels`, :attr:`Trusted.restore_annotations`), so the forged values go and the keys
are its own again.

What it cannot see. A deletion names no manager: a person deleting the label is the documented way on
after a failure, so an absent label is no state, whoever removed it. The field manager is the client's
word: a client that names itself as the controller passes; the admission policy keeps node agents'
credentials off these keys, and this is the defence behind it, against every client that does not
impersonate the controller. An API server keeps at most ten ``Update`` managers a Node and folds the
oldest into ``ancient-changes``; a node whose keys were folded so reads as having no state of the
controller's (it starts over, the conservative way: a node it had cordoned counts as cordoned by someone
else and stays cordoned after). State left by a controller from before this check (written as
``python-urllib3``, like any node agent's) is not trusted either: an upgraded controller starts such a
node over.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from node_agent.driverupgrade.machine import (
    FAILURE_ANNOTATION,
    SINCE_ANNOTATION,
    STATE_LABEL,
    WAS_CORDONED_ANNOTATION,
    UpgradeState,
)
from node_agent.kube.nodeowner import DRIVER_UPGRADE

#: The field manager the controller's Node writes name (``?fieldManager=``): its writer's, which
#: :func:`node_agent.kube.nodeowner.patch` signs them with.
FIELD_MANAGER = DRIVER_UPGRADE.field_manager
#: The controller's record of the state it wrote (JSON: :class:`Record`), beside the label.
RECORD_ANNOTATION = "gpu.nvidia-gpu.io/driver-upgrade-record"
LABELS, ANNOTATIONS = "labels", "annotations"
#: The keys the controller reads back as its own state, as (``labels`` | ``annotations``, key).
OWN_KEYS: tuple[tuple[str, str], ...] = (
    (LABELS, STATE_LABEL),
    (ANNOTATIONS, RECORD_ANNOTATION),
    (ANNOTATIONS, SINCE_ANNOTATION),
    (ANNOTATIONS, WAS_CORDONED_ANNOTATION),
    (ANNOTATIONS, FAILURE_ANNOTATION),
)
#: A failed node's reason once another client overwrote it (the reason stays in its DriverUpgradeFailed Event).
FAILURE_OVERWRITTEN = "the failure reason was overwritten by another client; see the node's DriverUpgradeFailed Event"


@dataclass(frozen=True)
class Record:
    """The state the controller last wrote on a Node, with what times its wait (see
    :class:`node_agent.driverupgrade.controller.UpgradeController`)."""

    state: UpgradeState
    #: When the state began by the wall clock (Unix seconds, as :data:`SINCE_ANNOTATION` says).
    since: float
    #: The boot ID of the host the writing controller ran on, and its ``CLOCK_MONOTONIC`` then.
    boot_id: str
    monotonic: float
    #: :data:`WAS_CORDONED_ANNOTATION`'s value after the write (None: absent).
    was_cordoned: str | None = None

    def encode(self) -> str:
        return json.dumps({"state": self.state.value, "since": self.since, "bootID": self.boot_id,
                           "monotonic": round(self.monotonic, 3), "wasCordoned": self.was_cordoned},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> Record | None:
        """The record, or None for one that cannot be read (then there is no record to go by)."""
        try:
            raw = json.loads(text or "")
            if not isinstance(raw, dict):
                return None
            was = raw.get("wasCordoned")
            since, monotonic = float(raw["since"]), float(raw["monotonic"])
            if not (math.isfinite(since) and math.isfinite(monotonic)):
                return None
            return cls(UpgradeState(raw["state"]), since, str(raw["bootID"]), monotonic,
                       None if was is None else str(was))
        except (KeyError, TypeError, ValueError):
            return None


def field_owners(node: Mapping[str, Any]) -> dict[tuple[str, str], frozenset[str]]:
    """(``labels`` | ``annotations``, key) -> the field managers ``metadata.managedFields`` lists for it. A
    manager's write through a subresource is named ``manager/subresource``: not the controller's path."""
    out: dict[tuple[str, str], set[str]] = {}
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(entry, Mapping) or entry.get("fieldsType", "FieldsV1") != "FieldsV1":
            continue
        manager = str(entry.get("manager") or "")
        if entry.get("subresource"):
            manager = f"{manager}/{entry['subresource']}"
        fields = entry.get("fieldsV1")
        meta = fields.get("f:metadata") if isinstance(fields, Mapping) else None
        if not isinstance(meta, Mapping):
            continue
        for section in (LABELS, ANNOTATIONS):
            keys = meta.get(f"f:{section}")
            if not isinstance(keys, Mapping):
                continue
            for fkey in keys:
                if isinstance(fkey, str) and fkey.startswith("f:"):
                    out.setdefault((section, fkey[2:]), set()).add(manager)
    return {k: frozenset(v) for k, v in out.items()}


@dataclass(frozen=True)
class Forged:
    """One of the controller's keys last changed by another field manager."""

    section: str
    key: str
    value: str
    #: Who managedFields says changed it (empty: nobody recorded, e.g. managedFields stripped).
    managers: tuple[str, ...]


@dataclass(frozen=True)
class Trusted:
    """A Node's upgrade state as the controller trusts it."""

    state: UpgradeState | None
    #: The Node's annotations with the controller's keys as it wrote them (forged ones as its record says).
    annotations: Mapping[str, str]
    #: The controller's own record, None where there is none it wrote.
    record: Record | None
    forged: tuple[Forged, ...] = ()
    #: The patch that puts the controller's view back (None deletes a key).
    restore_labels: Mapping[str, str | None] = field(default_factory=dict)
    restore_annotations: Mapping[str, str | None] = field(default_factory=dict)


def trusted(node: Mapping[str, Any]) -> Trusted:
    """The upgrade state of ``node`` (raw JSON, ``managedFields`` included) that the controller wrote."""
    meta = node.get("metadata") or {}
    view = {LABELS: {str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            ANNOTATIONS: {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}}
    owners = field_owners(node)

    def ours(section: str, key: str) -> bool:
        return FIELD_MANAGER in owners.get((section, key), frozenset())

    record = Record.decode(view[ANNOTATIONS].get(RECORD_ANNOTATION)) if ours(ANNOTATIONS, RECORD_ANNOTATION) else None
    restore: dict[str, dict[str, str | None]] = {LABELS: {}, ANNOTATIONS: {}}
    if record is not None and STATE_LABEL not in view[LABELS]:
        # The label was deleted (by a person: the way on after a failure): the record is of a state the
        # node no longer has, and goes too, so that nobody's label later reads as the controller's.
        record = None
        restore[ANNOTATIONS][RECORD_ANNOTATION] = None
        del view[ANNOTATIONS][RECORD_ANNOTATION]
    # What the controller's own record says each key holds (None: absent). A forged record is dropped: the
    # controller writes its own with the node's next state.
    recorded: dict[tuple[str, str], str | None] = {
        (LABELS, STATE_LABEL): record.state.value if record else None,
        (ANNOTATIONS, RECORD_ANNOTATION): None,
        (ANNOTATIONS, SINCE_ANNOTATION): f"{record.since:.0f}" if record else None,
        (ANNOTATIONS, WAS_CORDONED_ANNOTATION): record.was_cordoned if record else None,
        (ANNOTATIONS, FAILURE_ANNOTATION): FAILURE_OVERWRITTEN if record and record.state is UpgradeState.FAILED
        else None,
    }
    forged: list[Forged] = []
    for section, key in OWN_KEYS:
        value = view[section].get(key)
        if value is None or ours(section, key):
            continue
        want = recorded[(section, key)]
        if value == want:
            # Another client wrote what the record holds: nothing to undo (and writing the same value again
            # would not make the key the controller's: an unchanged field keeps its manager).
            continue
        forged.append(Forged(section, key, value, tuple(sorted(owners.get((section, key), frozenset())))))
        restore[section][key] = want
        if want is None:
            del view[section][key]
        else:
            view[section][key] = want
    text = view[LABELS].get(STATE_LABEL)
    try:
        state = UpgradeState(text) if text else None
    except ValueError:  # its own label, with a value of another release of the controller: start over, cleanly
        state = UpgradeState.REQUIRED
    return Trusted(state, view[ANNOTATIONS], record, tuple(forged), restore[LABELS], restore[ANNOTATIONS])
