"""Rollback journal: what a feature changed on the host, so rollback restores it byte for byte.

Before the first change to a host file, the journal copies the original (or notes that there was
none) under ``/var/lib/nvidia-gpu-agent/rollback/<feature>/`` and records directories it is about to
create. The manifest is written atomically *before* the change, so a crash between the two still
rolls back correctly. Re-applying never overwrites a recorded original: the journal always holds
the state from before the first apply. Nothing of the journal lives in ``/etc``.

A whole-file copy is right for a file the feature owns (its drop-in), not for one it only adds to (an
``imports`` entry in containerd's ``config.toml``): restoring that copy would throw away every edit others
made to the file after apply. For those the journal records the edit instead (:meth:`Journal.record_added_item`:
the item, and the key's text before and after), so rollback can take out exactly that item and keep the rest
as it is now. It also remembers a digest of each version of a file it wrote (:meth:`Journal.wrote`), so a
later change by someone else to a file of ours is told apart from our own rewrite (:meth:`Journal.changed_by_others`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, ValidationError

from node_agent.host import HostError, HostRoot


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the agent's own file: read leniently
    path: str
    existed: bool
    mode: int = 0o644
    content_b64: str = ""

    @property
    def content(self) -> bytes:
        """The file as it was before the first change (empty when it did not exist)."""
        return base64.b64decode(self.content_b64)


#: A whole-file record, as :meth:`Journal.forget` hands it back.
Recorded = _Entry


class AddedItem(BaseModel):
    """An item the feature added to a TOML list (``key``) in a file it does not own (``path``)."""

    model_config = ConfigDict(extra="ignore")
    path: str
    key: str
    item: str
    #: The key's text before the change; None: the file had no such key.
    before: str | None = None
    #: The key's text as the feature wrote it; None: not known (journals of earlier versions).
    after: str | None = None


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: int = 1
    files: list[_Entry] = []
    created_dirs: list[str] = []
    added_items: list[AddedItem] = []
    #: host path -> sha256 of each version of it the feature wrote (oldest first).
    written: dict[str, list[str]] = {}


def _digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@dataclass
class Journal:
    host: HostRoot
    feature: str
    _manifest: _Manifest = field(init=False)

    def __post_init__(self) -> None:
        self._manifest = self._load()

    @property
    def manifest_path(self) -> str:
        return self.host.state_path("rollback", self.feature, "manifest.json")

    def _load(self) -> _Manifest:
        text = self.host.read_text_or_none(self.manifest_path)
        if text is None:
            return _Manifest()
        try:
            return _Manifest.model_validate_json(text)
        except ValidationError as e:
            raise HostError(f"rollback journal {self.manifest_path} is unreadable: {e}", self.manifest_path) from e

    def _save(self) -> None:
        self.host.write_atomic(self.manifest_path, self._manifest.model_dump_json(indent=1), mode=0o600)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(e.path for e in self._manifest.files)

    def record(self, host_path: str) -> None:
        """Remember ``host_path`` as it is now, unless it is already recorded."""
        if host_path in self.paths:
            return
        local = self.host.path(host_path)
        entry = _Entry(path=host_path, existed=local.is_file())
        if entry.existed:
            entry.mode = local.stat().st_mode & 0o777
            entry.content_b64 = base64.b64encode(self.host.read_bytes(host_path)).decode()
        parent = PurePosixPath(host_path).parent
        missing: list[str] = []
        while not self.host.exists(str(parent)):
            missing.append(str(parent))
            parent = parent.parent
        self._manifest.files.append(entry)
        self._manifest.created_dirs.extend(d for d in missing if d not in self._manifest.created_dirs)
        self._save()

    def record_added_item(self, path: str, key: str, item: str, *, before: str | None, after: str) -> None:
        """Remember that ``item`` was added to the list ``key`` of ``path``, the key's text ``before`` (None:
        there was no such key) and ``after``; saved before the caller changes the file, so a crash in between
        still rolls back. An item already recorded keeps its first record (the state before the first apply)."""
        if any((a.path, a.key, a.item) == (path, key, item) for a in self._manifest.added_items):
            return
        self._manifest.added_items.append(AddedItem(path=path, key=key, item=item, before=before, after=after))
        self._save()

    def added_items(self, path: str) -> list[AddedItem]:
        return [a for a in self._manifest.added_items if a.path == path]

    def wrote(self, path: str, data: bytes | str) -> None:
        """Remember ``data`` as a version of ``path`` the feature wrote. Called before the write: a crash
        between the two leaves a digest that matches nothing, never a write of ours that looks foreign."""
        digests = self._manifest.written.setdefault(path, [])
        if _digest(data) not in digests:
            digests.append(_digest(data))
            self._save()

    def changed_by_others(self, path: str, data: bytes | str) -> bool:
        """Whether ``data``, the content of ``path`` now, is none of the versions the feature wrote. False when
        the journal knows no version of it (a file written by an earlier version or by the bash scripts)."""
        digests = self._manifest.written.get(path, [])
        return bool(digests) and _digest(data) not in digests

    def forget(self, path: str) -> Recorded | None:
        """Take ``path``'s whole-file record out (the caller undoes that change itself) and hand it back. Only
        in memory until :meth:`restore` removes the manifest: a rollback that stops half-way finds it again."""
        for entry in self._manifest.files:
            if entry.path == path:
                self._manifest.files.remove(entry)
                return entry
        return None

    def restore(self) -> list[str]:
        """Put every recorded file back; returns the paths that changed. The journal is then empty."""
        changed: list[str] = []
        for entry in reversed(self._manifest.files):
            if entry.existed:
                if self.host.write_atomic(entry.path, entry.content, mode=entry.mode):
                    changed.append(entry.path)
            elif self.host.remove(entry.path):
                changed.append(entry.path)
        for d in sorted(self._manifest.created_dirs, key=len, reverse=True):
            local = self.host.path(d)
            if local.is_dir() and not any(local.iterdir()):
                local.rmdir()
        self.host.remove(self.manifest_path)
        self._manifest = _Manifest()
        return changed

    def summary(self) -> str:
        return json.dumps([e.path for e in self._manifest.files])
