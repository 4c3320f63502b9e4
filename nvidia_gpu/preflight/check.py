"""The preflight the program runs before it registers anything (see the package docstring)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvgpu.stackconfig import StackConfig
from nvidia_gpu.preflight import access, migration, stacks
from nvidia_gpu.preflight.model import Finding, ReadRefused, Severity
from nvidia_gpu.preflight.reader import KubeReader, connect


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    #: Why the cluster could not be checked (no kubeconfig file, unreachable, reads refused), or None.
    skipped: str | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[str]:
        lines = [f.line() for f in self.findings if f.severity is Severity.WARNING]
        if self.skipped:
            lines.append(f"the cluster was not checked for collisions with other installations: {self.skipped}")
        return lines


def run(config: StackConfig, *, stack: str, kubeconfigs: Sequence[Path]) -> Report:
    """Read the cluster the stack's provider targets (same kubeconfig files and context) and report."""
    report = Report()
    try:
        kube = connect(kubeconfigs, config.cluster.kube_context)
    except ReadRefused as e:
        report.skipped = str(e)
        return report
    if kube is None:
        report.skipped = "no kubeconfig file (set KUBECONFIG, or ~/.kube/config)"
        return report
    cluster = KubeReader(kube)
    try:
        others = stacks.findings(config, stack, cluster, cluster)
        installers = migration.findings(config, cluster)
    except ReadRefused as e:
        report.skipped = str(e)
        return report
    # One line per object: NVIDIA's own DeviceClasses are named by both; the migration's says whose they are.
    named = {f.subject for f in installers}
    report.findings += [f for f in others if f.subject not in named] + installers
    return report


def dry_run_warnings(config: StackConfig, *, kubeconfigs: Sequence[Path],
                     applied: Iterable[tuple[str, str, str | None]]) -> list[str]:
    """For ``pulumi preview``: the kinds among ``applied`` (what the program registered, as
    ``(apiVersion, kind, namespace)``) the server will not dry-run for the identity in use, one line per
    cause (see :mod:`nvidia_gpu.preflight.access`); nothing when that cannot be asked."""
    try:
        kube = connect(kubeconfigs, config.cluster.kube_context)
        if kube is None:
            return []
        return [f.line() for f in access.dry_run_findings(kube, applied)]
    except ReadRefused:
        return []  # the preflight before the build already said the cluster was not checked
