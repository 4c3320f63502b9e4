"""Step 4: validate every manifest against the Kubernetes OpenAPI schema of the stack's version, strictly.

Built-in kinds use kubernetes-validate's ``-strict`` schemas for the stack's minor version (unknown
fields are errors); custom resources use their CRD's schema (:mod:`preview.crds`). Schemas are loaded
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
from referencing import Registry, Resource

from preview import crds
from preview.model import PreviewResult, Problem, RecordedResource, RenderedManifest
from preview.render import manifest_object

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
    result: jsonschema.protocols.Validator = jsonschema.Draft202012Validator(inlined, registry=registry)
    return result


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".") or "(root)"


def _errors(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[str]:
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
            "and no vendored CRD (preview/crds/)"
        ]
    return _errors(validator, obj)


def validate_manifest(manifest: RenderedManifest, kubernetes_version: str) -> list[str]:
    return validate_object(manifest.object, kubernetes_version, manifest.patch)


#: From this many node groups on, a second process validates objects while the program registers them
#: (starting it costs about as much as validating a hundred objects in process).
PARALLEL_MIN_GROUPS = 16
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
