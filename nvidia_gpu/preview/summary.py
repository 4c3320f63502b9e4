"""The terminal report, shaped like ``pulumi preview``'s: a resource tree, counts, then any problems."""

from __future__ import annotations

from collections import Counter

from nvgpu import capacity
from nvidia_gpu.preview.model import PreviewResult, RecordedResource
from nvidia_gpu.preview.policyrun.analyzer_client import ROOT_STACK_TYPE

NODE_GROUP_TYPE = "nvidia-gpu:index:GpuNodeGroup"


def _kind(resource: RecordedResource) -> str:
    if resource.is_kubernetes_object:
        kind = str(resource.inputs["kind"])
        return f"{kind} (patch)" if resource.is_patch else kind
    return resource.type_token


def node_group_of(
    result: PreviewResult, resource: RecordedResource, by_urn: dict[str, RecordedResource] | None = None
) -> str | None:
    """The stack node group a resource belongs to (its nearest GpuNodeGroup ancestor), if any."""
    by_urn = by_urn if by_urn is not None else {r.urn: r for r in result.resources}
    current: RecordedResource | None = resource
    while current is not None:
        if current.type_token == NODE_GROUP_TYPE:
            return current.name
        current = by_urn.get(current.parent_urn or "")
    return None


def tree_lines(result: PreviewResult) -> list[str]:
    children: dict[str | None, list[RecordedResource]] = {}
    urns = {r.urn for r in result.resources}
    for r in result.resources:
        parent = r.parent_urn if r.parent_urn in urns else None
        children.setdefault(parent, []).append(r)
    width = max((len(r.type_token) for r in result.resources), default=10) + 8
    lines = [f"     {'Type':<{width}} {'Name':<40} Plan", f" +   {ROOT_STACK_TYPE:<{width}} "
             f"{result.project + '-' + result.stack:<40} create"]

    def walk(parent: str | None, prefix: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda r: (r.custom, r.type_token, r.name))
        for i, r in enumerate(kids):
            last = i == len(kids) - 1
            branch = prefix + ("└─ " if last else "├─ ")
            label = branch + r.type_token
            lines.append(f" +   {label:<{width}} {r.name:<40} create")
            walk(r.urn, prefix + ("   " if last else "│  "))

    walk(None, "")
    return lines


def summary_lines(result: PreviewResult) -> list[str]:
    lines = [f"Previewing update ({result.stack}) offline, under the Pulumi mock engine:", ""]
    lines += tree_lines(result)
    if result.config is not None:
        lines += ["", *capacity.lines(capacity.plan(result.config))]
    for section in result.report_sections:
        lines += ["", *section.splitlines()]
    kinds = Counter(_kind(r) for r in result.resources)
    by_urn = {r.urn: r for r in result.resources}
    groups = Counter(node_group_of(result, r, by_urn) or "(cluster-wide)" for r in result.resources)
    lines += ["", "Resources:", f"    + {len(result.resources)} to create", "", "By kind:"]
    lines += [f"    {count:>4}  {kind}" for kind, count in sorted(kinds.items())]
    lines += ["", "By node group:"]
    lines += [f"    {count:>4}  {group}" for group, count in sorted(groups.items())]
    out = result.out_dir
    lines += ["", f"Wrote {len(result.manifests)} manifests to {out / 'manifests'} and {out / 'plan.json'}"]
    return lines


def problem_lines(result: PreviewResult) -> list[str]:
    lines = [f"{len(result.problems)} problem(s):"]
    lines += [f"  - {p}" for p in result.problems]
    return lines
