"""The preview as an ordered list of named steps over one :class:`~nvidia_gpu.preview.model.PreviewResult`.

Each step reads what earlier steps filled in and appends problems. A step that finds problems stops
the run when later steps depend on its output (no resources are registered for an invalid config);
validation problems do not stop the steps after it, so one run lists everything wrong. To add a step
(policy analysis, say) insert a :class:`Step` into :data:`DEFAULT_STEPS` or pass your own list.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_gpu.preview import engine, render, serverdryrun, stackfile, validate
from nvidia_gpu.preview.model import PreviewResult
from nvidia_gpu.preview.policyrun import preview_step as policy_step


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[PreviewResult], None]
    #: Stop here if this step (or an earlier one) reported problems.
    stop_on_problems: bool = True


DEFAULT_STEPS: tuple[Step, ...] = (
    Step(stackfile.STEP, stackfile.load),
    # The pack's process and the throwaway control plane start now, on threads, and are ready (or nearly)
    # when their steps come: their starts (about 1 s and 5 s) no longer follow everything else.
    Step("policies-start", policy_step.start),
    Step("server-dry-run-start", serverdryrun.start),
    # Large stacks: a second process validates each object while the program still registers others.
    Step("validate-start", validate.start),
    Step(engine.STEP, engine.run),
    Step(render.STEP, render.run),
    Step(validate.STEP, validate.run, stop_on_problems=False),
    # Every recorded resource through the real policy pack, as `pulumi preview --policy-pack policies` does.
    Step(policy_step.STEP, policy_step.run, stop_on_problems=False),
    # The objects through a real kube-apiserver (dryRun=All): what schemas cannot see.
    Step(serverdryrun.STEP, serverdryrun.run, stop_on_problems=False),
)


def new_result(project_dir: Path, stack: str, out_dir: Path | None = None) -> PreviewResult:
    project_dir = project_dir.resolve()
    return PreviewResult(
        project=stackfile.project_name(project_dir),
        stack=stack,
        project_dir=project_dir,
        out_dir=(out_dir or project_dir / "out" / stack).resolve(),
        stack_file=project_dir / f"Pulumi.{stack}.yaml",
    )


def run_steps(result: PreviewResult, steps: Sequence[Step] = DEFAULT_STEPS) -> PreviewResult:
    with engine.program_gc():
        return _run_steps(result, steps)


def _run_steps(result: PreviewResult, steps: Sequence[Step]) -> PreviewResult:
    try:
        for step in steps:
            start = time.perf_counter()
            step.run(result)
            result.timings_ms[step.name] = (time.perf_counter() - start) * 1000
            if step.stop_on_problems and result.problems:
                break
    finally:
        start = time.perf_counter()
        for pending in result.background:
            pending.result()  # a failed write raises here, after the steps
        result.background.clear()
        for handed in result.handoff.values():
            handed.close()
        result.handoff.clear()
        result.timings_ms["io-wait"] = (time.perf_counter() - start) * 1000
    return result


def run_preview(
    project_dir: Path, stack: str, out_dir: Path | None = None, steps: Sequence[Step] = DEFAULT_STEPS,
    *, server_mode: str = "off", server_kubeconfig: Path | None = None, server_context: str | None = None,
) -> PreviewResult:
    """The preview; ``server_mode`` is ``off`` here (library callers and unit tests) and ``auto`` for
    ``make preview`` (see :mod:`nvidia_gpu.preview.serverdryrun`)."""
    result = new_result(project_dir, stack, out_dir)
    result.server_mode = "kubeconfig" if server_kubeconfig is not None else server_mode
    result.server_kubeconfig = server_kubeconfig
    result.server_context = server_context
    return run_steps(result, steps)
