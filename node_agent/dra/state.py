"""Prepare and unprepare under the node-wide lock, journalled so every step can be redone or undone.

``prepare`` follows NVIDIA's two-phase pattern: a claim already ``PrepareCompleted`` returns its recorded
devices; a claim left ``PrepareStarted`` by a crash is rolled back first; ``PrepareStarted`` is recorded
before any host change, and ``PrepareCompleted`` only once the CDI spec is written. A device already
prepared for another claim is refused (the driver is the last line of defence against double allocation:
scheduler races and force-deleted pods), including a full GPU whose MIG devices are in use and the
reverse; admin-access claims are exempt, as in Kubernetes. ``unprepare`` of an unknown claim succeeds.

Undo (unprepare, and the rollback of a prepare) succeeds only once the host is back as it was. A step that
fails (``nvidia-smi -c DEFAULT`` exiting non-zero, an MPS daemon that does not quit) fails the call: the
kubelet gets the claim's error and retries, and the journal keeps the claim, ``PrepareStarted`` and holding
only what is still changed, so the retry (or the next start) redoes just that, and its devices stay refused
to other claims meanwhile: the next tenant never gets a GPU still in a changed mode. A claim with sharing
is marked ``PrepareStarted`` before its first undo step, so a crash half way never leaves a
``PrepareCompleted`` entry for a half-undone claim. The claim's undo record (the second journal, see
``node_agent.dra.checkpoint``) follows the journal entry and goes only after everything is undone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from node_agent.dra import cdi, sharing
from node_agent.dra.checkpoint import (
    LOST_STRATEGY,
    AppliedSharing,
    CheckpointData,
    CheckpointError,
    CheckpointStore,
    ClaimState,
    Loaded,
    PreparedClaim,
    PreparedDevice,
    Recovery,
)
from node_agent.dra.claims import AllocatedClaim, ClaimRef, DeviceResult
from node_agent.dra.config import ConfigError, GpuSharing, effective_sharing, resolve
from node_agent.dra.devices import Allocatable, DeviceKind
from node_agent.dra.hostfs import HostPaths
from node_agent.host import HostError
from node_agent.host.atomic import LockTimeout, exclusive_lock

log = logging.getLogger(__name__)


class PrepareError(RuntimeError):
    """This claim cannot be prepared (or unprepared) now; the kubelet will retry it."""


class UndoError(PrepareError):
    """Some of the claim's host changes could not be undone; the claim stays recorded for the retry."""


@dataclass(frozen=True)
class ResultDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Deadline:
    """An absolute monotonic deadline with the clock that measures it (injected in tests)."""

    at: float
    clock: Callable[[], float] = time.monotonic

    def remaining(self) -> float:
        return self.at - self.clock()

    def check(self, what: str) -> None:
        if self.remaining() <= 0:
            raise PrepareError(f"deadline reached before {what}; the kubelet will retry")


def _request_base(request: str) -> str:
    """Kubelet reports request names without the ``/<subrequest>`` part."""
    return request.split("/", 1)[0]


class DeviceState:
    def __init__(self, *, driver: str, pool: str, host: HostPaths, backend: sharing.SharingBackend,
                 devices: Callable[[], Mapping[str, Allocatable]], state_dir: str,
                 lock_timeout: float = 10.0,
                 driver_edits: Callable[[], cdi.ContainerEdits | None] | None = None) -> None:
        self.driver = driver
        self.pool = pool
        self._host = host
        self._backend = backend
        self._devices = devices
        #: The driver's libraries, binaries and hooks for every spec (``node_agent.cdi.driveredits``).
        self._driver_edits = driver_edits or (lambda: None)
        self._store = CheckpointStore(host, f"{state_dir}/checkpoint.json")
        self._lock_host_path = f"{state_dir}/prepare.lock"
        self._lock_path = host.path(self._lock_host_path)
        self._lock_timeout = lock_timeout
        self.last_recovery: Loaded | None = None

    @contextlib.contextmanager
    def _locked(self, timeout: float) -> Iterator[None]:
        """The node-wide lock; a lock file that cannot be created is a :class:`CheckpointError` (naming it),
        a lock held too long stays :class:`LockTimeout`. Errors raised inside the block pass unchanged."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(exclusive_lock(self._lock_path, timeout))
            except LockTimeout:
                raise
            except OSError as e:
                raise CheckpointError("open the DRA lock", self._lock_host_path, e) from e
            yield

    # -- journal ---------------------------------------------------------------------------------------
    def _load(self) -> CheckpointData:
        loaded = self._store.load(lambda: cdi.scan_specs(self._host, self.driver), self.pool)
        if loaded.recovery in (Recovery.CORRUPTED, Recovery.REBOOT):
            self.last_recovery = loaded
            if loaded.recovery is Recovery.CORRUPTED:
                self._complete_rebuilt(loaded.data)
            self._store.save(loaded.data)
        return loaded.data

    def _complete_rebuilt(self, data: CheckpointData) -> None:
        """A journal rebuilt from CDI specs knows device names only: fill in what the overlap checks use
        (kind, UUIDs, CDI IDs) from the devices this node publishes, and the widest undo for a claim whose
        undo record was damaged (every full GPU's compute mode and time slice). Then every claim with
        sharing gets its undo record back, so the rebuilt journal is as protected as the one it replaces."""
        known = self._devices()
        for uid, claim in data.prepared_claims.items():
            for d in claim.devices:
                dev = known.get(d.device)
                if dev is not None and not d.physical_uuid:
                    d.kind, d.uuid, d.physical_uuid = dev.kind.value, dev.uuid, dev.physical_uuid
                if not d.cdi_device_ids:
                    d.cdi_device_ids = [cdi.device_id(self.driver, uid, d.device)]
            full = [d.uuid for d in claim.devices if d.kind == DeviceKind.GPU.value and d.uuid and not d.admin_access]
            for applied in claim.sharing:
                if applied.strategy == LOST_STRATEGY and not applied.compute_mode_changed:
                    applied.uuids, applied.compute_mode_changed, applied.timeslice_changed = full, full, list(full)
            if claim.sharing:
                self._store.undo.write(uid, claim)

    def snapshot(self) -> CheckpointData:
        """The journal as it is on disk (read-only use: status, tests, the background cleanup)."""
        with self._locked(self._lock_timeout):
            return self._load()

    def prepared_count(self) -> int:
        """Claims the journal holds as prepared (for the metrics; no lock, like :meth:`recorded_devices`)."""
        data = self._store.peek()
        return len(data.prepared_claims) if data else 0

    def recorded_devices(self, uid: str) -> set[str]:
        data = self._store.peek()
        claim = data.prepared_claims.get(uid) if data else None
        return {d.device for d in claim.devices} if claim else set()

    def startup(self) -> None:
        """Before serving: roll back half-done prepares (and unprepares), remove claim specs and undo records
        nobody records. Raises :class:`CheckpointError` when the state directory cannot be created or
        written; a rollback that fails is logged and kept for the next try, and start-up goes on."""
        self._store.ensure_directory()
        with self._locked(self._lock_timeout):
            data = self._load()
            for uid, claim in list(data.prepared_claims.items()):
                if claim.state is ClaimState.PREPARE_STARTED:
                    log.warning("event=rollback-on-start claim=%s/%s uid=%s", claim.namespace, claim.name, uid)
                    problems = self._undo(uid, claim)
                    if problems:
                        log.error("event=rollback-on-start-failed claim=%s/%s uid=%s problems=%s", claim.namespace,
                                  claim.name, uid, "; ".join(problems))
                        continue
                    self._store.undo.remove(uid)
                    del data.prepared_claims[uid]
            for spec in cdi.scan_specs(self._host, self.driver):
                if spec.claim_uid not in data.prepared_claims:
                    log.info("event=orphan-cdi-spec-removed claim_uid=%s", spec.claim_uid)
                    spec.path.unlink(missing_ok=True)
            recorded = {uid.replace("/", "_") for uid in data.prepared_claims}
            for stem in self._store.undo.files():
                if stem not in recorded:
                    # Written before the journal's PrepareStarted that never came: nothing was changed.
                    log.info("event=orphan-undo-record-removed claim_uid=%s", stem)
                    self._store.undo.remove(stem)
            self._store.save(data)

    # -- prepare ---------------------------------------------------------------------------------------
    def prepare(self, claim: AllocatedClaim, deadline: Deadline) -> list[ResultDevice]:
        """Prepare one claim; a journal that cannot be written fails this claim (:class:`PrepareError`
        naming the path and the OS error) with nothing of it left applied."""
        try:
            return self._prepare(claim, deadline)
        except CheckpointError as e:
            log.error("event=checkpoint-write-failed claim=%s uid=%s error=%s", claim.ref, claim.ref.uid, e)
            raise PrepareError(f"claim {claim.ref}: {e}; the kubelet will retry") from e

    def _prepare(self, claim: AllocatedClaim, deadline: Deadline) -> list[ResultDevice]:
        uid = claim.ref.uid
        deadline.check("taking the node lock")
        with self._locked(min(self._lock_timeout, max(deadline.remaining(), 0.0))):
            data = self._load()
            existing = data.prepared_claims.get(uid)
            if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
                return self._results(existing)
            if existing is not None:
                log.warning("event=rollback-half-prepared claim=%s uid=%s", claim.ref, uid)
                problems = self._undo(uid, existing)
                if problems:
                    self._keep_for_retry(uid, existing, data)
                    raise UndoError(f"claim {claim.ref}: cannot roll back its unfinished prepare: "
                                    f"{'; '.join(problems)}; the kubelet will retry")
                self._forget(uid, data)
            known = self._devices()
            gone = [r.device for r in claim.results if r.device not in known]
            if gone:
                raise PrepareError(f"claim {claim.ref}: device {', '.join(gone)} is not available on this node now "
                                   "(withdrawn as unhealthy, or reconfigured)")
            devices = [(r, known[r.device]) for r in claim.results]
            self._refuse_overlaps(claim, devices, data)
            groups = self._sharing_groups(claim, devices)
            deadline.check("changing the host")
            record, per_device = self._plan(claim, devices, groups)
            missing = cdi.missing_device_nodes(self._host, per_device)
            if missing:
                raise PrepareError(f"claim {claim.ref}: device nodes not on the host yet: {', '.join(missing)} "
                                   "(is the NVIDIA driver loaded?); the kubelet will retry")
            if record.sharing:
                # Journal the intent before the first host change, so a crash mid-way is rolled back. A
                # claim without sharing changes only writes its CDI spec, and a spec nobody records is
                # removed on the next start, so it needs no PrepareStarted entry (one journal write saved).
                # The undo record goes first: one the journal does not hold changed nothing.
                self._store.undo.write(uid, record)
                data.prepared_claims[uid] = record
                try:
                    self._store.save(data)
                except CheckpointError:
                    with contextlib.suppress(CheckpointError):
                        self._store.undo.remove(uid)
                    raise
            try:
                for (_cfg_key, (gsharing, gdevices)), applied in zip(groups.items(), record.sharing, strict=True):
                    deadline.check("applying sharing")
                    sharing.apply(self._backend, self._host, uid, record=applied, sharing=gsharing, devices=gdevices)
                control = [n for n in cdi.CONTROL_NODES if self._host.exists(n)]
                spec = cdi.build_spec(self.driver, uid, str(claim.ref), per_device, control,
                                      driver_edits=self._driver_edits())
                cdi.write_spec(self._host, self.driver, uid, spec)
                record.state = ClaimState.PREPARE_COMPLETED
                data.prepared_claims[uid] = record
                self._store.save(data)
            except Exception as e:
                log.error("event=prepare-failed claim=%s uid=%s error=%s", claim.ref, uid, e)
                problems = self._undo(uid, record)
                retry = "; the kubelet will retry" if isinstance(e, CheckpointError) or problems else ""
                if problems:
                    self._keep_for_retry(uid, record, data)
                    raise UndoError(f"claim {claim.ref}: {e}; rolling it back failed: {'; '.join(problems)}"
                                    f"{retry}") from e
                if uid in data.prepared_claims:
                    try:
                        self._forget(uid, data)
                    except CheckpointError as save_error:
                        # The journal still says PrepareStarted: rolled back again, harmlessly, on the next
                        # prepare of this claim or the next start.
                        log.error("event=checkpoint-write-failed claim=%s uid=%s error=%s", claim.ref, uid,
                                  save_error)
                raise PrepareError(f"claim {claim.ref}: {e}{retry}") from e
            log.info("event=claim-prepared claim=%s uid=%s devices=%s", claim.ref, uid,
                     ",".join(d.device for d in record.devices))
            return self._results(record)

    def _refuse_overlaps(self, claim: AllocatedClaim, devices: Sequence[tuple[DeviceResult, Allocatable]],
                         data: CheckpointData) -> None:
        for result, dev in devices:
            if result.admin_access:
                continue
            for other_uid, other in data.prepared_claims.items():
                if other_uid == claim.ref.uid:
                    continue
                for od in other.devices:
                    if od.admin_access:
                        continue
                    same = od.device == dev.name
                    nested = (od.physical_uuid == dev.physical_uuid and od.physical_uuid != ""
                              and DeviceKind.GPU.value in (od.kind, dev.kind.value))
                    if same or nested:
                        raise PrepareError(
                            f"claim {claim.ref}: device {dev.name} is already prepared for claim "
                            f"{other.namespace}/{other.name} (uid {other_uid})"
                            + ("" if same else f" through {od.device} on the same GPU")
                        )

    def _sharing_groups(self, claim: AllocatedClaim, devices: Sequence[tuple[DeviceResult, Allocatable]]
                        ) -> dict[str, tuple[GpuSharing, list[Allocatable]]]:
        """Devices that share one effective sharing config are set up together (one MPS daemon)."""
        groups: dict[str, tuple[GpuSharing, list[Allocatable]]] = {}
        for result, dev in devices:
            try:
                cfg = resolve(claim.configs, self.driver, result.request, dev.kind)
                eff = effective_sharing(cfg)
            except ConfigError as e:
                raise PrepareError(f"claim {claim.ref}: {e}") from e
            if eff is None:
                continue
            key = json.dumps(eff.model_dump(mode="json"), sort_keys=True)
            groups.setdefault(key, (eff, []))[1].append(dev)
        return groups

    def _plan(self, claim: AllocatedClaim, devices: Sequence[tuple[DeviceResult, Allocatable]],
              groups: Mapping[str, tuple[GpuSharing, list[Allocatable]]]
              ) -> tuple[PreparedClaim, list[cdi.ClaimDevice]]:
        uid = claim.ref.uid
        plans = [(sharing.plan(uid, gdevs, gsharing), gdevs) for gsharing, gdevs in groups.values()]
        if sum(1 for p, _ in plans if p.record.mps_directory) > 1:
            raise PrepareError(f"claim {claim.ref}: at most one MPS configuration per claim")
        edits_for = {d.name: p.edits for p, gdevs in plans for d in gdevs}
        requests: dict[str, list[str]] = {}
        for result, dev in devices:
            requests.setdefault(dev.name, []).append(_request_base(result.request))
        per_device: list[cdi.ClaimDevice] = []
        prepared: list[PreparedDevice] = []
        seen: set[str] = set()
        for result, dev in devices:
            if dev.name in seen:
                continue
            seen.add(dev.name)
            reqs = tuple(dict.fromkeys(requests[dev.name]))
            per_device.append(cdi.ClaimDevice(dev, reqs, edits_for.get(dev.name, cdi.SharingEdits())))
            prepared.append(PreparedDevice(
                requests=list(reqs), pool=self.pool, device=dev.name,
                cdi_device_ids=[cdi.device_id(self.driver, uid, dev.name)], kind=dev.kind.value, uuid=dev.uuid,
                physical_uuid=dev.physical_uuid, admin_access=bool(result.admin_access),
            ))
        record = PreparedClaim(state=ClaimState.PREPARE_STARTED, namespace=claim.ref.namespace, name=claim.ref.name,
                               devices=prepared, sharing=[p.record for p, _ in plans],
                               cdi_spec=cdi.spec_path(self.driver, uid))
        return record, per_device

    @staticmethod
    def _results(record: PreparedClaim) -> list[ResultDevice]:
        return [ResultDevice(tuple(d.requests), d.pool, d.device, tuple(d.cdi_device_ids)) for d in record.devices]

    def _undo(self, uid: str, record: PreparedClaim) -> list[str]:
        """Undo what ``record`` says the claim changed: its CDI spec, then each sharing change. ``record``
        is left holding what is still changed (``PrepareStarted`` if anything is); the problems are
        returned, none when the host is back as it was. The spec goes first: a journal rebuilt from the
        specs takes a claim with a spec for fully prepared, which stays true only if no sharing change is
        undone while its spec is still there."""
        problems: list[str] = []
        try:
            cdi.delete_spec(self._host, self.driver, uid)
        except HostError as e:
            log.warning("event=cdi-spec-delete-failed claim_uid=%s error=%s", uid, e)
            problems.append(f"delete the CDI spec: {e}")
        left: list[AppliedSharing] = []
        for applied in record.sharing:
            outcome = sharing.undo(self._backend, self._host, uid, AppliedSharing.model_validate(applied))
            problems += outcome.problems
            if outcome.remaining is not None:
                left.append(outcome.remaining)
        record.sharing = left
        if problems:
            record.state = ClaimState.PREPARE_STARTED
        return problems

    def _keep_for_retry(self, uid: str, record: PreparedClaim, data: CheckpointData) -> None:
        """Journal what is still changed after a failed undo, so the retry redoes only that. The undo
        record follows (best effort: an older, larger one is as good, since undo is idempotent)."""
        data.prepared_claims[uid] = record
        self._store.save(data)
        try:
            self._store.undo.write(uid, record)
        except CheckpointError as e:
            log.warning("event=undo-record-write-failed claim_uid=%s error=%s", uid, e)

    def _forget(self, uid: str, data: CheckpointData) -> None:
        """Drop a fully undone claim: its undo record first (if it has one), then the journal entry (see the
        checkpoint's ordering rule)."""
        self._store.undo.remove(uid)
        del data.prepared_claims[uid]
        self._store.save(data)

    # -- unprepare -------------------------------------------------------------------------------------
    def unprepare(self, ref: ClaimRef, deadline: Deadline) -> None:
        """Unprepare one claim; raises :class:`UndoError` (naming what could not be undone) while the host is
        not back as it was, and :class:`PrepareError` when the journal cannot be written."""
        deadline.check("taking the node lock")
        try:
            self._unprepare(ref, deadline)
        except CheckpointError as e:
            log.error("event=checkpoint-write-failed claim=%s uid=%s error=%s", ref, ref.uid, e)
            raise PrepareError(f"claim {ref}: {e}; the kubelet will retry") from e

    def _unprepare(self, ref: ClaimRef, deadline: Deadline) -> None:
        with self._locked(min(self._lock_timeout, max(deadline.remaining(), 0.0))):
            data = self._load()
            record = data.prepared_claims.get(ref.uid)
            if record is None:
                log.info("event=unprepare-unknown-claim claim=%s uid=%s", ref, ref.uid)
                return
            if record.sharing and record.state is ClaimState.PREPARE_COMPLETED:
                # From here the claim is never handed out as prepared, whatever happens to this call.
                record.state = ClaimState.PREPARE_STARTED
                self._store.save(data)
            had_sharing = bool(record.sharing)
            problems = self._undo(ref.uid, record)
            if problems:
                self._keep_for_retry(ref.uid, record, data)
                log.error("event=unprepare-failed claim=%s uid=%s problems=%s", ref, ref.uid, "; ".join(problems))
                raise UndoError(f"claim {ref}: cannot undo {'; '.join(problems)}; the claim stays prepared on "
                                "this node and the kubelet will retry")
            if had_sharing:
                self._store.undo.remove(ref.uid)
            del data.prepared_claims[ref.uid]
            self._store.save(data)
            log.info("event=claim-unprepared claim=%s uid=%s", ref, ref.uid)
