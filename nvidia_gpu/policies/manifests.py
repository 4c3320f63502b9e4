"""Defensive readers over Kubernetes manifests as a policy sees them.

The analyzer hands policies the resource's checked *inputs*: camelCase manifests with ``apiVersion``
and ``kind``, wrapped in pulumi-policy's unknown-checking proxies (``Mapping``/``Sequence``, never
``dict``/``list``), with every number turned into a float by the protobuf ``Struct``. Every reader
here accepts anything and falls back to empty values, so a rule never crashes on a partial manifest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from nvgpu import yamltext

EMPTY: Mapping[str, Any] = {}

#: Workload kinds whose pod template sits at ``spec.template.spec``.
_TEMPLATE_KINDS = frozenset({"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job", "ReplicationController"})
_CONTAINER_SECTIONS = ("initContainers", "containers", "ephemeralContainers")


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else EMPTY


def as_list(value: Any) -> Sequence[Any]:
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return value
    return ()


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    """Integers arrive as floats through ``google.protobuf.Struct``; accept integral floats only."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


@dataclass(frozen=True)
class Kind:
    """A manifest's ``apiVersion`` and ``kind``, e.g. ``apps/v1`` / ``DaemonSet``."""

    api_version: str
    kind: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0] if "/" in self.api_version else ""


def kind_of(resource_type: str, props: Mapping[str, Any]) -> Kind | None:
    """The Kubernetes kind of a resource, or ``None`` for anything that is not a Kubernetes object.

    The manifest's own ``apiVersion``/``kind`` win; the type token (``kubernetes:apps/v1:DaemonSet``,
    ``kubernetes:deckhouse.io/v1alpha1:NodeGroupConfiguration``) is the fallback.
    """
    if not resource_type.startswith("kubernetes:"):
        return None
    api_version = as_str(props.get("apiVersion"))
    kind = as_str(props.get("kind"))
    if api_version and kind:
        return Kind(api_version, kind)
    parts = resource_type.split(":")
    if len(parts) != 3:
        return None
    module, kind_token = parts[1], parts[2]
    group_version = module.removeprefix("core/")
    return Kind(api_version or group_version, kind or kind_token)


def metadata(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(props.get("metadata"))


def name_of(props: Mapping[str, Any], default: str = "") -> str:
    return as_str(metadata(props).get("name")) or default


def labels_of(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(metadata(props).get("labels"))


def annotations_of(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(metadata(props).get("annotations"))


def pod_spec(kind: Kind, props: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec of a workload (DaemonSet, Deployment, Job, CronJob, Pod, ...) or ``None``."""
    spec = as_map(props.get("spec"))
    if kind.kind == "Pod":
        return spec
    if kind.kind in _TEMPLATE_KINDS:
        return as_map(as_map(spec.get("template")).get("spec"))
    if kind.kind == "CronJob":
        job = as_map(as_map(spec.get("jobTemplate")).get("spec"))
        return as_map(as_map(job.get("template")).get("spec"))
    return None


def pod_labels(kind: Kind, props: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = as_map(props.get("spec"))
    if kind.kind in _TEMPLATE_KINDS:
        return as_map(as_map(as_map(spec.get("template")).get("metadata")).get("labels"))
    return labels_of(props)


@dataclass(frozen=True)
class Container:
    section: str  #: ``containers``, ``initContainers`` or ``ephemeralContainers``
    name: str
    spec: Mapping[str, Any]

    @property
    def where(self) -> str:
        return f"{self.section[:-1]} {self.name!r}" if self.section != "containers" else f"container {self.name!r}"


def containers(spec: Mapping[str, Any]) -> Iterator[Container]:
    for section in _CONTAINER_SECTIONS:
        for i, c in enumerate(as_list(spec.get(section))):
            c_map = as_map(c)
            yield Container(section, as_str(c_map.get("name")) or f"#{i}", c_map)


def workload_role(kind: Kind, props: Mapping[str, Any]) -> str:
    """The agent role a workload plays: ``app.kubernetes.io/component``, else its name labels, else its name."""
    for source in (labels_of(props), pod_labels(kind, props)):
        for key in ("app.kubernetes.io/component", "app.kubernetes.io/name", "app"):
            value = as_str(source.get(key))
            if value:
                return value
    return name_of(props)


@lru_cache(maxsize=512)
def _parse_yaml(text: str) -> Any:
    """A ConfigMap value as a document, or None; bounded (no aliases, size and depth limits), as the agents
    read these configs, so a crafted value cannot crash or exhaust the policy pack."""
    try:
        return yamltext.load(text, "ConfigMap data")
    except yamltext.YamlLoadError:
        return None


def config_documents(props: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each ``data`` value of a ConfigMap that parses as a YAML/JSON mapping, with its key.

    Parsed documents are cached by text and shared: callers must not modify them.
    """
    for key, value in as_map(props.get("data")).items():
        text = as_str(value)
        if text is None or ":" not in text:
            continue
        doc = _parse_yaml(text)
        if isinstance(doc, Mapping):
            yield str(key), doc


@dataclass(frozen=True)
class Resource:
    """One Kubernetes object of the stack, as a stack policy (or the offline client) sees it."""

    type: str
    urn: str
    props: Mapping[str, Any]
    kind: Kind

    @property
    def name(self) -> str:
        return name_of(self.props, self.urn.rsplit("::", 1)[-1])

    @property
    def title(self) -> str:
        """``DaemonSet 'nvidia-gpu/device-plugin-h100'`` — how violations name an object."""
        ns = as_str(metadata(self.props).get("namespace"))
        return f"{self.kind.kind} {(ns + '/' if ns else '') + self.name!r}"


def kubernetes_resources(items: Iterator[tuple[str, str, Mapping[str, Any]]]) -> list[Resource]:
    """Keep the Kubernetes objects of ``(type, urn, props)`` triples, with their kinds resolved."""
    out = []
    for resource_type, urn, props in items:
        kind = kind_of(resource_type, props)
        if kind is not None:
            out.append(Resource(resource_type, urn, props, kind))
    return out
