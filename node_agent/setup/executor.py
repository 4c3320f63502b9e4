"""The agent's interpreter of node-setup plans (``nvgpu.nodescripts.plan``): apply one, see where it stands,
roll it back; the node check's requirements (:func:`check_findings`) and its checks of what it found out
against the declaration (:func:`input_findings`); a file chosen by host facts
(:func:`choose`, :func:`read_ours`); the edit of a file of someone else's (:func:`block_edited`,
:func:`block_restored`); the device nodes of a :class:`~nvgpu.nodescripts.plan.DevicePlan` (:func:`apply_devices`,
:func:`rollback_devices`).

Why: a step declared as a plan is applied here for the DaemonSet backend and rendered as bash for Deckhouse
(``nvgpu.nodescripts.bashplan``) from the same declaration, so the two backends cannot drift. This module only
knows the kinds of things a plan holds, never a step: what a step does is its plan.

Every host change is atomic and reversible: a managed file is journaled (``node_agent.setup.journal``, feature
= the step's name) before it is written or a former one removed, and a live setting's value before our first
change is kept in the plan's ``previous_file``. :func:`rollback_plan` undoes exactly that: it restores the
journal, removes our managed files (also those a script wrote, without a journal) and puts the live values back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from node_agent.host import CommandNotFound, HostError, HostRoot, NotOurs, gpu_minors, loaded_modules
from node_agent.host.proc import char_majors, parse_mig_minors
from node_agent.host.root import CommandTimeout
from node_agent.setup.journal import Journal
from nvgpu import catalogue
from nvgpu.driver import NO_EXPECTATION, DriverExpectation, KernelModules
from nvgpu.nodescripts import facts
from nvgpu.nodescripts.content import HEADER
from nvgpu.nodescripts.facts import Reason
from nvgpu.nodescripts.plan import (
    CapNodes,
    Check,
    ChosenFile,
    ComputeAtLeast,
    ControlNode,
    DeviceNodes,
    DevicePlan,
    DriverAtLeast,
    DriverDeclared,
    FabricReady,
    GpuNodes,
    GpuNodesExist,
    InputCheck,
    MarkedBlock,
    ModuleLoaded,
    ModulesDeclared,
    ModuleWhenLoaded,
    NodeExists,
    ProgramInstalled,
    StepPlan,
    VirtualizationAllowed,
    fill,
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


@dataclass(frozen=True)
class Chosen:
    """The case of a :class:`ChosenFile` the host's facts select, its slots filled: write ``content`` at
    ``path`` (None: nothing written), log ``note``; or refuse with ``refuse``; or (``agent_layout``) the agent's
    own layout."""

    path: str
    content: str | None
    note: str
    refuse: str
    agent_layout: bool


class PlanRefused(HostError):
    """A plan's case refuses the step on this host (nothing changed)."""


def choose(item: ChosenFile, detected: dict[str, str]) -> Chosen:
    """The first case of ``item`` that ``detected`` (fact -> value; facts a case does not test may be left
    out) matches; ``ValueError`` when none does."""
    for case in item.cases:
        if case.matches(detected):
            return Chosen(case.path, None if case.content is None else fill(case.content, detected),
                          fill(case.note, detected), fill(case.refuse, detected), case.agent_layout)
    raise ValueError(f"no case for {detected}")


def read_ours(host: HostRoot, path: str) -> str | None:
    """The managed file at ``path`` (None: none); :class:`NotOurs` when someone else's file is there."""
    text = host.read_text_or_none(path)
    if text is not None and not _ours(text):
        raise NotOurs(not_ours(path), path)
    return text


def _ere(pattern: str) -> re.Pattern[str]:
    """A plan's POSIX ERE as Python reads it (awk's ``[[:space:]]`` is a blank here)."""
    return re.compile(pattern.replace("[[:space:]]", r"[ \t]"))


def _lines(text: str) -> list[str]:
    """Lines as awk reads them: split on newline only, no empty last line for a final newline."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def block_restored(item: MarkedBlock, text: str) -> str:
    """``text`` without our marked lines and with the lines we disabled enabled again: the file as it was."""
    out: list[str] = []
    inside = False
    for line in _lines(text):
        if line == item.begin:
            inside = True
        elif inside:
            inside = line != item.end
        else:
            out.append(line.removeprefix(item.disabled_prefix))
    return "".join(f"{line}\n" for line in out)


def block_edited(item: MarkedBlock, text: str | None, detected: dict[str, str]) -> str:
    """``text`` (None: no file) with ``item`` applied, from the file as it was (:func:`block_restored`), so
    applying it again changes nothing; ``detected`` fills the table key's slot. The same edit as the awk
    ``bashplan.render_block`` renders, byte for byte."""
    key, table = _ere(item.root_keys_ere), _ere(item.table_ere)
    tk = item.table_key
    value = detected.get(tk.slot, "") if tk else ""
    their_table, their_key = (_ere(tk.table_ere), _ere(tk.key_ere)) if tk else (None, None)
    ours = [item.begin, fill(tk.line, detected), item.end] if tk and value else []
    out = list(item.lines)
    in_tables = in_table = seen = False
    for line in _lines(block_restored(item, text or "")):
        header = bool(table.match(line))
        if header:
            in_tables, in_table = True, bool(their_table and their_table.match(line))
        disable = (not in_tables and key.match(line)) or (
            ours and in_table and not header and their_key is not None and their_key.match(line))
        out.append(item.disabled_prefix + line if disable else line)
        if ours and header and in_table and not seen:
            out += ours
            seen = True
    if tk and ours and not seen:
        out += [ours[0], tk.header, *ours[1:]]
    return "".join(f"{line}\n" for line in out)


@dataclass(frozen=True)
class CheckInputs:
    """What the check found out before its :data:`~nvgpu.nodescripts.plan.InputCheck` items judge it: the loaded
    driver (None: not read), the driver version file's first line, the declaration, the GPUs' virtualization
    modes (NVML's), the driver their models require (None: not known), the GPUs' compute capabilities."""

    driver: str | None = None
    driver_line: str = ""
    expect: DriverExpectation = NO_EXPECTATION
    modes: Sequence[str] = ()
    required: str | None = None
    #: Each GPU as (its name in a message, its compute capability as ``major.minor``).
    computes: Sequence[tuple[str, str]] = ()
    #: Each GPU as (its name in a message, its fabric state, its fabric status), in ``nvidia-smi -q``'s words.
    fabrics: Sequence[tuple[str, str, str]] = ()


def input_findings(checks: Iterable[InputCheck], inputs: CheckInputs) -> list[tuple[Reason, str]]:
    """The findings of ``checks`` on ``inputs``, as (reason, message), in order; a check whose input or
    declaration is missing finds nothing."""
    out: list[tuple[Reason, str]] = []
    driver, expect = inputs.driver, inputs.expect
    for c in checks:
        if isinstance(c, DriverDeclared):
            declared = expect.version
            if driver is not None and declared is not None:
                branch = "." not in declared.text
                same = (driver.split(".", 1)[0] == declared.text if branch
                        else catalogue.parse_driver_version(driver) == catalogue.parse_driver_version(declared.text))
                if not same:
                    text = c.branch_message if branch else c.release_message
                    out.append((c.reason, fill(text, {"driver": driver, "declared": declared.text})))
        elif isinstance(c, ModulesDeclared):
            if driver is not None and expect.modules is not KernelModules.AUTO:
                loaded = "open" if c.open_marker.lower() in inputs.driver_line.lower() else "proprietary"
                if loaded != expect.modules.value:
                    out.append((c.reason, fill(c.message, {"loaded": loaded, "declared": expect.modules.value})))
        elif isinstance(c, VirtualizationAllowed):
            if expect.driver_type is not None:
                allowed = c.allowed(expect.driver_type.value)
                out += [(c.reason, fill(c.message, {"mode": mode, "driver_type": expect.driver_type.value,
                                                    "allowed": " or ".join(allowed)}))
                        for mode in sorted(set(inputs.modes)) if mode != c.unknown and mode not in allowed]
        elif isinstance(c, ComputeAtLeast):
            for gpu, cc in inputs.computes:
                m = re.fullmatch(r"([0-9]+)\.([0-9]+)", cc)
                if m is None or (int(m.group(1)), int(m.group(2))) < c.minimum:
                    out.append((c.reason, fill(c.message, {"gpu": gpu, "cc": cc, "minimum": c.minimum_text})))
        elif isinstance(c, FabricReady):
            for gpu, state, status in inputs.fabrics:
                if state in c.not_ready:
                    out.append((c.reason, fill(c.not_ready_message, {"gpu": gpu, "state": state})))
                elif state == c.done and status != c.ok:
                    out.append((c.reason, fill(c.failed_message, {"gpu": gpu, "status": status})))
        elif isinstance(c, DriverAtLeast):
            required = inputs.required
            if driver is not None and required is not None and not catalogue.driver_at_least(driver, required):
                out.append((c.reason, fill(c.message, {"driver": driver, "required": required})))
    return out


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


@dataclass(frozen=True)
class DeviceNode:
    """A device node a :class:`DevicePlan` wants on this host: ``c major:minor`` at ``path`` with ``mode``."""

    path: str
    major: int
    minor: int
    mode: int


@dataclass
class DevicesResult:
    """What :func:`apply_devices` did: the nodes made, the modules it loaded, and the nodes it could not make
    (and why)."""

    created: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def load_when(host: HostRoot, modules: Iterable[ModuleWhenLoaded]) -> list[str]:
    """Load each module whose ``when`` module is loaded and it is not; the ones loaded. A failure is a
    :class:`HostError` worded by the plan."""
    out: list[str] = []
    for m in modules:
        loaded = loaded_modules(host)
        if m.when not in loaded or m.loaded_name in loaded:
            continue
        try:
            result = host.run(["modprobe", m.name], timeout_s=facts.MODPROBE_TIMEOUT_S)
        except CommandNotFound as e:
            raise HostError(m.not_found) from e
        except CommandTimeout as e:
            raise HostError(m.timed_out) from e
        if not result.ok:
            output = (result.stderr or result.stdout).strip() or m.no_output
            raise HostError(fill(m.failed, {"rc": str(result.returncode), "output": output}))
        out.append(m.name)
    return out


def _first_major(majors: dict[str, int], names: Iterable[str]) -> int | None:
    return next((majors[n] for n in names if n in majors), None)


def wanted_nodes(host: HostRoot, items: Iterable[DeviceNodes], mig_caps: Iterable[str] = ()
                 ) -> tuple[list[DeviceNode], list[str]]:
    """The nodes ``items`` want on this host now, in order, and why some cannot be made (a major or minor the
    kernel has not published). ``mig_caps``: ``mig-minors`` keys of instances that exist (the MIG manager's),
    whose caps nodes a :class:`CapNodes` wants as well."""
    majors = char_majors(host)
    caps = list(mig_caps)
    nodes: list[DeviceNode] = []
    missing: list[str] = []
    for item in items:
        if isinstance(item, ControlNode):
            major = _first_major(majors, item.majors)
            if major is None:
                missing.append(item.missing)
            else:
                nodes.append(DeviceNode(item.path, major, item.minor, item.mode))
        elif isinstance(item, GpuNodes):
            major = _first_major(majors, item.majors)
            if major is not None:
                nodes += [DeviceNode(f"{item.prefix}{minor}", major, minor, item.mode)
                          for minor in sorted(set(gpu_minors(host).values()))]
        elif isinstance(item, CapNodes):
            major = majors.get(item.major)
            text = host.read_text_or_none(item.minors_file)
            if major is None or text is None:
                if caps:
                    missing.append(item.unavailable)
                continue
            table = parse_mig_minors(text)
            modes = dict(item.modes)
            for cap in [*modes, *(c for c in caps if c not in modes)]:
                if cap not in table:
                    if cap not in modes:
                        missing.append(item.not_listed(cap))
                    continue
                nodes.append(DeviceNode(f"{item.directory}/nvidia-cap{table[cap]}", major, table[cap],
                                        modes.get(cap, item.access_mode)))
    return nodes, missing


def make_nodes(host: HostRoot, plan: DevicePlan, nodes: Iterable[DeviceNode]) -> list[str]:
    """Make each node where nothing is at its path (whoever made what is there), recorded in the plan's journal
    before it is made; the paths made. A node that cannot be made is a :class:`HostError` worded by the plan."""
    created: list[str] = []
    journal: Journal | None = None
    for node in nodes:
        if host.exists(node.path) or host.path(node.path).is_symlink():
            continue
        journal = journal or Journal(host, plan.name)
        journal.record(node.path)
        try:
            made = host.make_char_device(node.path, node.major, node.minor, node.mode)
        except HostError as e:
            cause = e.__cause__
            why = (cause.strerror if isinstance(cause, OSError) else None) or str(cause or e)
            raise HostError(fill(plan.cannot_make, {"path": node.path, "major": str(node.major),
                                                    "minor": str(node.minor), "why": why}), node.path) from e
        if made:
            created.append(node.path)
    return created


def apply_devices(host: HostRoot, plan: DevicePlan, *, load_modules: bool = True, mig_caps: Iterable[str] = ()
                  ) -> DevicesResult:
    """Apply a device plan: its modules loaded (``load_modules``), then every node it wants that is absent made,
    each journaled first. Idempotent: a second run makes nothing. The caller holds the step's lock."""
    result = DevicesResult()
    if load_modules:
        result.loaded = load_when(host, plan.modules)
    nodes, result.missing = wanted_nodes(host, plan.nodes, mig_caps)
    result.created = make_nodes(host, plan, nodes)
    return result


def rollback_devices(host: HostRoot, plan: DevicePlan) -> list[str]:
    """Remove the nodes a device plan made (and the directories made for them), from its journal: nothing else,
    whether the agent or the script made them."""
    return Journal(host, plan.name).restore()
