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

log = logging.getLogger(__name__)

VERSION = 1


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
    """What a sharing strategy changed on the host, so unprepare can undo exactly that."""

    strategy: str
    uuids: list[str] = []
    compute_mode_changed: list[str] = Field(default=[], alias="computeModeChanged")
    timeslice_changed: list[str] = Field(default=[], alias="timesliceChanged")
    mps_directory: str = Field(default="", alias="mpsDirectory")


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




class CheckpointStore:
    """Reads and writes the journal file; callers serialise access with the node-wide lock."""

    def __init__(self, host: HostPaths, path: str) -> None:
        self._file = host.path(path)
        self._host = host
        self.host_path = path
        self.boot_id = boot_id(host)

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
        """Read the journal; on corruption rebuild it from ``specs()`` (claim CDI files still on disk)."""
        try:
            raw = self._host.read_bytes_or_none(self.host_path)
        except HostError as e:
            raise CheckpointError("read the DRA checkpoint", self.host_path, e) from e
        if raw is None:
            return Loaded(CheckpointData(node_boot_id=self.boot_id), Recovery.MISSING)
        try:
            data = self._decode(raw)
        except statefile.StateFileProblem as e:
            problem = str(e)
        else:
            if data.node_boot_id != self.boot_id:
                log.warning("event=checkpoint-discarded reason=reboot old_boot_id=%s boot_id=%s claims=%d",
                            data.node_boot_id, self.boot_id, len(data.prepared_claims))
                return Loaded(CheckpointData(node_boot_id=self.boot_id), Recovery.REBOOT,
                              f"boot ID changed from {data.node_boot_id} to {self.boot_id}")
            return Loaded(data, Recovery.NONE)
        aside = self._file.with_name(self._file.name + ".corrupt")
        try:
            os.replace(self._file, aside)
        except OSError as e:
            raise CheckpointError("keep the corrupted DRA checkpoint aside as", f"{self.host_path}.corrupt", e) from e
        rebuilt = CheckpointData(node_boot_id=self.boot_id)
        for spec in specs() if specs else []:
            namespace, _, name = spec.claim.partition("/")
            rebuilt.prepared_claims[spec.claim_uid] = PreparedClaim(
                state=ClaimState.PREPARE_COMPLETED, namespace=namespace, name=name, cdi_spec=str(spec.path),
                devices=[PreparedDevice(device=d, pool=pool) for d in spec.device_names],
            )
        log.error("event=checkpoint-corrupted file=%s problem=%s kept_as=%s rebuilt_claims=%d",
                  self._file, problem, aside, len(rebuilt.prepared_claims))
        self.save(rebuilt)
        return Loaded(rebuilt, Recovery.CORRUPTED, problem)

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
