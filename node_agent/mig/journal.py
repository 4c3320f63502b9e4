"""The MIG manager's journal: what it is doing, recorded on the host before each destructive step.

A reconfiguration touches the Node (labels, taint, annotations, cordon) and the GPUs (mode, instances).
If the pod dies half-way, the next manager must know which phase it reached, what to put back on the
Node and which layout the GPUs had, so it can resume or roll back instead of leaving
``paused-for-mig-change`` labels and the taint behind (the known failure of NVIDIA's manager). The
journal lives under the agent state directory on the host (``/var/lib/nvidia-gpu-agent/mig/``), so it
survives pod restarts and, with the boot ID, tells a reboot apart from a crash.

The file is the agent's own: it is read leniently (unknown keys ignored, a future version refused
with a clear message), carries a checksum (an edited or damaged journal is never acted on: the node is
given back and the failure reported) and is written atomically and owner-only through
:class:`JournalFiles` (the agent's ``HostRoot`` itself), in the format every state file of the agent
shares (:mod:`node_agent.host.statefile`); a host error reading or writing it is a :class:`JournalError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from node_agent.host import HostError, statefile
from node_agent.host.atomic import content_checksum
from node_agent.mig.hardware import GpuState, PlacedInstance
from nvgpu.nodescripts import facts

JOURNAL_VERSION = 1
JOURNAL_PATH = f"{facts.STATE_DIR}/mig/journal.json"


class Phase(StrEnum):
    """Journal phases, in the order a reconfiguration passes through them."""

    PAUSING = "pausing"  #: state=pending, deploy labels paused, taint set
    APPROVAL = "approval"  #: waiting for Deckhouse's disruption approval
    DRAINING = "draining"  #: waiting for the node to be drained / GPU workloads evicted
    CLIENTS = "clients"  #: waiting for GPU client pods and processes to be gone
    MODE = "mode"  #: destructive: changing MIG mode
    REBOOTING = "rebooting"  #: destructive: waiting for the reboot a mode change needed
    LAYOUT = "layout"  #: destructive: destroying and creating instances
    VERIFY = "verify"
    ROLLBACK = "rollback"  #: destructive: putting the previous layout back
    RESTORE = "restore"  #: outcome known; giving the node back


#: Phases in which the GPUs may be half-changed: a crash here resumes the step or rolls back.
DESTRUCTIVE = frozenset({Phase.MODE, Phase.REBOOTING, Phase.LAYOUT, Phase.VERIFY, Phase.ROLLBACK})
#: Phases whose wait has a timeout (:class:`~node_agent.mig.machine.Timeouts`), measured from the phase's
#: monotonic anchor.
TIMED = frozenset({Phase.APPROVAL, Phase.DRAINING, Phase.CLIENTS})


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILED = "failed"
    ABORTED = "aborted"  #: the label was removed or the manager stopped before any GPU change


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class JournalInstance(_Lenient):
    profile: str
    start: int


class JournalGpu(_Lenient):
    index: int
    uuid: str
    mig_enabled: bool
    mig_pending: bool = False
    instances: list[JournalInstance] = []

    @classmethod
    def of(cls, s: GpuState) -> JournalGpu:
        return cls(
            index=s.index,
            uuid=s.uuid,
            mig_enabled=s.mig_enabled,
            mig_pending=s.mig_pending,
            instances=[JournalInstance(profile=i.profile, start=i.start) for i in s.instances],
        )

    def state(self) -> GpuState:
        return GpuState(
            self.index,
            self.uuid,
            self.mig_enabled,
            self.mig_pending,
            tuple(PlacedInstance(i.profile, i.start) for i in self.instances),
        )


@dataclass(frozen=True)
class Instant:
    """A moment as the journal records it: the wall clock, and the monotonic clock with the boot it counts
    from. The wall clock is for people and the metrics (``started_at``, ``phase_since``); the waits are
    timed on the monotonic one, which NTP steps, ``date -s`` and a VM resumed with a stale clock do not
    move. ``CLOCK_MONOTONIC`` is the host's, shared by every process of one boot (the manager's container
    has no time namespace), so a restarted manager on the same boot reads the same clock."""

    wall: float
    monotonic: float
    boot_id: str


class Journal(_Lenient):
    config: str  #: the mig.config value being applied
    phase: Phase
    started_at: float  #: wall clock (Unix time): for people and the duration metric, never for a timeout
    phase_since: float  #: wall clock (Unix time): for people and the phase metric, never for a timeout
    #: The boot whose reboot a mode change waits for (set at BEGIN and when entering REBOOTING).
    boot_id: str = ""
    #: The phase's start on the monotonic clock: the reading ``phase_mono`` on boot ``phase_boot_id``. A
    #: journal from another boot (the node rebooted) or from an agent before these fields cannot be timed
    #: from it; the manager anchors it again (:meth:`reanchored`), so its wait starts again there rather
    #: than trust a wall clock that may have been stepped.
    phase_mono: float | None = None
    phase_boot_id: str = ""
    #: Node state to put back: original label values (None = absent) of the deploy and state labels.
    original_labels: dict[str, str | None] = {}
    was_unschedulable: bool = False
    #: GPUs before the first destructive step (recorded when leaving CLIENTS).
    previous: list[JournalGpu] = []
    attempts: int = 0  #: destructive attempts started in the current phase (crash loop guard)
    outcome: Outcome | None = None
    reason: str = ""
    clients_stopped: bool = False  #: GPU client pods were deleted (the taint keeps them from coming back)

    def advance(self, phase: Phase, at: Instant, **changes: object) -> Journal:
        return self.model_copy(update={"phase": phase, "phase_since": at.wall, "phase_mono": at.monotonic,
                                       "phase_boot_id": at.boot_id, "attempts": 0, **changes})

    def anchored(self, monotonic: float, boot_id: str) -> bool:
        """The phase's monotonic reading can be compared with ``monotonic`` read on boot ``boot_id`` (a
        reading ahead of the clock is another boot's, whatever the boot IDs say: one unreadable is "")."""
        return self.phase_mono is not None and self.phase_boot_id == boot_id and monotonic >= self.phase_mono

    def waited(self, monotonic: float, boot_id: str) -> float:
        """Seconds spent in the phase by the monotonic clock; 0 for a journal not anchored on this boot
        (its wait starts now: :meth:`reanchored`)."""
        if self.phase_mono is None or not self.anchored(monotonic, boot_id):
            return 0.0
        return monotonic - self.phase_mono

    def reanchored(self, monotonic: float, boot_id: str) -> Journal:
        """The journal with its phase's wait starting at ``monotonic`` on ``boot_id``. Time before it (across
        a reboot, or in an agent that did not anchor its waits) is not counted: only the wall clock could
        say how long that was, and it may have been stepped. A wait that starts again can hold a node one
        timeout longer; it never fails one early."""
        return self.model_copy(update={"phase_mono": monotonic, "phase_boot_id": boot_id})

    def previous_states(self) -> tuple[GpuState, ...]:
        return tuple(g.state() for g in self.previous)




class JournalError(RuntimeError):
    """The journal exists but cannot be used; the manager refuses to guess and reports it."""


class JournalFiles(Protocol):
    """The host operations the journal needs: ``node_agent.host.HostRoot``'s own, which production passes
    as it is; failures raise :class:`~node_agent.host.HostError` (the store makes them journal errors)."""

    def read_bytes_or_none(self, host_path: str) -> bytes | None:
        """The file's content, or None when it does not exist."""
        ...

    def write_atomic(self, host_path: str, data: bytes, mode: int) -> bool:
        """Write via temp file, fsync and rename, so a crash leaves the old or the new file; False when the
        file already held ``data``."""
        ...

    def remove(self, host_path: str) -> bool:
        """Delete the file; a missing file is not an error (False)."""
        ...


@dataclass
class JournalStore:
    """Reads and writes the journal in the agent's state-file format (:mod:`node_agent.host.statefile`)."""

    files: JournalFiles
    path: str = JOURNAL_PATH

    def load(self) -> Journal | None:
        try:
            raw = self.files.read_bytes_or_none(self.path)
        except HostError as e:
            raise JournalError(str(e)) from e
        if raw is None:
            return None
        try:
            data = _legacy(raw)
            if data is None:
                _, data = statefile.decode(raw, JOURNAL_VERSION)
        except statefile.StateFileProblem as e:
            raise JournalError(f"MIG journal {self.path} cannot be used: {e}") from e
        try:
            return Journal.model_validate(data)
        except ValidationError as e:
            raise JournalError(f"MIG journal {self.path} is unreadable: {e.errors(include_url=False)[0]['msg']}") from e

    def save(self, journal: Journal) -> None:
        raw = statefile.encode(journal.model_dump(mode="json"), JOURNAL_VERSION)
        try:
            self.files.write_atomic(self.path, raw, mode=statefile.STATE_FILE_MODE)
        except HostError as e:
            raise JournalError(str(e)) from e

    def clear(self) -> None:
        try:
            self.files.remove(self.path)
        except HostError as e:
            raise JournalError(str(e)) from e


def _legacy(raw: bytes) -> dict[str, object] | None:
    """The journal as agents before the common state-file format wrote it (the fields at the top level
    beside ``checksum``), checked the same way; None for anything else. A node upgraded in the middle of
    a reconfiguration keeps its journal instead of losing the Node state it holds."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or "data" in doc or "phase" not in doc:
        return None
    version = doc.get("version")
    if isinstance(version, int) and version > JOURNAL_VERSION:
        raise statefile.StateFileProblem(
            f"format version {version} was written by a newer agent; this agent reads up to {JOURNAL_VERSION}")
    checksum = doc.pop("checksum", None)
    if checksum != content_checksum(doc):
        raise statefile.StateFileProblem("checksum mismatch (edited or damaged)")
    return doc
