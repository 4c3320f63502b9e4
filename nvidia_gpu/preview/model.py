"""The preview's typed values: what was registered, what was rendered, what went wrong.

These are the contract between steps: the policy-analysis step reads ``PreviewResult.resources``
(every registration with its type token, name, parent and inputs, exactly as the engine saw them).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nvgpu.stackconfig import StackConfig
from nvidia_gpu.sdk.runtime import Registration

PROVIDER_PREFIX = "pulumi:providers:"
KUBERNETES_PREFIX = "kubernetes:"


class Closeable(Protocol):
    def close(self) -> None: ...


@dataclass(frozen=True)
class RecordedResource(Registration):
    """One ``RegisterResource`` call as the engine received it (the adapter's :class:`Registration`), its inputs
    in camelCase with numbers normalised and its dependencies sorted, as the preview's steps and the policies
    read it."""

    @property
    def is_component(self) -> bool:
        return not self.custom

    @property
    def is_provider(self) -> bool:
        return self.type_token.startswith(PROVIDER_PREFIX)

    @property
    def is_kubernetes_object(self) -> bool:
        """A resource the Kubernetes provider turns into one API object (patches included)."""
        return self.custom and self.type_token.startswith(KUBERNETES_PREFIX) and "kind" in self.inputs

    @property
    def is_patch(self) -> bool:
        return self.is_kubernetes_object and self.type_token.endswith("Patch")

    def as_json(self) -> dict[str, Any]:
        return {
            "type": self.type_token,
            "name": self.name,
            "urn": self.urn,
            "parent": self.parent_urn,
            "custom": self.custom,
            "provider": self.provider,
            "dependencies": list(self.dependencies),
            "retainOnDelete": self.retain_on_delete,
            "deleteBeforeReplace": self.delete_before_replace,
            "ignoreChanges": list(self.ignore_changes),
            "inputs": self.inputs,
        }


@dataclass(frozen=True)
class RenderedManifest:
    """One Kubernetes object as written to ``manifests/NNN-<kind>-<name>.yaml``."""

    order: int
    filename: str
    object: dict[str, Any]
    resource: RecordedResource
    patch: bool = False

    @property
    def kind(self) -> str:
        return str(self.object["kind"])

    @property
    def api_version(self) -> str:
        return str(self.object["apiVersion"])

    @property
    def name(self) -> str:
        return str(self.object.get("metadata", {}).get("name", ""))

    @property
    def namespace(self) -> str | None:
        ns = self.object.get("metadata", {}).get("namespace")
        return str(ns) if ns is not None else None


@dataclass(frozen=True)
class Problem:
    """Something that makes the preview fail; ``subject`` names the config path, resource or file."""

    step: str
    subject: str
    message: str

    def __str__(self) -> str:
        return f"[{self.step}] {self.subject}: {self.message}"


@dataclass
class PreviewResult:
    """Filled in step by step; a step that finds problems stops the steps that depend on it."""

    project: str
    stack: str
    project_dir: Path
    out_dir: Path
    stack_file: Path
    engine_config: dict[str, str] = field(default_factory=dict)
    config: StackConfig | None = None
    resources: tuple[RecordedResource, ...] = ()
    manifests: tuple[RenderedManifest, ...] = ()
    problems: list[Problem] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    #: I/O a step left running (file writes); the pipeline waits for all of it before returning.
    background: list[Future[None]] = field(default_factory=list)
    #: Called with each resource as the program registers it (a step may start work early).
    listeners: list[Callable[[RecordedResource], None]] = field(default_factory=list)
    #: Work a step hands to a later one (the background validator); closed when the pipeline ends.
    handoff: dict[str, Closeable] = field(default_factory=dict)
    #: Blocks of text later steps add to the terminal report, printed after the resource tree (like
    #: ``pulumi preview``'s ``Policies:`` section).
    report_sections: list[str] = field(default_factory=list)
    #: The server dry-run: ``auto`` (a throwaway control plane when built), ``off``, or ``kubeconfig``
    #: with :attr:`server_kubeconfig` (the user's cluster).
    server_mode: str = "auto"
    server_kubeconfig: Path | None = None
    server_context: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def parent_of(self, resource: RecordedResource) -> RecordedResource | None:
        by_urn = {r.urn: r for r in self.resources}
        return by_urn.get(resource.parent_urn or "")
