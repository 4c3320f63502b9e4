"""Rollback journal: what a feature changed on the host, so rollback restores it byte for byte.

Before the first change to a host file, the journal copies the original (or notes that there was
none) under ``/var/lib/nvidia-gpu-agent/rollback/<feature>/`` and records directories it is about to
create. The manifest is written atomically *before* the change, so a crash between the two still
rolls back correctly. Re-applying never overwrites a recorded original: the journal always holds
the state from before the first apply. Nothing of the journal lives in ``/etc``.
"""

from __future__ import annotations

import base64
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


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: int = 1
    files: list[_Entry] = []
    created_dirs: list[str] = []


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

    def restore(self) -> list[str]:
        """Put every recorded file back; returns the paths that changed. The journal is then empty."""
        changed: list[str] = []
        for entry in reversed(self._manifest.files):
            if entry.existed:
                if self.host.write_atomic(entry.path, base64.b64decode(entry.content_b64), mode=entry.mode):
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
