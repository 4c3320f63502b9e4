"""Step 3: turn recorded registrations into kubectl-applicable manifests (in apply order) and ``plan.json``.

Apply order: Namespaces and CRDs, then cluster-wide classes (PriorityClass, RuntimeClass), then identities
and RBAC, then configuration, then workloads, then custom resources and patches of objects other
controllers own. Inside a rank files sort by kind, namespace and name, so the output is byte-identical
run to run. A patch of an object the stack itself creates (a ConfigMap's data patch, see
``nvidia_gpu.components.register.register_config_map``) is merged into that object's file: the cluster
holds one object, and that file is what the validation and the server dry-run check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nvgpu import capacity, yamltext
from nvidia_gpu.preview.model import PreviewResult, RecordedResource, RenderedManifest

STEP = "render"
_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preview-write")

_RANK: dict[str, int] = {
    "Namespace": 0,
    "CustomResourceDefinition": 0,
    "PriorityClass": 1,
    "RuntimeClass": 1,
    "ServiceAccount": 2,
    "ClusterRole": 2,
    "Role": 2,
    "ClusterRoleBinding": 3,
    "RoleBinding": 3,
    "ConfigMap": 4,
    "Secret": 4,
    "Service": 4,
    "DeviceClass": 4,
    "DaemonSet": 5,
    "Deployment": 5,
    "StatefulSet": 5,
    "Job": 5,
}
_CUSTOM_RANK = 6
#: The provider's annotation naming a patch's server-side-apply field manager.
_PATCH_FIELD_MANAGER = "pulumi.com/patchFieldManager"


def _patch_header(obj: dict[str, Any]) -> str:
    """How to apply a patch file by hand as the stack applies it: its own field manager, and no
    ``--force-conflicts`` (the stack never takes fields over from another manager; a conflict is refused)."""
    manager = ((obj.get("metadata") or {}).get("annotations") or {}).get(_PATCH_FIELD_MANAGER)
    flag = f" --field-manager={manager}" if manager else ""
    return ("# A partial object for server-side apply onto an object another controller owns, as the stack\n"
            "# applies it (a field another manager holds is a conflict, refused, never taken over):\n"
            f"#   kubectl apply --server-side{flag} -f <this file>\n")


def _rank(kind: str) -> int:
    return _RANK.get(kind, _CUSTOM_RANK)


def manifest_object(resource: RecordedResource) -> dict[str, Any]:
    """The API object a Kubernetes resource's inputs describe (already in a stable key order)."""
    inputs = resource.inputs
    return {key: value for key, value in inputs.items() if value is not None}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-")


def _identity(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta.get("name") or ""


def _merged(base: Any, patch: Any) -> Any:
    """``patch`` applied over ``base`` as server-side apply merges maps (new dicts; neither is changed)."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return patch
    return {**base, **{k: _merged(base.get(k), v) for k, v in patch.items()}}


def render_manifests(resources: tuple[RecordedResource, ...]) -> tuple[RenderedManifest, ...]:
    recorded = [(r, manifest_object(r)) for r in resources if r.is_kubernetes_object]
    whole = {_identity(obj): i for i, (r, obj) in enumerate(recorded) if not r.is_patch}
    merged = {i: obj for i, (r, obj) in enumerate(recorded) if not r.is_patch}
    for r, obj in recorded:
        if r.is_patch and (i := whole.get(_identity(obj))) is not None:
            merged[i] = _merged(merged[i], obj)  # the stack's own object: one file
    objects = [(r, merged.get(i, obj)) for i, (r, obj) in enumerate(recorded)
               if not (r.is_patch and _identity(obj) in whole)]

    def key(item: tuple[RecordedResource, dict[str, Any]]) -> tuple[int, int, str, str, str]:
        r, obj = item
        meta = obj.get("metadata") or {}
        return (_rank(obj["kind"]), int(r.is_patch), obj["kind"], meta.get("namespace") or "", meta.get("name") or "")

    rendered = []
    for i, (r, obj) in enumerate(sorted(objects, key=key), start=1):
        name = (obj.get("metadata") or {}).get("name") or r.name
        filename = f"{i:03d}-{_slug(obj['kind'])}-{_slug(name)}.yaml"
        rendered.append(RenderedManifest(order=i, filename=filename, object=obj, resource=r, patch=r.is_patch))
    return tuple(rendered)


def manifest_text(manifest: RenderedManifest) -> str:
    body = yamltext.dump(manifest.object)
    return (_patch_header(manifest.object) if manifest.patch else "") + "---\n" + body


def plan(result: PreviewResult) -> dict[str, Any]:
    return {
        "project": result.project,
        "stack": result.stack,
        "capacity": [g.as_json() for g in capacity.plan(result.config)] if result.config else [],
        "resources": [r.as_json() for r in result.resources],
        "manifests": [
            {"file": m.filename, "kind": m.kind, "name": m.name, "namespace": m.namespace, "urn": m.resource.urn}
            for m in result.manifests
        ],
    }


def write(result: PreviewResult) -> None:
    """Replace ``out/<stack>/`` with this run's files (stale manifests from an earlier run would mislead).

    All of it, building the texts included, is left to a background thread, so it overlaps the later
    steps: file creation waits on the disk and releases the GIL, and on large stacks the main thread
    mostly waits for the validation process meanwhile. Only immutable values cross over (the rendered
    manifests and recorded resources are frozen tuples). The pipeline waits for it before it returns.
    """
    result.background.append(_WRITER.submit(_write_outputs, result.out_dir, result.manifests, plan(result)))


def _write_outputs(out_dir: Path, manifests: tuple[RenderedManifest, ...], plan_data: dict[str, Any]) -> None:
    manifests_dir = out_dir / "manifests"
    if manifests_dir.exists():
        shutil.rmtree(manifests_dir)
    manifests_dir.mkdir(parents=True)
    files = [(manifests_dir / m.filename, manifest_text(m)) for m in manifests]
    files.append((out_dir / "plan.json", plan_text(plan_data)))
    _write_all(files)


def _write_all(files: list[tuple[Path, str]]) -> None:
    # Straight to the file descriptor: the same bytes as ``Path.write_text`` (UTF-8, newlines as they are),
    # without a buffered text layer per file, which was most of this thread's time for small manifests.
    for path, text in files:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def plan_text(data: dict[str, Any]) -> str:
    """JSON with one resource (and one manifest) per line: diffable, and written by the C encoder."""
    listed = [k for k in ("capacity", "resources", "manifests") if k in data]
    head = {k: v for k, v in data.items() if k not in listed}
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    for n, key in enumerate(listed):
        items = ",\n".join(f"    {json.dumps(item, separators=(', ', ': '))}" for item in data[key])
        body = f"[\n{items}\n  ]" if items else "[]"
        lines.append(f'  "{key}": {body}' + ("," if n < len(listed) - 1 else ""))
    return "\n".join(lines) + "\n}\n"


def run(result: PreviewResult) -> None:
    result.manifests = render_manifests(result.resources)
    write(result)
