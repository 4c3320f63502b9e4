"""The offline preview's policy step: every recorded resource through the real pack, as ``pulumi preview`` does.

:func:`run` is a :class:`nvidia_gpu.preview.pipeline.Step`: it hands the resources the preview recorded
(type token, URN, name, parent, inputs), the stack's engine config and the project's policy config
(``policies/config.json``, the file CI passes the CLI) to :func:`~nvidia_gpu.preview.policyrun.offline.run_pack`,
adds the ``Policies:`` section to the preview's report (printed after the resource tree), and turns every
mandatory violation into a preview problem so ``make preview`` fails on it. Advisory violations are
reported and do not fail the preview.
"""

from __future__ import annotations

from nvidia_gpu.preview.background import BackgroundStart
from nvidia_gpu.preview.model import PreviewResult, Problem
from nvidia_gpu.preview.policyrun.analyzer_client import (
    PACK_DIR,
    AnalyzerResource,
    PackError,
    PackProcess,
    PolicyConfigError,
    StackContext,
)
from nvidia_gpu.preview.policyrun.offline import PROJECT_CONFIG, load_policy_config, run_pack, source_label
from nvidia_gpu.preview.policyrun.report import format_policies, stack_resource_label, summary_line

STEP = "policies"
_HANDOFF = "policies"


class StartingPack(BackgroundStart[PackProcess]):
    """The pack's process, started on a thread right after the config (its interpreter and imports, about
    a second, used to block the policy step on its port); closing it stops the process."""

    def __init__(self, stack: StackContext) -> None:
        self.pack = PackProcess(PACK_DIR, stack)
        super().__init__("policy-pack-start", self._start, self.pack.close)

    def _start(self) -> PackProcess:
        self.pack.start()
        return self.pack


def _stack(result: PreviewResult) -> StackContext:
    return StackContext(result.project, result.stack, dict(result.engine_config))


def start(result: PreviewResult) -> None:
    """Right after the config: start the pack the policy step will use."""
    try:
        result.handoff[_HANDOFF] = StartingPack(_stack(result))
    except (OSError, PackError):
        return  # the step starts it again and reports why it cannot


def run(result: PreviewResult) -> None:
    resources = [
        AnalyzerResource(r.type_token, r.urn, r.name, r.inputs, r.parent_urn or "", r.dependencies)
        for r in result.resources
    ]
    starting = result.handoff.pop(_HANDOFF, None)
    try:
        started = starting.wait() if isinstance(starting, StartingPack) else None
        policy_run = run_pack(resources, _stack(result), load_policy_config(PROJECT_CONFIG), started=started)
    except (OSError, ValueError, PackError, PolicyConfigError) as e:
        result.problems.append(Problem(STEP, str(PACK_DIR), str(e)))
        return
    finally:
        if starting is not None:
            starting.close()
    section = format_policies(policy_run.info, policy_run.diagnostics, source=source_label(PACK_DIR),
                              project=result.project, stack=result.stack)
    result.report_sections.append(f"{section}\n{summary_line(policy_run.diagnostics)}")
    for d in policy_run.mandatory:
        subject = f"{d.resource_type}: {d.resource_name}" if d.resource_type else stack_resource_label(
            result.project, result.stack)
        detail = d.message.removeprefix(d.description).strip() or d.description
        result.problems.append(Problem(STEP, subject, f"{d.policy_name}: {' '.join(detail.splitlines())}"))
