"""Print policy results the way ``pulumi preview`` prints its ``Policies:`` section.

One block per pack (``✅`` when nothing mandatory was violated, ``❌`` otherwise), then one entry per
violation: ``- [level]  policy  (type: name)`` followed by the policy's description and the message,
indented under it. Violations of stack policies that name no resource are attributed to the stack.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvidia_gpu.preview.policyrun.analyzer_client import ROOT_STACK_TYPE, Diagnostic
from nvidia_gpu.sdk.analyzer import PackInfo

_ORDER = {"mandatory": 0, "remediate": 0, "advisory": 1, "disabled": 2}


def stack_resource_label(project: str, stack: str) -> str:
    return f"{ROOT_STACK_TYPE}: {project}-{stack}"


def diagnostic_lines(d: Diagnostic, stack_label: str) -> list[str]:
    where = f"{d.resource_type}: {d.resource_name}" if d.resource_type else stack_label
    lines = [f"        - [{d.enforcement_level}]  {d.policy_name}  ({where})"]
    lines += [f"          {line}" for line in d.message.splitlines() if line.strip()]
    return lines


def format_policies(
    info: PackInfo, diagnostics: Sequence[Diagnostic], *, source: str, project: str, stack: str
) -> str:
    """The ``Policies:`` section for one pack (``source`` as the CLI shows it, e.g. ``local: policies``)."""
    failed = any(d.mandatory for d in diagnostics)
    lines = ["Policies:", f"    {'❌' if failed else '✅'} {info.name}@v{info.version} ({source})"]
    label = stack_resource_label(project, stack)
    ordered = sorted(diagnostics, key=lambda d: (_ORDER.get(d.enforcement_level, 3), d.policy_name, d.urn))
    for d in ordered:
        lines += diagnostic_lines(d, label)
    return "\n".join(lines)


def summary_line(diagnostics: Sequence[Diagnostic]) -> str:
    mandatory = sum(1 for d in diagnostics if d.mandatory)
    advisory = len(diagnostics) - mandatory
    return f"Policy violations: {mandatory} mandatory, {advisory} advisory"
