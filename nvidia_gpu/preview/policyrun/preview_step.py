"""The offline preview's policy step: every recorded resource through the real pack, as ``pulumi preview`` does.

:func:`run` is a :class:`nvidia_gpu.preview.pipeline.Step`: it hands the resources the preview recorded
(type token, URN, name, parent, inputs), the stack's engine config and the project's policy config
(``policies/config.json``, the file CI passes the CLI) to :func:`~nvidia_gpu.preview.policyrun.offline.run_pack`,
adds the ``Policies:`` section to the preview's report (printed after the resource tree), and turns every
mandatory violation into a preview problem so ``make preview`` fails on it. Advisory violations are
reported and do not fail the preview.
"""

from __future__ import annotations

from nvidia_gpu.preview.model import PreviewResult, Problem
from nvidia_gpu.preview.policyrun.analyzer_client import (
    PACK_DIR,
    AnalyzerResource,
    PackError,
    PolicyConfigError,
    StackContext,
)
from nvidia_gpu.preview.policyrun.offline import PROJECT_CONFIG, load_policy_config, run_pack, source_label
from nvidia_gpu.preview.policyrun.report import format_policies, stack_resource_label, summary_line

STEP = "policies"


def run(result: PreviewResult) -> None:
    resources = [
        AnalyzerResource(r.type_token, r.urn, r.name, r.inputs, r.parent_urn or "", r.dependencies)
        for r in result.resources
    ]
    stack = StackContext(result.project, result.stack, dict(result.engine_config))
    try:
        policy_run = run_pack(resources, stack, load_policy_config(PROJECT_CONFIG))
    except (OSError, ValueError, PackError, PolicyConfigError) as e:
        result.problems.append(Problem(STEP, str(PACK_DIR), str(e)))
        return
    section = format_policies(policy_run.info, policy_run.diagnostics, source=source_label(PACK_DIR),
                              project=result.project, stack=result.stack)
    result.report_sections.append(f"{section}\n{summary_line(policy_run.diagnostics)}")
    for d in policy_run.mandatory:
        subject = f"{d.resource_type}: {d.resource_name}" if d.resource_type else stack_resource_label(
            result.project, result.stack)
        detail = d.message.removeprefix(d.description).strip() or d.description
        result.problems.append(Problem(STEP, subject, f"{d.policy_name}: {' '.join(detail.splitlines())}"))
