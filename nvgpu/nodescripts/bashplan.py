"""The bash interpreter of node-setup plans (``nvgpu.nodescripts.plan``): a plan rendered as the part of a
Deckhouse script that applies it.

Why: the agent applies the same plan with ``node_agent.setup.executor``; rendering the bash from the plan (and
not writing it by hand beside the Python) is what keeps the two backends alike. The output is straight-line
bash, one block per item of the plan, in the executor's order; it uses what the script's templates define
(``$ROOT``, ``write_file``, the ``bb-log-*`` functions) and, for a plan with files, a function the caller names
(``refuse``) that is called with the message when a managed file's path holds someone else's file, before
anything is changed. Modules and requirements leave their problems in the array ``plan_problems``.

The node check's requirements (``plan.HOST_CHECKS``, ``plan.RUNTIME_CHECKS``) render with :func:`render_checks`
as calls of the check's ``fail REASON MESSAGE``, the agent's findings (``executor.check_findings``).
"""

from __future__ import annotations

import shlex

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
    former_removed,
    not_ours,
    setting_absent,
)

_EOF = "NVIDIA_GPU_PLAN_EOF"


def _q(text: str) -> str:
    return shlex.quote(text)


def _is_ours(path: str, *, negate: bool = False) -> str:
    """A bash test: the file at host path ``path`` starts (``negate``: does not start) with our header, as the
    executor's ``startswith`` tests it."""
    local = f'"${{ROOT}}"{_q(path)}'
    return f'[[ "$(head -c {len(HEADER.encode())} {local})" {"!=" if negate else "=="} {_q(HEADER)} ]]'


def _with_var(message: str, var: str) -> str:
    """``message`` (made with :data:`_SLOT` where a value goes) as a bash word with ``var`` expanded there."""
    return f'"{var}"'.join(_q(part) if part else "" for part in message.split(_SLOT))


_SLOT = "\x00"


def render_checks(checks: tuple[Check, ...], *, toolkit_dir_var: str = "NVIDIA_GPU_TOOLKIT_DIR") -> str:
    """The bash checking ``checks``, calling the script's ``fail REASON MESSAGE`` for each one not met.
    ``toolkit_dir_var``: the environment variable naming a toolkit container's install, if any."""
    out = ["# Rendered from nvgpu.nodescripts.plan; the agent checks the same (node_agent.setup.executor)."]
    if any(isinstance(c, ModuleLoaded) for c in checks):
        # live_modules: what /sys/module says is live, on a kernel without /proc/modules (HAS_GPU defines it).
        modules_file = f'"${{ROOT}}"{_q(facts.PROC_MODULES)}'
        out += ["plan_modules_read=true",
                f"if [[ ! -e {modules_file} ]]; then",
                '  modules="$(live_modules)"',
                f'elif ! modules="$(cat {modules_file} 2>/dev/null)"; then',
                f"  fail {Reason.PROC_UNREADABLE.value} {_q(f'cannot read {facts.PROC_MODULES}')}",
                "  plan_modules_read=false",
                "fi"]
    for c in checks:
        if isinstance(c, ModuleLoaded):
            out += [f'if [[ "$plan_modules_read" == true ]] && ! grep -q {_q(f"^{c.name} ")} <<<"$modules"; then',
                    f"  fail {c.reason.value} {_q(c.message)}",
                    "fi"]
        elif isinstance(c, NodeExists):
            out += [f'if [[ ! -e "${{ROOT}}"{_q(c.path)} ]]; then',
                    f"  fail {c.reason.value} {_q(c.message)}",
                    "fi"]
        elif isinstance(c, GpuNodesExist):
            out += [f'for info in "${{ROOT}}"{_q(facts.NVIDIA_GPUS_PROC_DIR)}/*/information; do',
                    '  [[ -f "$info" ]] || continue',
                    r"""  minor="$(sed -nE 's/^Device Minor:[[:space:]]*([0-9]+).*/\1/p' "$info")" """.rstrip(),
                    '  if [[ -n "$minor" && ! -e "${ROOT}/dev/nvidia${minor}" ]]; then',
                    f"    fail {c.reason.value} {_with_var(c.message(_SLOT), '${minor}')}",
                    "  fi",
                    "done"]
        elif isinstance(c, ProgramInstalled):
            out += [f"programs=({' '.join(_q(p) for p in c.programs)})",
                    f'if [[ -n "${{{toolkit_dir_var}:-}}" ]]; then',
                    f'  programs+=("${{{toolkit_dir_var}%/}}/"{_q(c.in_toolkit_dir)})',
                    "fi",
                    "found=false",
                    'for p in "${programs[@]}"; do',
                    '  [[ -f "${ROOT}${p}" && -x "${ROOT}${p}" ]] && found=true',
                    "done",
                    'if [[ "$found" != true ]]; then',
                    r"""  list="$(printf '%s, ' "${programs[@]}")" """.rstrip(),
                    f"  fail {c.reason.value} {_with_var(c.message(_SLOT), '${list%, }')}",
                    "fi"]
    return "\n".join(out) + "\n"


def render_plan(plan: StepPlan, *, refuse: str = "") -> str:
    """The bash applying ``plan``. ``refuse``: the name of the script's function that refuses the step (it
    logs its argument and exits); needed when the plan has files."""
    if plan.files and not refuse:
        raise ValueError(f"step {plan.name}: a plan with files needs a refuse function")
    log = f"nvidia-gpu {plan.name}"
    out = [f"# Rendered from nvgpu.nodescripts.plan ({plan.name}); the agent applies the same plan "
           "(node_agent.setup.executor)."]
    for f in plan.files:
        local = f'"${{ROOT}}"{_q(f.path)}'
        out += [f"if [[ -f {local} ]] && {_is_ours(f.path, negate=True)}; then",
                f"  {refuse} {_q(not_ours(f.path))}",
                "fi"]
    for f in plan.files:
        if any(line == _EOF for line in f.content.splitlines()):
            raise ValueError(f"{f.path}: its content holds the here-document delimiter {_EOF}")
        out += [f"result=\"$(write_file \"${{ROOT}}\"{_q(f.path)} <<'{_EOF}'",
                f.content + _EOF,
                ')"',
                f'bb-log-info {_q(f"{log}: {f.path}")}" ${{result}}"']
    for former in plan.former_files:
        local = f'"${{ROOT}}"{_q(former.path)}'
        out += [f"if [[ -f {local} ]]; then",
                f"  if {_is_ours(former.path)}; then",
                f"    rm -f {local}",
                f"    bb-log-info {_q(f'{log}: {former_removed(former.path)}')}",
                "  else",
                f"    bb-log-warning {_q(f'{log}: {former_not_ours(former.path)}')}",
                "  fi",
                "fi"]
    if plan.settings:
        previous = f'"${{ROOT}}"{_q(plan.previous_file)}'
        out += [f"mkdir -p \"$(dirname {previous})\"",
                "# plan_setting NAME VALUE PATH: keep the value before our first change, then set it live.",
                "plan_setting() {",
                '  local name="$1" want="$2" path="${ROOT}$3" current',
                '  if [[ ! -f "$path" ]]; then',
                f'    bb-log-warning "{log}: $(printf {_q(setting_absent("%s"))} "$name")"',
                "    return 0",
                "  fi",
                '  current="$(<"$path")"',
                f'  if ! grep -q "^${{name}}=" {previous} 2>/dev/null; then',
                f'    echo "${{name}}=${{current}}" >>{previous}',
                "  fi",
                '  if [[ "$current" != "$want" ]]; then',
                '    echo "$want" >"$path"',
                "  fi",
                "}"]
        out += [f"plan_setting {_q(s.name)} {_q(s.value)} {_q(s.proc_path)}" for s in plan.settings]
    if plan.modules or plan.requirements:
        out.append("plan_problems=()")
    for m in plan.modules:
        local = f'"${{ROOT}}"{_q(m.sys_path)}'
        out += [f"if [[ ! -d {local} ]]; then",
                f"  if ! timeout -k 5 {facts.MODPROBE_TIMEOUT_S} modprobe {_q(m.name)} >/dev/null 2>&1 "
                f"|| [[ ! -d {local} ]]; then",
                f"    plan_problems+=({_q(m.problem)})",
                "  fi",
                "fi"]
    for r in plan.requirements:
        out += [f'plan_entries=("${{ROOT}}"{_q(r.path)}/*)',
                'if [[ ! -e "${plan_entries[0]}" ]]; then',
                f"  plan_problems+=({_q(r.problem)})",
                "fi"]
    return "\n".join(out) + "\n"
