"""Step 4: validate every manifest against the Kubernetes OpenAPI schema of the stack's version, strictly.

Built-in kinds use kubernetes-validate's ``-strict`` schemas for the stack's minor version (unknown
fields are errors); custom resources use their CRD's schema (:mod:`nvidia_gpu.preview.crds`). Schemas are loaded
once and compiled validators are reused, so a manifest costs well under a millisecond; every error of
a manifest is reported, not just the first, each with its JSON path. For large stacks
(:data:`PARALLEL_MIN_GROUPS`) the ``validate-start`` step starts a worker process that validates each
object as the program registers it, on another core; ``validate`` then only collects the answers.
"""

from __future__ import annotations

import multiprocessing
import re
from functools import cache
from multiprocessing.queues import Queue
from typing import Any

import jsonschema
import kubernetes_validate.utils as kv
from jsonschema._utils import equal
from referencing import Registry, Resource

from nvidia_gpu.preview import crds
from nvidia_gpu.preview.model import PreviewResult, Problem, RecordedResource, RenderedManifest
from nvidia_gpu.preview.render import manifest_object

STEP = "validate"


_load_schema = kv.schema_contents


@cache
def _schema(filename: str, version: str) -> Any:
    return _load_schema(filename, version)


# kubernetes-validate re-reads the 8 MB definitions file on every call; share the cached loader with it.
kv.schema_contents = _schema


@cache
def schema_dir(kubernetes_version: str) -> str:
    """The newest schema set that is not newer than the stack's version (kubernetes-validate's rule)."""
    wanted = tuple(int(p) for p in kubernetes_version.split(".")[:2])
    candidates = [v for v in kv.all_versions() if tuple(int(p) for p in kv.major_minor(v).split(".")) <= wanted]
    if not candidates:
        raise kv.VersionNotSupportedError(version=kubernetes_version)
    return f"v{candidates[-1]}-local-strict"


#: Keywords whose values are data, not schemas: never rewrite ``$ref``-looking content inside them.
_LITERAL_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required"})


def inline_refs(node: Any, defs: dict[str, Any], memo: dict[str, Any], active: frozenset[str] = frozenset()) -> Any:
    """``node`` with every ``$ref`` into the definitions replaced by the definition itself.

    Resolving references is most of jsonschema's time on these schemas; inlining them once per kind
    makes each validation about 40% cheaper. Recursive definitions keep their ``$ref`` (the registry
    still resolves those), and a reference with sibling keywords becomes ``allOf`` so they still apply.
    """
    if isinstance(node, list):
        return [inline_refs(item, defs, memo, active) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and "#/$defs/" in ref:
        name = ref.rsplit("/", 1)[-1]
        if name in active or name not in defs:
            return node
        if name not in memo:
            memo[name] = inline_refs(defs[name], defs, memo, active | {name})
        rest = {k: v for k, v in node.items() if k not in ("$ref", "description")}
        return {**inline_refs(rest, defs, memo, active), "allOf": [memo[name]]} if rest else memo[name]
    return {k: v if k in _LITERAL_KEYWORDS else inline_refs(v, defs, memo, active) for k, v in node.items()}


@cache
def _inlined_definitions(kubernetes_version: str) -> dict[str, Any]:
    """The memo shared by every kind of one schema set (a definition is inlined once)."""
    return {}


@cache
def builtin_validator(kubernetes_version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    directory = schema_dir(kubernetes_version)
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = _schema(f"kubernetes-json-schema/{directory}/{kind.lower()}-{group_version}.json", kubernetes_version)
    except FileNotFoundError:
        return None
    definitions = _schema(f"kubernetes-json-schema/{directory}/_definitions.json", kubernetes_version)
    registry: Registry[Any] = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    inlined = inline_refs(schema, definitions["$defs"], _inlined_definitions(directory))
    # A recursive definition keeps its ``#/$defs/...`` reference (a CRD's JSONSchemaProps), which resolves
    # against the kind's own document: give that document the definitions.
    inlined = {**inlined, "$defs": definitions["$defs"]}
    result: jsonschema.protocols.Validator = jsonschema.Draft202012Validator(inlined, registry=registry)
    return result


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".") or "(root)"


class _Unsupported(Exception):
    """A schema keyword :func:`quick_valid` does not implement: jsonschema decides."""


#: Draft 2020-12 keywords :func:`quick_valid` implements exactly as jsonschema does (``format`` is an
#: annotation there too: no format checker is configured). Any other keyword jsonschema knows defers to it.
_QUICK = frozenset({
    "type", "properties", "additionalProperties", "items", "required", "enum", "const", "pattern", "format",
    "minimum", "maximum", "minItems", "maxItems", "minLength", "maxLength", "oneOf", "anyOf", "allOf",
})
#: Per validator class (drafts whose integers include 1.0 and whose other keywords above mean the same):
#: the keywords that class knows and :func:`quick_valid` leaves to it.
DEFERRED: dict[type[Any], frozenset[str]] = {
    cls: frozenset(cls.VALIDATORS) - _QUICK
    for cls in (jsonschema.Draft7Validator, jsonschema.Draft201909Validator, jsonschema.Draft202012Validator)
}
_pattern = cache(re.compile)


def _is_type(instance: Any, name: str) -> bool:
    if name == "object":
        return isinstance(instance, dict)
    if name == "string":
        return isinstance(instance, str)
    if name == "array":
        return isinstance(instance, list)
    if name == "boolean":
        return isinstance(instance, bool)
    if name == "null":
        return instance is None
    if isinstance(instance, bool) or not isinstance(instance, int | float):
        return False
    if name == "number":
        return True
    if name == "integer":
        return isinstance(instance, int) or instance.is_integer()
    raise _Unsupported(name)


def quick_valid(
    schema: Any, instance: Any, deferred: frozenset[str] = DEFERRED[jsonschema.Draft202012Validator]
) -> bool:
    """Whether ``instance`` is valid under ``schema``, for the keywords of Kubernetes' schemas; fast.

    jsonschema builds a validator and a reference resolver for every subschema it descends into, which
    is most of a manifest's validation time. Valid manifests (nearly all of them) only need a yes: this
    answers it in plain Python, and raises :class:`_Unsupported` for any keyword it does not implement,
    so jsonschema still decides those, and still writes every error message. ``deferred``: the keywords
    the schema's draft knows that this does not implement (:data:`DEFERRED`).
    """
    if schema is True:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict):
        raise _Unsupported(type(schema).__name__)
    for key, value in schema.items():
        if key in deferred:
            raise _Unsupported(key)
        if key not in _QUICK or key == "format":
            continue
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if not any(_is_type(instance, name) for name in names):
                return False
        elif key == "properties":
            if isinstance(instance, dict):
                for name, sub in value.items():
                    if name in instance and not quick_valid(sub, instance[name], deferred):
                        return False
        elif key == "additionalProperties":
            if isinstance(instance, dict):
                known = schema.get("properties", {})
                for name, item in instance.items():
                    if name not in known and not quick_valid(value, item, deferred):
                        return False
        elif key == "items":
            if isinstance(instance, list) and not all(quick_valid(value, item, deferred) for item in instance):
                return False
        elif key == "required":
            if isinstance(instance, dict) and not all(name in instance for name in value):
                return False
        elif key == "enum":
            if not any(equal(instance, option) for option in value):
                return False
        elif key == "const":
            if not equal(instance, value):
                return False
        elif key == "pattern":
            if isinstance(instance, str) and not _pattern(value).search(instance):
                return False
        elif key in ("minimum", "maximum"):
            if _is_type(instance, "number") and (instance < value if key == "minimum" else instance > value):
                return False
        elif key in ("minItems", "maxItems"):
            if isinstance(instance, list) and (len(instance) < value if key == "minItems" else len(instance) > value):
                return False
        elif key in ("minLength", "maxLength"):
            if isinstance(instance, str) and (len(instance) < value if key == "minLength" else len(instance) > value):
                return False
        elif key == "oneOf":
            if sum(quick_valid(sub, instance, deferred) for sub in value) != 1:
                return False
        elif key == "anyOf":
            if not any(quick_valid(sub, instance, deferred) for sub in value):
                return False
        elif key == "allOf" and not all(quick_valid(sub, instance, deferred) for sub in value):
            return False
    return True


def _errors(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[str]:
    deferred = DEFERRED.get(type(validator))
    if deferred is not None:
        try:
            if quick_valid(validator.schema, obj, deferred):
                return []
        except _Unsupported:
            pass
    errors = sorted(validator.iter_errors(obj), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return [f"{_path(e)}: {e.message}" for e in errors]


def validate_object(obj: dict[str, Any], kubernetes_version: str, patch: bool = False) -> list[str]:
    """Problems with one Kubernetes object (empty when it is valid)."""
    api_version, kind = str(obj.get("apiVersion")), str(obj.get("kind"))
    validator = crds.validator(api_version, kind, patch)
    if validator is None:
        if patch:
            return [f"no CRD for {api_version} {kind} to validate the patch against"]
        validator = builtin_validator(kubernetes_version, api_version, kind)
    if validator is None:
        return [
            f"no schema for {api_version} {kind} in Kubernetes {kubernetes_version} "
            "and no vendored CRD (nvidia_gpu/preview/crds/)"
        ]
    return _errors(validator, obj)


def validate_manifest(manifest: RenderedManifest, kubernetes_version: str) -> list[str]:
    return validate_object(manifest.object, kubernetes_version, manifest.patch)


#: From this many node groups on, a second process validates objects while the program registers them.
#: Starting it (interpreter, imports, schemas) and feeding it cost as much as validating a few thousand
#: objects in process with :func:`quick_valid`; at 100 groups (about 800 objects) it was slower.
PARALLEL_MIN_GROUPS = 256
_HANDOFF = "validator"


def _serve(inbox: Queue[Any], outbox: Queue[Any], kubernetes_version: str) -> None:
    """The worker process: validate ``(urn, object, patch)`` items until ``None`` arrives."""
    while (item := inbox.get()) is not None:
        urn, obj, patch = item
        outbox.put((urn, validate_object(obj, kubernetes_version, patch)))
    outbox.put(None)


class BackgroundValidator:
    """Validates objects in a spawned process (a second core) while the main process keeps working."""

    def __init__(self, kubernetes_version: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._inbox: Queue[Any] = ctx.Queue()
        self._outbox: Queue[Any] = ctx.Queue()
        self._process = ctx.Process(
            target=_serve, args=(self._inbox, self._outbox, kubernetes_version), name="preview-validate", daemon=True
        )
        self._process.start()
        self._closed = False

    def submit(self, urn: str, obj: dict[str, Any], patch: bool) -> None:
        self._inbox.put((urn, obj, patch))

    def results(self, timeout_s: float = 300.0) -> dict[str, list[str]]:
        """Every submitted object's problems, by URN; ends the worker."""
        self._inbox.put(None)
        self._closed = True
        out: dict[str, list[str]] = {}
        while (item := self._outbox.get(timeout=timeout_s)) is not None:
            out[item[0]] = item[1]
        self._process.join(timeout=timeout_s)
        return out

    def close(self) -> None:
        if not self._closed:
            self._inbox.put(None)
            self._closed = True
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.terminate()


def start(result: PreviewResult) -> None:
    """Before the program runs: for a large stack, start the worker and feed it every object as it is registered."""
    if result.config is None or len(result.config.node_groups) < PARALLEL_MIN_GROUPS:
        return
    worker = BackgroundValidator(result.config.cluster.kubernetes_version)
    result.handoff[_HANDOFF] = worker

    def feed(resource: RecordedResource) -> None:
        if resource.is_kubernetes_object:
            worker.submit(resource.urn, manifest_object(resource), resource.is_patch)

    result.listeners.append(feed)


def run(result: PreviewResult) -> None:
    assert result.config is not None
    version = result.config.cluster.kubernetes_version
    worker = result.handoff.pop(_HANDOFF, None)
    done = worker.results() if isinstance(worker, BackgroundValidator) else {}
    for manifest in result.manifests:
        messages = done.get(manifest.resource.urn)
        if messages is None:
            messages = validate_manifest(manifest, version)
        for message in messages:
            result.problems.append(Problem(STEP, f"manifests/{manifest.filename}", message))
