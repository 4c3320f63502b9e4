"""The preflight's reads of the target cluster, through the same kubeconfig and context as the provider."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.client import ApiError, Kube
from nvidia_gpu.preflight.model import Conflict, ReadRefused


@dataclass
class KubeReader:
    """:class:`~nvidia_gpu.preflight.model.ClusterReader` over one API server connection."""

    kube: Kube

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            found = self.kube.get_or_none(api_version, kind, name, namespace)
        except ApiError as e:
            if e.status == 404:
                return None  # the kind is not served (its CRD is not installed)
            raise ReadRefused(f"get {kind} {name}: {e.status} {e.reason}: {e.message}") from None
        except OSError as e:
            raise ReadRefused(f"get {kind} {name}: {e}") from None
        return found if isinstance(found, dict) else None

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else {}
        try:
            return [o for o in self.kube.list(api_version, kind, namespace, **query) if isinstance(o, dict)]
        except ApiError as e:
            if e.status == 404:
                return []
            raise ReadRefused(f"list {kind}: {e.status} {e.reason}: {e.message}") from None
        except OSError as e:
            raise ReadRefused(f"list {kind}: {e}") from None


    def conflicts(self, obj: dict[str, Any], field_manager: str) -> builtins.list[Conflict]:
        try:
            self.kube.apply(obj, field_manager=field_manager, force=False, dry_run=True)
        except ApiError as e:
            if e.status == 409:
                return [Conflict(str(c.get("field", "")), _manager(str(c.get("message", ""))))
                        for c in e.details.get("causes") or [] if isinstance(c, dict)]
            raise ReadRefused(f"dry-run apply {obj.get('kind')} {obj.get('metadata', {}).get('name')}: "
                              f"{e.status} {e.reason}: {e.message}") from None
        except OSError as e:
            raise ReadRefused(f"dry-run apply {obj.get('kind')}: {e}") from None
        return []


def _manager(message: str) -> str:
    """The manager a conflict cause names: ``conflict with "pulumi-kubernetes-abc" using v1``."""
    _, _, rest = message.partition('"')
    name, _, _ = rest.partition('"')
    return name or message


def kubeconfig_with_context(files: Sequence[Path], context: str | None) -> tuple[Path, str | None] | None:
    """The kubeconfig file holding ``context`` (None: the first file's current context), as kubectl merges
    ``$KUBECONFIG``; None when no file is there (in-cluster, or a provider given its kubeconfig inline)."""
    for path in files:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(doc, dict):
            continue
        names = [c.get("name") for c in doc.get("contexts") or [] if isinstance(c, dict)]
        if context is None:
            if doc.get("current-context"):
                return path, None
        elif context in names:
            return path, context
    return None


def connect(files: Sequence[Path], context: str | None) -> Kube | None:
    """A connection as the provider makes it (kubeconfig file and context), or None when there is no file.

    The provider also reads ``kubernetes:kubeconfig`` from the stack config; that case has no file here
    and the preflight says it did not run."""
    found = kubeconfig_with_context(files, context)
    if found is None:
        return None
    path, ctx = found
    try:
        kube = Kube.from_kubeconfig(path, ctx)
    except Exception as e:  # the official loader raises its own types (ConfigException, exec plugin errors)
        raise ReadRefused(f"{path}: cannot use context {ctx or '(current)'}: {str(e).splitlines()[0]}") from None
    kube.timeout = 10.0  # a preview must not hang on an unreachable cluster; the provider then says so
    return kube
