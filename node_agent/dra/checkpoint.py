"""The prepared-claims journal: what the driver did on this node, so it can be undone from a claim UID.

Format (JSON, ``version`` 1)::

    {"version": 1, "checksum": "sha256:<hex>", "data": {"nodeBootID": "...", "preparedClaims": {
        "<claimUID>": {"state": "PrepareStarted"|"PrepareCompleted", "namespace": ..., "name": ...,
                       "devices": [...], "sharing": [...], "cdiSpec": "/var/run/cdi/..."}}}}

- The envelope (version, checksum over ``data`` *as stored*) is the agent's one state-file format,
  :mod:`node_agent.host.statefile`, shared with the MIG journal: a newer agent adding fields never
  invalidates an older file (NVIDIA's driver crash-looped on exactly that, its issue #1080).
- ``nodeBootID`` comes from ``/proc/sys/kernel/random/boot_id``: after a reboot the GPUs' sharing and MIG
  state and ``/var/run/cdi`` are gone, so the journal is discarded instead of claiming stale work is done
  (NVIDIA issue #951).
- It is read, written (atomically: temp file, fsync, rename) and removed through the host root, the
  agent's ``HostRoot``, as the MIG journal is; callers hold the node-wide lock around read-modify-write.
- A file that does not parse or whose checksum does not match is reported, kept aside as
  ``checkpoint.json.corrupt``, and the journal is rebuilt from the claim CDI specs still on disk, so the
  plugin never crash-loops on it (NVIDIA issue #1100).
- Every claim whose prepare changes GPU sharing also gets an *undo record*, ``undo/<claimUID>.json`` next to
  the journal (same envelope, :class:`UndoRecords`): a second journal, one file per claim, so that damage
  to the main file cannot lose what must be undone. The CDI specs say which claims are prepared and on
  which devices, but not which compute modes, time slices or MPS daemons their prepare changed; without
  the undo records a journal rebuilt from the specs would forget them and leave a GPU ``EXCLUSIVE_PROCESS``
  with a daemon running for the next tenant. Ordering keeps one rule true while the journal is intact:
  *an undo record whose claim the journal does not hold changed nothing*. The record is written before
  the journal's ``PrepareStarted`` (before any host change), and removed before the journal forgets the
  claim (after everything is undone); so start-up deletes such orphans without acting on them. When the
  journal is damaged or missing it is rebuilt from the specs *and* the undo records: a claim with both
  is ``PrepareCompleted`` with its sharing records, a claim with only an undo record never finished
  preparing (or is being unprepared) and is ``PrepareStarted``, rolled back at start. An undo record that
  is itself damaged is kept aside and replaced by the widest undo (:data:`LOST_STRATEGY`: the claim's
  MPS directory, compute mode and time slice of each of its full GPUs): a damaged file never leaves a GPU
  silently in a changed mode. Undoing is idempotent, so undoing more than was done is harmless.
- The driver's own files are read leniently (unknown keys ignored); only user input is strict.
- A journal that cannot be written (read-only file system, ENOSPC, a directory that cannot be created)
  raises :class:`CheckpointError`, whose message names the host path and the OS error: the driver turns
  it into a per-claim error (prepare) or a clear start-up failure, never a traceback.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node_agent.dra.cdi import FoundSpec
from node_agent.dra.hostfs import HostPaths
from node_agent.host import HostError, statefile
from node_agent.host.proc import boot_id
from nvgpu import hostpaths

log = logging.getLogger(__name__)

VERSION = 1
#: The undo records' directory, next to the journal.
UNDO_DIR = "undo"
#: The strategy of an undo built for a claim whose undo record was damaged: it resets everything a
#: sharing strategy can change on the claim's devices (filled in once the devices are known).
LOST_STRATEGY = "Unknown"


class CheckpointError(RuntimeError):
    """The journal (or its directory) cannot be read back or written; the message names the host path."""

    def __init__(self, action: str, path: str, error: OSError | HostError) -> None:
        if isinstance(error, HostError):  # the host layer's: the OS error behind it says why, if there is one
            error = error.__cause__ if isinstance(error.__cause__, OSError) else OSError(None, str(error))
        reason = error.strerror or str(error)
        code = errno.errorcode.get(error.errno, "") if error.errno is not None else ""
        super().__init__(f"cannot {action} {path}: {reason}" + (f" ({code})" if code else ""))
        self.path = path
        self.errno = error.errno


class ClaimState(StrEnum):
    """``PrepareCompleted``: everything is applied and the claim's devices may be handed out.
    ``PrepareStarted``: host changes may be partly applied, by a prepare that did not finish or an unprepare
    that did not: the record must be undone before the claim is used again (start-up and the next
    prepare of the claim do that; so does the kubelet's retried unprepare)."""

    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class PreparedDevice(_Lenient):
    requests: list[str] = []
    pool: str = ""
    device: str
    cdi_device_ids: list[str] = Field(default=[], alias="cdiDeviceIDs")
    kind: str = ""
    uuid: str = ""
    physical_uuid: str = Field(default="", alias="physicalUUID")
    admin_access: bool = Field(default=False, alias="adminAccess")


class AppliedSharing(_Lenient):
    """What a sharing strategy changed on the host, so unprepare can undo exactly that. After an undo that
    did not finish it holds only what is still changed (``mpsStopped``: the daemon is gone, only its
    directories are left)."""

    strategy: str
    uuids: list[str] = []
    compute_mode_changed: list[str] = Field(default=[], alias="computeModeChanged")
    timeslice_changed: list[str] = Field(default=[], alias="timesliceChanged")
    mps_directory: str = Field(default="", alias="mpsDirectory")
    mps_stopped: bool = Field(default=False, alias="mpsStopped")


class PreparedClaim(_Lenient):
    state: ClaimState
    namespace: str = ""
    name: str = ""
    devices: list[PreparedDevice] = []
    sharing: list[AppliedSharing] = []
    cdi_spec: str = Field(default="", alias="cdiSpec")


class CheckpointData(_Lenient):
    node_boot_id: str = Field(default="", alias="nodeBootID")
    prepared_claims: dict[str, PreparedClaim] = Field(default={}, alias="preparedClaims")


class UndoRecord(_Lenient):
    """One undo record's data: the claim's journal entry as it was when its host changes began."""

    node_boot_id: str = Field(default="", alias="nodeBootID")
    claim_uid: str = Field(alias="claimUID")
    claim: PreparedClaim


class Recovery(StrEnum):
    NONE = "none"
    MISSING = "missing"
    REBOOT = "reboot"
    CORRUPTED = "corrupted"


@dataclass(frozen=True)
class Loaded:
    data: CheckpointData
    recovery: Recovery
    detail: str = ""


@dataclass(frozen=True)
class UndoScan:
    """The undo records on disk: readable ones by claim UID, damaged ones (kept aside) by the UID their
    file name gives, with the problem."""

    records: dict[str, PreparedClaim]
    damaged: dict[str, str]


def lost_sharing(claim_uid: str) -> AppliedSharing:
    """The undo for a claim whose undo record is damaged: its MPS directory (the path is the claim's, so it
    is known without the record; nothing is stopped where it does not exist); the compute mode and time
    slice of its full GPUs are added once its devices are known (``DeviceState``)."""
    return AppliedSharing(strategy=LOST_STRATEGY, mps_directory=f"{hostpaths.DRA_MPS_ROOT}/{claim_uid}")


class UndoRecords:
    """The undo records (see the module docstring): written and removed through the host root like the
    journal; callers hold the node-wide lock."""

    def __init__(self, host: HostPaths, directory: str, node_boot_id: str) -> None:
        self._host = host
        self.directory = directory
        self._boot_id = node_boot_id

    def host_path(self, claim_uid: str) -> str:
        return f"{self.directory}/{claim_uid.replace('/', '_')}.json"

    def write(self, claim_uid: str, claim: PreparedClaim) -> None:
        record = UndoRecord(node_boot_id=self._boot_id, claim_uid=claim_uid, claim=claim)
        raw = statefile.encode(record.model_dump(by_alias=True, mode="json"), VERSION)
        path = self.host_path(claim_uid)
        try:
            self._host.write_atomic(path, raw, mode=statefile.STATE_FILE_MODE)
        except HostError as e:
            raise CheckpointError("write the DRA undo record", path, e) from e

    def remove(self, claim_uid: str) -> None:
        path = self.host_path(claim_uid)
        try:
            self._host.remove(path)
        except HostError as e:
            raise CheckpointError("remove the DRA undo record", path, e) from e

    def files(self) -> dict[str, str]:
        """``{file stem: host path}`` of the records on disk (the stem is the claim UID, ``/`` as ``_``)."""
        try:
            directory = self._host.path(self.directory)
            found = directory.iterdir() if directory.is_dir() else iter(())
            names = sorted(p.name for p in found if p.name.endswith(".json"))
        except (HostError, OSError) as e:
            raise CheckpointError("list the DRA undo records in", self.directory, e) from e
        return {n[: -len(".json")]: f"{self.directory}/{n}" for n in names}

    def scan(self) -> UndoScan:
        """Read every record: one from another boot is removed (the changes it records died with that
        boot), a damaged one is kept aside as ``<file>.corrupt`` and reported."""
        records: dict[str, PreparedClaim] = {}
        damaged: dict[str, str] = {}
        for stem, path in self.files().items():
            try:
                raw = self._host.read_bytes_or_none(path)
                if raw is None:
                    continue
                _, body = statefile.decode(raw, VERSION)
                record = UndoRecord.model_validate(body)
            except (HostError, statefile.StateFileProblem, ValidationError) as e:
                problem = str(e) if not isinstance(e, ValidationError) else e.errors(include_url=False)[0]["msg"]
                damaged[stem] = problem
                self._set_aside(path, problem)
                continue
            if record.node_boot_id != self._boot_id:
                log.warning("event=undo-record-discarded reason=reboot claim_uid=%s", record.claim_uid)
                self.remove(record.claim_uid)
                continue
            records[record.claim_uid] = record.claim
        return UndoScan(records, damaged)

    def _set_aside(self, path: str, problem: str) -> None:
        local = self._host.path(path)
        log.error("event=undo-record-corrupted file=%s problem=%s kept_as=%s.corrupt", path, problem, path)
        try:
            os.replace(local, local.with_name(local.name + ".corrupt"))
        except OSError as e:
            raise CheckpointError("keep the corrupted DRA undo record aside as", f"{path}.corrupt", e) from e

    def discard_all(self, reason: str) -> None:
        for stem in self.files():
            log.warning("event=undo-record-discarded reason=%s claim_uid=%s", reason, stem)
            self.remove(stem)


class CheckpointStore:
    """Reads and writes the journal file; callers serialise access with the node-wide lock."""

    def __init__(self, host: HostPaths, path: str) -> None:
        self._file = host.path(path)
        self._host = host
        self.host_path = path
        self.boot_id = boot_id(host)
        self.undo = UndoRecords(host, f"{Path(path).parent}/{UNDO_DIR}", self.boot_id)

    @property
    def file(self) -> Path:
        return self._file

    def ensure_directory(self) -> None:
        """Create the journal's directory and prove it writable (start-up), or raise :class:`CheckpointError`."""
        directory = str(Path(self.host_path).parent)
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError("create the DRA checkpoint directory", directory, e) from e
        probe = f"{directory}/.{self._file.name}.probe"
        try:
            self._host.write_atomic(probe, b"", mode=statefile.STATE_FILE_MODE)
            self._host.remove(probe)
        except HostError as e:
            raise CheckpointError("write in the DRA checkpoint directory", directory, e) from e

    def peek(self) -> CheckpointData | None:
        """The journal if it is readable and current, without any recovery (no lock needed: writes are
        atomic renames)."""
        try:
            raw = self._host.read_bytes_or_none(self.host_path)
        except HostError:
            return None
        if raw is None:
            return None
        try:
            data = self._decode(raw)
        except statefile.StateFileProblem:
            return None
        return data if data.node_boot_id == self.boot_id else None

    def load(self, specs: Callable[[], list[FoundSpec]] | None = None, pool: str = "") -> Loaded:
        """Read the journal; when it is damaged, or missing while undo records exist, rebuild it from
        ``specs()`` (claim CDI files still on disk) and the undo records."""
        try:
            raw = self._host.read_bytes_or_none(self.host_path)
        except HostError as e:
            raise CheckpointError("read the DRA checkpoint", self.host_path, e) from e
        if raw is None:
            if not self.undo.files():
                return Loaded(CheckpointData(node_boot_id=self.boot_id), Recovery.MISSING)
            problem = "missing while claims have undo records"
        else:
            try:
                data = self._decode(raw)
            except statefile.StateFileProblem as e:
                problem = str(e)
            else:
                if data.node_boot_id != self.boot_id:
                    log.warning("event=checkpoint-discarded reason=reboot old_boot_id=%s boot_id=%s claims=%d",
                                data.node_boot_id, self.boot_id, len(data.prepared_claims))
                    self.undo.discard_all("reboot")
                    return Loaded(CheckpointData(node_boot_id=self.boot_id), Recovery.REBOOT,
                                  f"boot ID changed from {data.node_boot_id} to {self.boot_id}")
                return Loaded(data, Recovery.NONE)
            aside = self._file.with_name(self._file.name + ".corrupt")
            try:
                os.replace(self._file, aside)
            except OSError as e:
                raise CheckpointError("keep the corrupted DRA checkpoint aside as", f"{self.host_path}.corrupt",
                                      e) from e
        rebuilt = self._rebuild(specs() if specs else [], pool)
        log.error("event=checkpoint-corrupted file=%s problem=%s kept_as=%s rebuilt_claims=%d", self._file, problem,
                  f"{self._file}.corrupt" if raw is not None else "-", len(rebuilt.prepared_claims))
        self.save(rebuilt)
        return Loaded(rebuilt, Recovery.CORRUPTED, problem)

    def _rebuild(self, specs: list[FoundSpec], pool: str) -> CheckpointData:
        """The journal from what survives it: the CDI specs (claims prepared, their devices) and the undo
        records (what their sharing changed)."""
        rebuilt = CheckpointData(node_boot_id=self.boot_id)
        claims = rebuilt.prepared_claims
        for spec in specs:
            namespace, _, name = spec.claim.partition("/")
            claims[spec.claim_uid] = PreparedClaim(
                state=ClaimState.PREPARE_COMPLETED, namespace=namespace, name=name, cdi_spec=str(spec.path),
                devices=[PreparedDevice(device=d, pool=pool) for d in spec.device_names],
            )
        scan = self.undo.scan()
        with_spec = {d.device for c in claims.values() for d in c.devices}
        for uid, record in scan.records.items():
            spec_claim = claims.get(uid)
            if spec_claim is not None:
                spec_claim.devices, spec_claim.sharing = record.devices, record.sharing
                continue
            if with_spec & {d.device for d in record.devices if not d.admin_access}:
                # Its devices are prepared for a claim with a spec: an intact journal could not have let
                # that happen while this claim held them, so it is an orphan that never changed anything.
                log.warning("event=orphan-undo-record-removed claim_uid=%s reason=devices-prepared-elsewhere", uid)
                self.undo.remove(uid)
                continue
            record.state = ClaimState.PREPARE_STARTED
            claims[uid] = record
        for uid in scan.damaged:
            claim = claims.setdefault(uid, PreparedClaim(state=ClaimState.PREPARE_STARTED))
            claim.sharing = [lost_sharing(uid)]
            if not claim.devices:
                log.error("event=undo-record-lost claim_uid=%s devices=unknown detail=only the MPS directory can "
                          "be undone; check the compute mode of the node's GPUs", uid)
        return rebuilt

    @staticmethod
    def _decode(raw: bytes) -> CheckpointData:
        """The journal's data, or :class:`~node_agent.host.statefile.StateFileProblem` saying why not."""
        _, body = statefile.decode(raw, VERSION)
        try:
            return CheckpointData.model_validate(body)
        except ValidationError as e:
            raise statefile.StateFileProblem(f"invalid content: {e.errors(include_url=False)[0]['msg']}") from e

    def save(self, data: CheckpointData) -> None:
        data.node_boot_id = self.boot_id
        raw = statefile.encode(data.model_dump(by_alias=True, mode="json"), VERSION)
        try:
            self._host.write_atomic(self.host_path, raw, mode=statefile.STATE_FILE_MODE)
        except HostError as e:
            raise CheckpointError("write the DRA checkpoint", self.host_path, e) from e
