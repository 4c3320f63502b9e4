"""The agent's interpreter of node-setup plans (``nvgpu.nodescripts.plan``): apply one, see where it stands,
roll it back; and the node check's requirements (:func:`check_findings`).

Why: a step declared as a plan is applied here for the DaemonSet backend and rendered as bash for Deckhouse
(``nvgpu.nodescripts.bashplan``) from the same declaration, so the two backends cannot drift. This module only
knows the kinds of things a plan holds, never a step: what a step does is its plan.

Every host change is atomic and reversible: a managed file is journaled (``node_agent.setup.journal``, feature
= the step's name) before it is written or a former one removed, and a live setting's value before our first
change is kept in the plan's ``previous_file``. :func:`rollback_plan` undoes exactly that: it restores the
journal, removes our managed files (also those a script wrote, without a journal) and puts the live values back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from node_agent.host import CommandNotFound, HostError, HostRoot, NotOurs, gpu_minors, loaded_modules
from node_agent.host.root import CommandTimeout
from node_agent.setup.journal import Journal
from nvgpu.nodescripts import facts
from nvgpu.nodescripts.content import HEADER
from nvgpu.nodescripts.facts import Reason
from nvgpu.nodescripts.plan import (
    Check,
    GpuNodesExist,
    ModuleLoaded,
    NodeExists,
    ProgramInstalled,
    StepPlan,
    former_not_ours,
    not_ours,
    setting_absent,
)


@dataclass
class PlanResult:
    """What applying (or rolling back) a plan did."""

    changed_files: list[str] = field(default_factory=list)
    live: dict[str, str] = field(default_factory=dict)  #: setting name -> value written now
    loaded: list[str] = field(default_factory=list)  #: modules modprobe'd
    notes: list[str] = field(default_factory=list)
    #: What is still missing after apply (the modules' and the requirements' problems): empty = ready.
    problems: list[str] = field(default_factory=list)


def check_findings(host: HostRoot, checks: Iterable[Check], *, toolkit_dir: str | None = None
                   ) -> list[tuple[Reason, str]]:
    """The check's requirements ``checks`` that the host does not meet, as (reason, message), in order.
    ``toolkit_dir``: where a toolkit container installed the toolkit, if the node group has one."""
    checks = tuple(checks)
    out: list[tuple[Reason, str]] = []
    modules: frozenset[str] | None = None
    if any(isinstance(c, ModuleLoaded) for c in checks):
        try:
            modules = loaded_modules(host)
        except HostError as e:
            out.append((Reason.PROC_UNREADABLE, str(e)))
    for c in checks:
        if isinstance(c, ModuleLoaded):
            if modules is not None and c.name not in modules:
                out.append((c.reason, c.message))
        elif isinstance(c, NodeExists):
            if not host.exists(c.path):
                out.append((c.reason, c.message))
        elif isinstance(c, GpuNodesExist):
            out += [(c.reason, c.message(str(minor))) for minor in sorted(gpu_minors(host).values())
                    if not host.exists(f"/dev/nvidia{minor}")]
        elif isinstance(c, ProgramInstalled):
            candidates = c.candidates(toolkit_dir)
            if not any(host.is_executable(p) for p in candidates):
                out.append((c.reason, c.message(", ".join(candidates))))
    return out


def _ours(text: str) -> bool:
    return text.startswith(HEADER)


def _previous(host: HostRoot, plan: StepPlan) -> dict[str, str]:
    """The settings' values from before our first change (the first line for a name wins)."""
    text = host.read_text_or_none(plan.previous_file) if plan.previous_file else None
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() not in out:
            out[name.strip()] = value.strip()
    return out


def modules_loaded(host: HostRoot, plan: StepPlan) -> dict[str, bool]:
    return {m.name: host.is_dir(m.sys_path) for m in plan.modules}


def problems(host: HostRoot, plan: StepPlan) -> list[str]:
    """The plan's modules not loaded and requirements not met, in plan order (nothing is changed)."""
    out = [m.problem for m in plan.modules if not host.is_dir(m.sys_path)]
    return out + [r.problem for r in plan.requirements if not host.listdir(r.path)]


def apply_plan(host: HostRoot, plan: StepPlan) -> PlanResult:
    """Apply ``plan``; :class:`NotOurs` (nothing changed) when a managed file's path holds someone else's file.
    The caller holds the step's lock where it needs one."""
    result = PlanResult()
    existing: dict[str, str | None] = {}
    for f in plan.files:
        text = host.read_text_or_none(f.path)
        if text is not None and not _ours(text):
            raise NotOurs(not_ours(f.path), f.path)
        existing[f.path] = text
    current: dict[str, str] = {}
    for s in plan.settings:
        text = host.read_text_or_none(s.proc_path)
        if text is None:
            result.notes.append(setting_absent(s.name))
        else:
            current[s.name] = text.strip()
    if plan.files or plan.former_files:
        journal = Journal(host, plan.name)
        for f in plan.files:
            if existing[f.path] != f.content:
                journal.record(f.path)
                host.write_atomic(f.path, f.content)
                result.changed_files.append(f.path)
        for former in plan.former_files:
            text = host.read_text_or_none(former.path)
            if text is None:
                continue
            if not _ours(text):
                result.notes.append(former_not_ours(former.path))
                continue
            journal.record(former.path)  # the new file is in place first: no window without it
            if host.remove(former.path):
                result.changed_files.append(former.path)
    if current:
        previous = _previous(host, plan)
        missing = {n: v for n, v in current.items() if n not in previous}
        if missing:
            text = host.read_text_or_none(plan.previous_file) or ""
            host.write_atomic(plan.previous_file, text + "".join(f"{n}={v}\n" for n, v in missing.items()))
        for s in plan.settings:
            if s.name in current and current[s.name] != s.value:
                host.write_kernel(s.proc_path, s.value + "\n")
                result.live[s.name] = s.value
    for m in plan.modules:
        if host.is_dir(m.sys_path):
            continue
        try:
            host.run(["modprobe", m.name], timeout_s=facts.MODPROBE_TIMEOUT_S)
        except (CommandNotFound, CommandTimeout) as e:
            raise HostError(f"cannot load {m.name}: {e}") from e
        result.loaded.append(m.name)
    result.problems = problems(host, plan)
    return result


def rollback_plan(host: HostRoot, plan: StepPlan) -> PlanResult:
    """Undo :func:`apply_plan`: the journal's files back, our managed files gone (journaled or not), the live
    settings back to their values from before our first change. Modules stay loaded (something may use them)."""
    result = PlanResult()
    if plan.files or plan.former_files:
        result.changed_files = Journal(host, plan.name).restore()
    # Ours without a journal entry (journal lost, or a script wrote it): removed too. Former names are left to
    # the journal, which restores them when apply migrated them away.
    for f in plan.files:
        text = host.read_text_or_none(f.path)
        if text is not None and _ours(text) and host.remove(f.path):
            result.changed_files.append(f.path)
    if plan.settings:
        for name, value in _previous(host, plan).items():
            path = facts.sysctl_proc_path(name)
            live = host.read_text_or_none(path)
            if live is None:
                result.notes.append(f"{setting_absent(name)}; previous value {value} not restored")
                continue
            if live.strip() != value:
                host.write_kernel(path, value + "\n")
                result.live[name] = value
        host.remove(plan.previous_file)
    return result
