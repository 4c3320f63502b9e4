"""The bash interpreter of node-setup plans (``nvgpu.nodescripts.plan``): a plan rendered as the part of a
Deckhouse script that applies it.

Why: the agent applies the same plan with ``node_agent.setup.executor``; rendering the bash from the plan (and
not writing it by hand beside the Python) is what keeps the two backends alike. The output is straight-line
bash, one block per item of the plan, in the executor's order; it uses what the script's templates define
(``$ROOT``, ``write_file``, the ``bb-log-*`` functions) and, for a plan with files, a function the caller names
(``refuse``) that is called with the message when a managed file's path holds someone else's file, before
anything is changed. Modules and requirements leave their problems in the array ``plan_problems``.

A :class:`~nvgpu.nodescripts.plan.ChosenFile` renders with :func:`render_chosen` as an ``if``/``elif`` over the
facts, which the script detects first into ``fact_<name>`` variables.

A :class:`~nvgpu.nodescripts.plan.MarkedBlock` renders with :func:`render_block` as an awk edit piped into
``write_file``, the executor's ``block_edited`` line for line.

The check's items on what it found out before (``plan.DRIVER_CHECKS`` ...) render with
:func:`render_input_checks`, reading the variables :data:`INPUTS` names (the agent's ``executor.CheckInputs``).

The node check's requirements (``plan.HOST_CHECKS``, ``plan.RUNTIME_CHECKS``) render with :func:`render_checks`
as calls of the check's ``fail REASON MESSAGE``, the agent's findings (``executor.check_findings``).

A :class:`~nvgpu.nodescripts.plan.DevicePlan` renders with :func:`render_devices` as the module loads, the list
of wanted nodes and the ``mknod`` loop the agent's ``executor.apply_devices`` runs; the script's frame
(``templates.DEVICES``) holds the lock, the journal's writer and the result line.
"""

from __future__ import annotations

import re
import shlex

from nvgpu.nodescripts import facts
from nvgpu.nodescripts.content import HEADER
from nvgpu.nodescripts.facts import Reason
from nvgpu.nodescripts.plan import (
    SLOT_RE,
    CapNodes,
    Check,
    ChosenFile,
    ComputeAtLeast,
    ControlNode,
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
    NodeExists,
    ProgramInstalled,
    StepPlan,
    VirtualizationAllowed,
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


def _slotted(text: str, names: dict[str, str] | None = None) -> str:
    """``text`` as one bash word, its ``${name}`` slots expanded from the variables ``names`` maps them to
    (default: ``fact_<name>``)."""
    parts = SLOT_RE.split(text)  # literal, name, literal, name, ...
    words = [f'"${{{(names or {}).get(part, f"fact_{part}")}}}"' if i % 2 else _q(part)
             for i, part in enumerate(parts) if part or i % 2]
    return "".join(words) or "''"


def render_chosen(item: ChosenFile, *, refuse: str) -> str:
    """The bash choosing and writing ``item``'s file from the ``fact_<name>`` variables, as the agent's
    ``executor.choose`` does: ``refuse`` (the script's function, which logs its argument and exits) for a
    refusing case and for a path holding someone else's file; otherwise ``plan_path`` is the host path and
    ``plan_result`` is ``changed``, ``unchanged`` or ``skipped`` (nothing written)."""
    out = [f"# Rendered from nvgpu.nodescripts.plan ({item.log}); the agent chooses the same "
           "(node_agent.setup.executor.choose).",
           'plan_path=""',
           'plan_result=""']
    for i, case in enumerate(item.cases):
        cond = " && ".join(f'[[ "${{fact_{name}}}" == {_q(value)} ]]' for name, value in case.when) or "true"
        out.append(f"{'elif' if i else 'if'} {cond}; then")
        if case.refuse:
            out.append(f"  {refuse} {_slotted(case.refuse)}")
            continue
        local = f'"${{ROOT}}"{_q(case.path)}'
        out += [f"  plan_path={_q(case.path)}",
                f"  if [[ -f {local} ]] && {_is_ours(case.path, negate=True)}; then",
                f"    {refuse} {_q(not_ours(case.path))}",
                "  fi"]
        if case.note:
            out.append(f"  bb-log-warning {_q(item.log + ': ')}{_slotted(case.note)}")
        if case.content is None:
            out.append("  plan_result=skipped")
        else:
            out.append(f"  plan_result=\"$(printf '%s' {_slotted(case.content)} | write_file {local})\"")
    out.append("fi")
    return "\n".join(out) + "\n"


def _awk_string(text: str, slot: str) -> str:
    """``text`` as an awk expression: a string literal, its ``${slot}`` the awk variable ``value``."""
    def lit(part: str) -> str:
        return '"' + part.replace("\\", "\\\\").replace('"', '\\"') + '"'
    parts = text.split(f"${{{slot}}}")
    return " value ".join(lit(p) for p in parts)


def render_block(item: MarkedBlock) -> str:
    """The bash applying ``item`` (its table key's slot from ``fact_<slot>``): ``plan_result`` is ``changed`` or
    ``unchanged``. Meant for a function's body that declares ``plan_result`` local."""
    target = f'"${{ROOT}}"{_q(item.path)}'
    tk = item.table_key
    if any("'" in x for x in (item.begin, item.end, item.disabled_prefix)):
        raise ValueError(f"{item.path}: a marker with a quote")
    awk = ["$0 == begin { inside = 1; next }",
           "inside { if ($0 == end) inside = 0; next }",
           "index($0, off) == 1 { $0 = substr($0, length(off) + 1) }",
           "{ header = 0 }",
           f"/{item.table_ere}/ {{ tables = 1; header = 1"
           + (f"; intable = ($0 ~ /{tk.table_ere}/)" if tk else "") + " }",
           f"!tables && /{item.root_keys_ere}/ {{ $0 = off $0 }}"]
    value = ""
    if tk:
        line = _awk_string(tk.line, tk.slot)
        value = f' -v value="${{fact_{tk.slot}}}"'
        awk += [f'value != "" && intable && !header && /{tk.key_ere}/ {{ $0 = off $0 }}',
                "{ print }",
                f"value != \"\" && header && intable && !seen {{ print begin; print {line}; print end; seen = 1 }}",
                f'END {{ if (value != "" && !seen) {{ print begin; print {_awk_string(tk.header, tk.slot)}; '
                f"print {line}; print end }} }}"]
    else:
        awk.append("{ print }")
    program = "\n".join(f"        {a}" for a in awk)
    out = [f"# Rendered from nvgpu.nodescripts.plan ({item.path}); the agent makes the same edit "
           "(node_agent.setup.executor.block_edited).",
           'plan_result="$(',
           "  {",
           f"    printf '%s\\n' {' '.join(_q(line) for line in item.lines)}",
           f"    if [[ -f {target} ]]; then",
           f"      awk -v begin={_q(item.begin)} -v end={_q(item.end)} -v off={_q(item.disabled_prefix)}{value} '",
           program,
           f"      ' {target}"]
    if tk:
        out += [f'    elif [[ -n "${{fact_{tk.slot}}}" ]]; then',
                f"      printf '%s\\n' {_q(item.begin)} {_q(tk.header)} "
                f"{_slotted(tk.line)} {_q(item.end)}"]
    out += ["    fi",
            f"  }} | write_file {target}",
            ')"']
    return "\n".join(out) + "\n"


#: The check's variables the input checks read: the loaded driver (empty: not read), the version file's first
#: line, the declared driver, kernel modules and driver type (empty: not declared), the GPUs' virtualization
#: modes (one a line), the driver their models require, the GPUs' compute capabilities (``CC|NAME`` lines) and
#: fabric registrations (``STATE|STATUS|NAME`` lines).
#: ``version_to_int`` is the check's too.
INPUTS = {"driver": "driver", "driver_line": "first_line", "declared_driver": "EXPECT_DRIVER",
          "declared_modules": "EXPECT_MODULES", "driver_type": "EXPECT_DRIVER_TYPE", "modes": "gpu_modes",
          "required": "min_driver", "computes": "gpu_computes", "fabrics": "gpu_fabrics"}


def render_input_checks(checks: tuple[InputCheck, ...]) -> str:
    """The bash judging ``checks`` on the check's variables (:data:`INPUTS`), calling ``fail REASON MESSAGE``
    for each finding, in the executor's ``input_findings`` order."""
    v = {k: f"${{{name}:-}}" for k, name in INPUTS.items()}
    out = ["# Rendered from nvgpu.nodescripts.plan; the agent judges the same (node_agent.setup.executor)."]
    for c in checks:
        if isinstance(c, DriverDeclared):
            names = {"driver": INPUTS["driver"], "declared": INPUTS["declared_driver"]}
            out += [f'if [[ -n "{v["driver"]}" && -n "{v["declared_driver"]}" ]]; then',
                    f'  if [[ "{v["declared_driver"]}" == *.* ]]; then',
                    f'    if (($(version_to_int "{v["driver"]}") != $(version_to_int "{v["declared_driver"]}"))); then',
                    f"      fail {c.reason.value} {_slotted(c.release_message, names)}",
                    "    fi",
                    f'  elif [[ "${{{INPUTS["driver"]}%%.*}}" != "{v["declared_driver"]}" ]]; then',
                    f"    fail {c.reason.value} {_slotted(c.branch_message, names)}",
                    "  fi",
                    "fi"]
        elif isinstance(c, ModulesDeclared):
            names = {"loaded": "plan_loaded_modules", "declared": INPUTS["declared_modules"]}
            out += [f'if [[ -n "{v["driver"]}" && -n "{v["declared_modules"]}" ]]; then',
                    "  plan_loaded_modules=proprietary",
                    f'  if grep -qiF {_q(c.open_marker)} <<<"{v["driver_line"]}"; then',
                    "    plan_loaded_modules=open",
                    "  fi",
                    f'  if [[ "$plan_loaded_modules" != "{v["declared_modules"]}" ]]; then',
                    f"    fail {c.reason.value} {_slotted(c.message, names)}",
                    "  fi",
                    "fi"]
        elif isinstance(c, VirtualizationAllowed):
            names = {"mode": "plan_mode", "driver_type": INPUTS["driver_type"], "allowed": "plan_allowed_text"}
            out += [f'if [[ -n "{v["driver_type"]}" ]]; then',
                    "  plan_allowed=()",
                    f'  case "{v["driver_type"]}" in']
            out += [f"    {_q(t)}) plan_allowed=({' '.join(_q(m) for m in modes)}) ;;" for t, modes in c.modes]
            out += ["  esac",
                    """  plan_allowed_text="$(printf '%s or ' "${plan_allowed[@]}")\"""",
                    '  plan_allowed_text="${plan_allowed_text% or }"',
                    "  while IFS= read -r plan_mode; do",
                    f'    [[ -n "$plan_mode" && "$plan_mode" != {_q(c.unknown)} ]] || continue',
                    "    plan_fits=false",
                    '    for a in "${plan_allowed[@]}"; do',
                    '      if [[ "$plan_mode" == "$a" ]]; then plan_fits=true; fi',
                    "    done",
                    '    if [[ "$plan_fits" != true ]]; then',
                    f"      fail {c.reason.value} {_slotted(c.message, names)}",
                    "    fi",
                    f'  done < <(sort -u <<<"{v["modes"]}")',
                    "fi"]
        elif isinstance(c, ComputeAtLeast):
            names = {"gpu": "plan_gpu", "cc": "plan_cc", "minimum": "plan_minimum"}
            major, minor = c.minimum
            out += [f"plan_minimum={_q(c.minimum_text)}",
                    "while IFS='|' read -r plan_cc plan_gpu; do",
                    '  [[ -n "$plan_gpu" ]] || continue',
                    r'  if [[ ! "$plan_cc" =~ ^[0-9]+\.[0-9]+$ ]] '
                    f"|| ((10#${{plan_cc%%.*}} * 1000 + 10#${{plan_cc#*.}} < {major * 1000 + minor})); then",
                    f"    fail {c.reason.value} {_slotted(c.message, names)}",
                    "  fi",
                    f'done <<<"{v["computes"]}"']
        elif isinstance(c, FabricReady):
            names = {"gpu": "plan_gpu", "state": "plan_state", "status": "plan_status"}
            not_ready = " || ".join(f'"$plan_state" == {_q(st)}' for st in c.not_ready)
            out += ["while IFS='|' read -r plan_state plan_status plan_gpu; do",
                    '  [[ -n "$plan_gpu" ]] || continue',
                    f"  if [[ {not_ready} ]]; then",
                    f"    fail {c.reason.value} {_slotted(c.not_ready_message, names)}",
                    f'  elif [[ "$plan_state" == {_q(c.done)} && "$plan_status" != {_q(c.ok)} ]]; then',
                    f"    fail {c.reason.value} {_slotted(c.failed_message, names)}",
                    "  fi",
                    f'done <<<"{v["fabrics"]}"']
        elif isinstance(c, DriverAtLeast):
            names = {"driver": INPUTS["driver"], "required": INPUTS["required"]}
            out += [f'if [[ -n "{v["driver"]}" && -n "{v["required"]}" ]] '
                    f'&& (($(version_to_int "{v["driver"]}") < $(version_to_int "{v["required"]}"))); then',
                    f"  fail {c.reason.value} {_slotted(c.message, names)}",
                    "fi"]
    return "\n".join(out) + "\n"


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


def _proc_major() -> list[str]:
    """``proc_major NAME...``: the character-device major of the first NAME ``/proc/devices`` lists (its
    ``Character devices:`` section only, as nvidia-container-toolkit ``internal/info/proc/devices/devices.go`` and
    the agent's ``parse_proc_devices`` read it); fails when none is listed."""
    return ["# proc_major NAME...: the character-device major of the first NAME /proc/devices lists (its \"Character",
            "# devices:\" section only, as the agent's node_agent.host.proc.parse_proc_devices reads it).",
            "proc_major() {",
            "  local name m",
            '  for name in "$@"; do',
            "    m=\"$(awk -v n=\"$name\" '",
            '      /^[^[:space:][:digit:]].*:$/ { chars = ($0 == "Character devices:"); next }',
            "      chars && NF == 2 && $1 ~ /^[0-9]+$/ && $2 == n { print $1 + 0; exit }' \\",
            f'      "${{ROOT}}"{_q(facts.PROC_DEVICES)} 2>/dev/null || true)"',
            '    if [[ -n "$m" ]]; then',
            '      echo "$m"',
            "      return 0",
            "    fi",
            "  done",
            "  return 1",
            "}"]


def _plain(path: str) -> str:
    """``path`` as it goes into a double-quoted word of the script's list of nodes (one word, nothing to expand)."""
    if not re.fullmatch(r"[A-Za-z0-9/._-]+", path):
        raise ValueError(f"{path!r}: a device node's path is a plain word in the script's list")
    return path


def render_devices(plan: DevicePlan, *, fail: str) -> str:
    """The bash applying ``plan`` as the agent's ``executor.apply_devices`` does (``load_modules``, no MIG
    instances: those are the agent's MIG manager's): each module loaded, then the wanted nodes listed in
    ``plan_wanted`` (``PATH MAJOR MINOR MODE``), then each absent one made. ``fail``: the script's function that
    logs its argument and ends the step. The script defines ``journal_open`` (called once before the first node
    is made: it reads the journal, ``fail`` when it is not one the script can extend) and ``journal_record PATH``
    (records PATH before it is made), and declares the arrays ``plan_loaded`` and ``plan_made``, which this
    appends the modules loaded and the nodes made to."""
    log = f"{plan.log}: "
    out = [f"# Rendered from nvgpu.nodescripts.plan ({plan.name}); the agent applies the same plan",
           "# (node_agent.setup.executor.apply_devices)."]
    modules_file = f'"${{ROOT}}"{_q(facts.PROC_MODULES)}'
    for m in plan.modules:
        out += [f"# {m.name}, when {m.when} is loaded and it is not (a node without the driver is left to the check).",
                f"if [[ -e {modules_file} ]]; then",
                f'  plan_modules="$(cat {modules_file} 2>/dev/null || true)"',
                "else",
                '  plan_modules="$(live_modules)"  # a kernel without loadable-module support (no /proc/modules)',
                "fi",
                f'if grep -q {_q(f"^{m.when} ")} <<<"$plan_modules" && '
                f'! grep -q {_q(f"^{m.loaded_name} ")} <<<"$plan_modules"; then',
                "  if ! command -v modprobe >/dev/null 2>&1; then",
                f"    {fail} {_q(m.not_found)}",
                "  fi",
                "  plan_rc=0",
                f'  plan_out="$(timeout -k 5 {facts.MODPROBE_TIMEOUT_S} modprobe {_q(m.name)} 2>&1)" || plan_rc=$?',
                "  if ((plan_rc == 124 || plan_rc == 137)); then",
                f"    {fail} {_q(m.timed_out)}",
                "  elif ((plan_rc != 0)); then",
                """    plan_out="$(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' <<<"$plan_out")\"""",
                '    if [[ -z "$plan_out" ]]; then',
                f"      plan_out={_q(m.no_output)}",
                "    fi",
                f"    {fail} {_slotted(m.failed, {'rc': 'plan_rc', 'output': 'plan_out'})}",
                "  fi",
                f"  plan_loaded+=({_q(m.name)})",
                "fi"]
    if plan.nodes:
        out += _proc_major()
    out.append("plan_wanted=()")
    for item in plan.nodes:
        if isinstance(item, ControlNode):
            out += [f"if plan_major=\"$(proc_major {' '.join(_q(n) for n in item.majors)})\"; then",
                    f'  plan_wanted+=("{_plain(item.path)} ${{plan_major}} {item.minor} {item.mode:04o}")',
                    "else",
                    f"  bb-log-warning {_q(log + item.missing)}",
                    "fi"]
        elif isinstance(item, GpuNodes):
            out += [f"if plan_major=\"$(proc_major {' '.join(_q(n) for n in item.majors)})\"; then",
                    "  while read -r plan_minor; do",
                    '    if [[ -n "$plan_minor" ]]; then',
                    f'      plan_wanted+=("{_plain(item.prefix)}${{plan_minor}} ${{plan_major}} ${{plan_minor}} '
                    f'{item.mode:04o}")',
                    "    fi",
                    "  done < <(",
                    f'    for info in "${{ROOT}}"{_q(facts.NVIDIA_GPUS_PROC_DIR)}/*/information; do',
                    '      if [[ -f "$info" ]]; then',
                    r"""        sed -nE 's/^Device Minor:[[:space:]]*([0-9]+).*/\1/p' "$info" | head -n1""",
                    "      fi",
                    "    done | sort -n -u",
                    "  )",
                    "fi"]
        elif isinstance(item, CapNodes):
            minors = f'"${{ROOT}}"{_q(item.minors_file)}'
            caps = " ".join(f"{key}:{mode:04o}" for key, mode in item.modes)
            out += [f"# The caps nodes {', '.join(k for k, _ in item.modes)}, their minors from mig-minors (its last "
                    "line for a key,",
                    "# as the agent's parse_mig_minors keeps it).",
                    f'if plan_major="$(proc_major {_q(item.major)})" && [[ -r {minors} ]]; then',
                    f"  for plan_cap in {caps}; do",
                    """    plan_minor="$(awk -v k="${plan_cap%%:*}" """
                    """'NF == 2 && $1 == k && $2 ~ /^[0-9]+$/ { m = $2 + 0 } END { print m }' \\""",
                    f"      {minors})\"",
                    '    if [[ -n "$plan_minor" ]]; then',
                    f'      plan_wanted+=("{_plain(item.directory)}/nvidia-cap${{plan_minor}} ${{plan_major}} '
                    '${plan_minor} ${plan_cap#*:}")',
                    "    fi",
                    "  done",
                    "fi"]
    names = {"path": "plan_path", "major": "plan_major", "minor": "plan_minor", "why": "plan_why"}
    out += ["# Make what is absent (something already there, whoever made it, is left as it is: nvdevices' mknod.go).",
            "journal_open",
            'for plan_node in "${plan_wanted[@]}"; do',
            '  read -r plan_path plan_major plan_minor plan_mode <<<"$plan_node"',
            '  if [[ -e "${ROOT}${plan_path}" || -L "${ROOT}${plan_path}" ]]; then',
            "    continue",
            "  fi",
            '  journal_record "$plan_path"',
            '  mkdir -p "$(dirname "${ROOT}${plan_path}")"',
            '  if ! plan_err="$(mknod -m "$plan_mode" "${ROOT}${plan_path}" c "$plan_major" "$plan_minor" 2>&1)"; then',
            '    if [[ -e "${ROOT}${plan_path}" ]]; then',
            "      continue # made by someone else meanwhile",
            "    fi",
            '    plan_why="${plan_err##*: }"',
            f"    {fail} {_slotted(plan.cannot_make, names)}",
            "  fi",
            '  plan_made+=("$plan_path")',
            "done"]
    return "\n".join(out) + "\n"
