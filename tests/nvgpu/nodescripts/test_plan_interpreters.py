"""The two interpreters of node-setup plans on the same plans and the same fake hosts: the agent's executor
(``node_agent.setup.executor``) and the bash rendering (``nvgpu.nodescripts.bashplan``) leave identical files,
live settings and rollback state, load the same modules, find the same problems and refuse alike.

Parity of the converted steps (sysctl, VFIO, the runtime's drop-in, the toolkit config's block, the device nodes)
holds by construction once the interpreters agree; so these tests run every kind of plan item, on the real step
plans and on one plan that holds all of them. The device plans run inside the script's own frame
(``templates.DEVICES``: its lock, journal writer and result line), so the journal is compared byte for byte too.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from node_agent.host import CommandNotFound, CommandResult, CommandTimeout, HostError, HostRoot, NotOurs
from node_agent.host.proc import parse_mig_minors
from node_agent.setup import executor
from nvgpu.driver import DriverExpectation, DriverType, DriverVersion, KernelModules
from nvgpu.nodescripts import facts, plan, templates
from nvgpu.nodescripts.bashplan import (
    INPUTS,
    render_block,
    render_checks,
    render_chosen,
    render_devices,
    render_input_checks,
    render_plan,
)
from nvgpu.nodescripts.content import HEADER
from nvgpu.nodescripts.plan import FormerFile, KernelModule, KernelSetting, ManagedFile, NonEmptyDir, StepPlan
from nvgpu.nodescripts.render import _common, _fill
from nvml_sim.host import CAPS_MAJOR, NVIDIA_MAJOR, device_node_stand_in
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.recording_exec import Call, RecordingExec

#: Every kind of item: two files, a former name, a setting the kernel has and one it lacks, a loadable and an
#: unloadable module (the fake host's modprobe refuses ``vfio_pci`` where asked), a requirement.
EVERYTHING = StepPlan(
    name="plantest",
    files=(ManagedFile("/etc/nvidia-gpu-plan/a.conf", f"{HEADER}\na = 1\n"),
           ManagedFile("/etc/sysctl.d/zz-plan.conf", f"{HEADER}\nb = 'two' # \"$HOME\" stays as it is\n")),
    former_files=(FormerFile("/etc/nvidia-gpu-plan/old.conf"),),
    settings=(KernelSetting("net.core.bpf_jit_harden", "1"), KernelSetting("kernel.not_on_this_kernel", "0")),
    previous_file=f"{facts.STATE_DIR}/plantest.previous",
    modules=(KernelModule("vfio"), KernelModule("vfio_pci")),
    requirements=(NonEmptyDir(facts.IOMMU_GROUPS_DIR, "iommu-off"),),
)
PLANS = {"everything": EVERYTHING, "sysctl": plan.SYSCTL, "vfio": plan.VFIO}


def _script(p: StepPlan) -> str:
    return "\n".join([
        "#!/usr/bin/env bash", "set -Eeuo pipefail", 'ROOT="${NVIDIA_GPU_ROOT%/}"',
        'bb-log-info() { echo "INFO: $*" >&2; }', 'bb-log-warning() { echo "WARNING: $*" >&2; }',
        templates.WRITE_FILE, 'plan_refuse() { echo "refused: $1"; exit 3; }',
        render_plan(p, refuse="plan_refuse"),
        'echo "problems=$(IFS=,; echo "${plan_problems[*]}")"' if p.modules or p.requirements else 'echo "problems="',
    ])


def _bash(host: FakeHost, p: StepPlan, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{p.name}.sh"
    path.write_text(_script(p))
    return subprocess.run(["bash", str(path)], env=host.env(), capture_output=True, text=True, timeout=60,
                          check=False)


def _state(host: FakeHost, p: StepPlan) -> tuple[object, ...]:
    """What a plan may change: /etc, the live settings, the previous values, the modules modprobe'd."""
    def read(path: str) -> str | None:
        local = host.path(path)
        return local.read_text() if local.is_file() else None

    return (host.snapshot("/etc"), [read(s.proc_path) for s in p.settings],
            read(p.previous_file) if p.previous_file else None, host.log("modprobe"))


def _hosts(tmp_path: Path, **options: Any) -> tuple[FakeHost, FakeHost]:
    return (build_fake_host(tmp_path / "bash", "a30x4", modules=("nvidia", "nvidia_uvm"), **options),
            build_fake_host(tmp_path / "agent", "a30x4", modules=("nvidia", "nvidia_uvm"), **options))


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("odd", [False, True], ids=["good-host", "iommu-off-vfio-pci-unloadable"])
def test_the_interpreters_leave_the_same_host(name: str, odd: bool, tmp_path: Path) -> None:
    p = PLANS[name]
    options: dict[str, Any] = {"iommu": False, "unloadable_modules": ("vfio_pci",)} if odd else {}
    by_bash, by_agent = _hosts(tmp_path, **options)
    for host in (by_bash, by_agent):  # a former file of ours, to migrate
        for former in p.former_files:
            host.put(former.path, f"{HEADER}\nold = 1\n")
    ran = _bash(by_bash, p, tmp_path)
    assert ran.returncode == 0, ran.stderr
    done = executor.apply_plan(HostRoot(by_agent.root), p)
    assert ran.stdout.splitlines()[-1] == f"problems={','.join(done.problems)}"
    assert _state(by_bash, p) == _state(by_agent, p)
    for note in done.notes:
        assert note in ran.stderr, "worded alike"
    # Again: nothing more changes on either side.
    again = _bash(by_bash, p, tmp_path)
    assert "changed" not in again.stderr.replace("unchanged", "")
    assert executor.apply_plan(HostRoot(by_agent.root), p).changed_files == []
    assert _state(by_bash, p) == _state(by_agent, p)


@pytest.mark.parametrize("name", ["everything", "sysctl"])
def test_a_file_not_ours_is_refused_alike_and_nothing_changes(name: str, tmp_path: Path) -> None:
    p = PLANS[name]
    by_bash, by_agent = _hosts(tmp_path)
    for host in (by_bash, by_agent):
        host.put(p.files[-1].path, "# an operator's own\n")
    before = _state(by_agent, p)
    ran = _bash(by_bash, p, tmp_path)
    with pytest.raises(NotOurs) as refused:
        executor.apply_plan(HostRoot(by_agent.root), p)
    assert ran.returncode == 3 and ran.stdout.strip() == f"refused: {refused.value}"
    assert _state(by_bash, p) == _state(by_agent, p) == before


@pytest.mark.parametrize("name", ["everything", "sysctl"])
def test_a_former_name_not_ours_is_left_alike(name: str, tmp_path: Path) -> None:
    p = PLANS[name]
    by_bash, by_agent = _hosts(tmp_path)
    for host in (by_bash, by_agent):
        host.put(p.former_files[0].path, "kernel.foo = 1\n")
    ran = _bash(by_bash, p, tmp_path)
    done = executor.apply_plan(HostRoot(by_agent.root), p)
    assert _state(by_bash, p) == _state(by_agent, p)
    assert by_agent.path(p.former_files[0].path).read_text() == "kernel.foo = 1\n"
    assert any("left alone" in n and n in ran.stderr for n in done.notes)


@pytest.mark.parametrize("name", ["everything", "sysctl"])
def test_the_agent_rolls_back_what_the_script_applied(name: str, tmp_path: Path) -> None:
    """The scripts have no teardown: the agent's rollback undoes their apply (no journal) as its own."""
    p = PLANS[name]
    by_bash, _ = _hosts(tmp_path)
    before = _state(by_bash, p)
    assert _bash(by_bash, p, tmp_path).returncode == 0
    assert _state(by_bash, p)[:3] != before[:3]
    executor.rollback_plan(HostRoot(by_bash.root), p)
    assert _state(by_bash, p)[:3] == before[:3]


def _checks_script(checks: tuple[plan.Check, ...]) -> str:
    return "\n".join([
        "#!/usr/bin/env bash", "set -Eeuo pipefail", 'ROOT="${NVIDIA_GPU_ROOT%/}"',
        _fill(templates.HAS_GPU, _common("")),  # live_modules, which the module checks use
        'fail() { printf "%s|%s\\n" "$1" "$2"; }',
        render_checks(checks),
    ])


_CHECK_HOSTS: dict[str, dict[str, Any]] = {
    "good": {},
    "modules-missing": {"modules": ("nvidia_modeset",)},
    "device-nodes-missing": {"device_nodes": False},
    "fresh-boot": {"fresh_boot": True},
    "no-toolkit": {"nvidia_container_runtime": False},
}


@pytest.mark.parametrize("toolkit_dir", [None, "/usr/local/nvidia/toolkit/"], ids=["own-toolkit", "toolkit-dir"])
@pytest.mark.parametrize("case", [*sorted(_CHECK_HOSTS), "no-proc-modules"])
def test_the_check_requirements_are_found_alike(case: str, toolkit_dir: str | None, tmp_path: Path) -> None:
    """``plan.HOST_CHECKS`` and ``plan.RUNTIME_CHECKS``: the same findings, worded alike, in the same order."""
    host = build_fake_host(tmp_path / "host", "l4x2", **_CHECK_HOSTS.get(case, {}))
    if case == "no-proc-modules":
        host.path("/proc/modules").unlink()
    checks = (*plan.HOST_CHECKS, *plan.RUNTIME_CHECKS)
    script = tmp_path / "checks.sh"
    script.write_text(_checks_script(checks))
    env = host.env(**({"NVIDIA_GPU_TOOLKIT_DIR": toolkit_dir} if toolkit_dir else {}))
    ran = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    by_bash = [tuple(line.split("|", 1)) for line in ran.stdout.splitlines()]
    by_agent = [(r.value, m) for r, m in executor.check_findings(HostRoot(host.root), checks, toolkit_dir=toolkit_dir)]
    assert by_bash == by_agent
    assert bool(by_agent) is (case not in {"good", "no-proc-modules"}), by_agent


def _runtime_facts(**over: str) -> dict[str, str]:
    base = {"runtime": "containerd", "crio_markers": "", "containerd_version": "2", "deckhouse": "true",
            "systemd_cgroup": "true", "nvidia_runtime": "true", "binary": facts.NVIDIA_CONTAINER_RUNTIME, "conmon": ""}
    return {**base, **over}


#: Every case of ``plan.RUNTIME_DROPIN``, and a toolkit container's binary in the slots.
_RUNTIME_CASES = {
    "both": _runtime_facts(runtime="both", crio_markers="/etc/crio/crio.conf, /usr/bin/crio"),
    "none": _runtime_facts(runtime="none"),
    "crio-no-nvidia-runtime": _runtime_facts(runtime="crio", nvidia_runtime="false"),
    "crio-no-conmon": _runtime_facts(runtime="crio"),
    "crio-conmon": _runtime_facts(runtime="crio", conmon="/usr/bin/conmon"),
    "crio-toolkit-dir": _runtime_facts(runtime="crio", binary="/usr/local/nvidia/toolkit/nvidia-container-runtime"),
    **{f"containerd{v}-systemd-{s}-nvidia-{n}": _runtime_facts(containerd_version=v, systemd_cgroup=s, nvidia_runtime=n)
       for v in ("2", "3") for s in ("true", "false") for n in ("true", "false")},
    "containerd-plain": _runtime_facts(deckhouse="false"),
    "containerd-version-1": _runtime_facts(containerd_version="1"),
}


def _chosen_script(detected: dict[str, str]) -> str:
    return "\n".join([
        "#!/usr/bin/env bash", "set -Eeuo pipefail", 'ROOT="${NVIDIA_GPU_ROOT%/}"',
        'bb-log-info() { echo "INFO: $*" >&2; }', 'bb-log-warning() { echo "WARNING: $*" >&2; }',
        templates.WRITE_FILE, 'runtime_refuse() { echo "refused: $1"; exit 3; }',
        *(f"fact_{name}={shlex.quote(value)}" for name, value in detected.items()),
        render_chosen(plan.RUNTIME_DROPIN, refuse="runtime_refuse"),
        'echo "path=${plan_path} result=${plan_result}"',
    ])


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("foreign", [False, True], ids=["fresh", "foreign-file"])
@pytest.mark.parametrize("case", sorted(_RUNTIME_CASES))
def test_a_chosen_file_is_chosen_written_and_refused_alike(case: str, foreign: bool, tmp_path: Path) -> None:
    """``plan.RUNTIME_DROPIN`` on the same facts: the script's case and the agent's ``choose`` write the same
    file, log the same note, refuse with the same message (also for a path holding someone else's file)."""
    detected = _RUNTIME_CASES[case]
    by_bash, by_agent = tmp_path / "bash", tmp_path / "agent"
    chosen = executor.choose(plan.RUNTIME_DROPIN, detected)
    for root in (by_bash, by_agent):
        root.mkdir()
        if foreign and chosen.path:
            (root / chosen.path.lstrip("/")).parent.mkdir(parents=True)
            (root / chosen.path.lstrip("/")).write_text("# an operator's own\n")
    script = tmp_path / "chosen.sh"
    script.write_text(_chosen_script(detected))
    ran = subprocess.run(["bash", str(script)], env={"NVIDIA_GPU_ROOT": str(by_bash), "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, timeout=60, check=False)
    host = HostRoot(by_agent)
    refusal = chosen.refuse
    if not refusal:
        try:
            executor.read_ours(host, chosen.path)
        except NotOurs as e:
            refusal = str(e)
    if refusal:
        assert (ran.returncode, ran.stdout.strip()) == (3, f"refused: {refusal}")
    else:
        assert ran.returncode == 0, ran.stderr
        if chosen.content is not None:
            host.write_atomic(chosen.path, chosen.content)
        result = "skipped" if chosen.content is None else "changed"
        assert ran.stdout.splitlines()[-1] == f"path={chosen.path} result={result}"
        assert (chosen.note in ran.stderr) if chosen.note else "WARNING" not in ran.stderr
    assert _files(by_bash) == _files(by_agent)
    assert bool(chosen.refuse) is (case in {"both", "none", "containerd-plain", "containerd-version-1"})
    assert chosen.agent_layout is (case == "containerd-plain")


def test_a_chosen_files_paths_are_what_rollback_removes() -> None:
    assert plan.RUNTIME_DROPIN.paths == tuple(sorted({
        *(f"{d}/{facts.RUNTIME_DROPIN_NAME}" for d in facts.DECKHOUSE_DROPIN_DIRS.values()), facts.CRIO_DROPIN}))


#: Like the toolkit package's config (its root keys commented out, its tables).
_PACKAGE = (f"#{facts.TOOLKIT_ENVVAR_KEY} = true\ndisable-require = false\n\n[nvidia-container-cli]\n"
            '#root = "/run/nvidia/driver"\nload-kmods = true\n\n[nvidia-container-runtime]\nlog-level = "info"\n')
#: Files the toolkit config edit meets: none, the package's, one with our keys set and a cli table with its own
#: root, one edited before (our block and disabled lines already there), one with no final newline.
_BLOCK_TEXTS: dict[str, str | None] = {
    "absent": None,
    "empty": "",
    "package": _PACKAGE,
    "admin": (f"{facts.TOOLKIT_ENVVAR_KEY} = true\n  {facts.TOOLKIT_VOLUME_MOUNTS_KEY}=false\ndisable-require = false\n"
              '\n[nvidia-container-cli]\nroot = "/"\nload-kmods = true\n[nvidia-container-runtime]\nroot = "x"\n'),
    "edited-before": None,  # the package's, edited with the other choice and a driver root
    "no-final-newline": "# only a comment",
}


@pytest.mark.parametrize("driver_root", ["", "/run/nvidia/driver"], ids=["host-root", "driver-container"])
@pytest.mark.parametrize("accept_envvar", [False, True])
@pytest.mark.parametrize("case", sorted(_BLOCK_TEXTS))
def test_a_marked_block_is_edited_alike(case: str, accept_envvar: bool, driver_root: str, tmp_path: Path) -> None:
    """``plan.toolkit_config``: the awk the script runs and the agent's ``block_edited`` leave the same bytes;
    applying it again changes nothing; ``block_restored`` gives the file back as it was."""
    item = plan.toolkit_config(accept_envvar)
    text = _BLOCK_TEXTS[case]
    if case == "edited-before":
        text = executor.block_edited(plan.toolkit_config(not accept_envvar), _PACKAGE,
                                     {"driver_root": "/run/other"})
    detected = {"driver_root": driver_root}
    local = tmp_path / item.path.lstrip("/")
    local.parent.mkdir(parents=True)
    if text is not None:
        local.write_text(text)
    script = tmp_path / "block.sh"
    script.write_text("\n".join([
        "#!/usr/bin/env bash", "set -Eeuo pipefail", 'ROOT="${NVIDIA_GPU_ROOT%/}"', templates.WRITE_FILE,
        f"fact_driver_root={shlex.quote(driver_root)}", render_block(item), 'echo "$plan_result"']))
    env = {"NVIDIA_GPU_ROOT": str(tmp_path), "PATH": os.environ["PATH"]}
    for expected in ("changed", "unchanged"):
        ran = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert (ran.returncode, ran.stdout.strip(), ran.stderr) == (0, expected, "")
        edited = executor.block_edited(item, text, detected)
        assert local.read_text() == edited
        assert executor.block_edited(item, edited, detected) == edited
    if case != "edited-before":
        as_awk_reads_it = (text or "") + ("\n" if text and not text.endswith("\n") else "")
        assert executor.block_restored(item, edited) == as_awk_reads_it
    tomllib.loads(edited)


_OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build"
_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Tue Jun  4 22:38:28 UTC 2024"
#: (loaded driver, version file line, declared driver, modules, type, virtualization modes, required driver).
_INPUTS: dict[str, tuple[str | None, str, str, str, str, tuple[str, ...], str | None]] = {
    "nothing-declared": ("550.90.07", _OPEN, "", "", "", ("None",), "535.0"),
    "release": ("550.90.07", _OPEN, "550.90.7", "open", "gpu", ("None", "Pass-Through"), "550.54.15"),
    "other-release": ("550.90.07", _OPEN, "550.90.12", "", "", (), None),
    "branch": ("550.90.07", _OPEN, "550", "", "", (), None),
    "other-branch": ("550.90.07", _OPEN, "535", "", "", (), None),
    "proprietary-declared": ("550.90.07", _OPEN, "", "proprietary", "", (), None),
    "open-declared": ("550.90.07", _PROPRIETARY, "", "open", "", (), None),
    "no-driver": (None, "", "535", "open", "", (), "550.54.15"),
    "gpu-on-vgpu": ("550.90.07", _OPEN, "", "", "gpu", ("VGPU", "N/A", "VGPU"), None),
    "vgpu-on-bare-metal-and-host": ("550.90.07", _OPEN, "", "", "vgpu", ("None", "Host VGPU", "VGPU"), None),
    "host-manager-unknown-mode": ("550.90.07", _OPEN, "", "", "vgpu-host-manager", ("N/A",), None),
    "too-old": ("535.104.05", _PROPRIETARY, "535", "proprietary", "", (), "550.54.15"),
    "everything-wrong": ("535.104.05", _PROPRIETARY, "550.90.07", "open", "vgpu", ("None",), "550.54.15"),
}


#: The GPUs' compute capabilities, per case (none where not given): one too old, one as a later release of the
#: catalogue would have it, one unreadable.
_COMPUTES: dict[str, tuple[tuple[str, str], ...]] = {
    "release": (("GPU 'NVIDIA L4'", "8.9"), ("GPU 'NVIDIA H100'", "9.0")),
    "too-old": (("GPU 'Tesla M60'", "5.2"), ("GPU 'Tesla P4'", "6.1"), ("GPU 'odd'", "")),
    "everything-wrong": (("GPU 0 'Tesla K80'", "3.7"), ("GPU 1 'NVIDIA B200'", "10.0")),
}


#: The GPUs' fabric registrations, per case (none where not given): every state and a failed registration.
_FABRICS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "release": (("GPU 0 'NVIDIA H100 80GB HBM3'", "Completed", "Success"), ("GPU 1 'NVIDIA L4'", "N/A", "N/A")),
    "everything-wrong": (("GPU 00000000:18:00.0", "Not Started", "N/A"), ("GPU 00000000:2A:00.0", "In Progress", "N/A"),
                         ("GPU 00000000:3A:00.0", "Completed", "Failure (10)"),
                         ("GPU 00000000:5D:00.0", "Completed", "Success")),
}


def _version_to_int() -> str:
    """The check's ``version_to_int``, which the rendered input checks use."""
    m = re.search(r"^version_to_int\(\) \{\n.*?^\}\n", templates.CHECK, re.MULTILINE | re.DOTALL)
    assert m is not None
    return m.group(0)


@pytest.mark.parametrize("case", sorted(_INPUTS))
def test_the_check_judges_what_it_found_alike(case: str, tmp_path: Path) -> None:
    """``plan.DRIVER_CHECKS``, ``FABRIC_CHECKS``, ``VIRTUALIZATION_CHECKS``, ``REQUIRED_DRIVER_CHECKS`` on the same
    inputs: the same findings, worded alike, in the same order."""
    driver, line, declared, modules, driver_type, modes, required = _INPUTS[case]
    checks = (*plan.DRIVER_CHECKS, *plan.FABRIC_CHECKS, *plan.VIRTUALIZATION_CHECKS, *plan.REQUIRED_DRIVER_CHECKS)
    computes, fabrics = _COMPUTES.get(case, ()), _FABRICS.get(case, ())
    values = {"driver": driver or "", "driver_line": line, "declared_driver": declared, "declared_modules": modules,
              "driver_type": driver_type, "modes": "\n".join(modes), "required": required or "",
              "computes": "".join(f"{cc}|{gpu}\n" for gpu, cc in computes),
              "fabrics": "".join(f"{state}|{status}|{gpu}\n" for gpu, state, status in fabrics)}
    script = tmp_path / "inputs.sh"
    script.write_text("\n".join([
        "#!/usr/bin/env bash", "set -Eeuo pipefail",
        _version_to_int(),
        'fail() { printf "%s|%s\\n" "$1" "$2"; }',
        *(f"{INPUTS[k]}={shlex.quote(v)}" for k, v in values.items()),
        render_input_checks(checks),
    ]))
    ran = subprocess.run(["bash", str(script)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
                         timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    expect = DriverExpectation(version=DriverVersion(declared) if declared else None,
                               modules=KernelModules(modules) if modules else KernelModules.AUTO,
                               driver_type=DriverType(driver_type) if driver_type else None)
    inputs = executor.CheckInputs(driver=driver, driver_line=line, expect=expect, modes=modes, required=required,
                                  computes=computes, fabrics=fabrics)
    by_agent = [(r.value, m) for r, m in executor.input_findings(checks, inputs)]
    assert [tuple(x.split("|", 1)) for x in ran.stdout.splitlines()] == by_agent
    assert bool(by_agent) is (case not in {"nothing-declared", "release", "branch", "host-manager-unknown-mode",
                                           "no-driver"})


#: Every kind of device-node item, beside the real step's: a control node under the pre-550.40 name first, one
#: under a major the kernel has not published (a warning, not a failure), the GPU nodes and the caps nodes with
#: modes of their own.
EVERY_NODE = plan.DevicePlan(
    name=facts.DEVNODES_FEATURE,
    log="nvidia-gpu devices",
    modules=(plan.ModuleWhenLoaded(facts.UVM_MODULE, facts.NVIDIA_MODULE),),
    nodes=(plan.ControlNode("/dev/nvidiactl", 255, ("nvidia-frontend", "nvidia"), 0o600),
           plan.ControlNode("/dev/nvidia-nothing", 7, ("no-such-driver", "nor-this"), 0o666),
           plan.ControlNode("/dev/nvidia-uvm", 0, (facts.UVM_MAJOR_NAME,), 0o640),
           plan.GpuNodes(facts.GPU_MAJOR_NAMES, 0o660),
           plan.CapNodes(facts.CAPS_MAJOR_NAME, facts.CAPS_DEV_DIR, facts.MIG_MINORS_PATH,
                         (("monitor", 0o440), ("config", 0o400)), 0o444)),
)
DEVICE_PLANS = {"devices": plan.DEVICES, "every-node": EVERY_NODE}
_DEVNODES_JOURNAL = facts.DEVNODES_JOURNAL


def _fresh(**options: Any) -> dict[str, Any]:
    return {"containerd": 2, "fresh_boot": True, **options}


#: Hosts the device step meets: right after boot (the driver's majors published, nothing made), with a driver
#: from before 550.40 (``nvidia-frontend``), with nvidia-uvm that cannot be loaded, with a node an admin made,
#: without the caps' minors, without the driver loaded, and one already set up.
_DEVICE_HOSTS: dict[str, dict[str, Any]] = {
    "fresh-boot": _fresh(),
    "fresh-boot-old-driver": _fresh(driver_version="535.161.08"),
    "fresh-boot-uvm-unloadable": _fresh(unloadable_modules=("nvidia-uvm",)),
    "fresh-boot-admin-node": _fresh(),
    "fresh-boot-no-mig-minors": _fresh(),
    "driver-not-loaded": {"driver_loaded": False},
    "set-up": {"containerd": 2},
}


def _devices_script(p: plan.DevicePlan) -> str:
    """The device step's frame (lock, journal, result line) around ``p`` rendered, as gpu-devices.sh has it."""
    values = dict(_common(""), NAME="gpu-devices.sh", PURPOSE="test", STRICT="false",
                  DEVICES_PLAN=render_devices(p, fail="fail_devices"))
    return _fill(templates.HEAD + templates.HAS_GPU + templates.DEVICES, values)


def _devices_state(host: FakeHost) -> tuple[dict[str, tuple[str, int]], bytes | None, list[str]]:
    """What the device step may change: the nodes under /dev (the stand-in's ``c major:minor`` and the mode),
    the journal's bytes, the modules modprobe'd."""
    dev = host.path("/dev")
    nodes = {str(p.relative_to(dev)): (p.read_text(), p.stat().st_mode & 0o777)
             for p in sorted(dev.rglob("nvidia*")) if p.is_file()} if dev.is_dir() else {}
    journal = host.path(_DEVNODES_JOURNAL)
    return nodes, journal.read_bytes() if journal.exists() else None, host.log("modprobe")


@pytest.mark.parametrize("name", sorted(DEVICE_PLANS))
@pytest.mark.parametrize("case", sorted(_DEVICE_HOSTS))
def test_device_nodes_are_made_alike(name: str, case: str, tmp_path: Path) -> None:
    """A device plan on the same host: the script and the agent's ``apply_devices`` load the same module, make the
    same nodes with the same numbers and modes, journal them byte for byte, warn and fail with the same words."""
    p = DEVICE_PLANS[name]
    by_bash, by_agent = (build_fake_host(tmp_path / side, "a30x4", **_DEVICE_HOSTS[case]) for side in ("bash", "agent"))
    for host in (by_bash, by_agent):
        if case == "fresh-boot-admin-node":
            host.put("/dev/nvidiactl", "an admin's node\n")
        if case == "fresh-boot-no-mig-minors":
            host.path(facts.MIG_MINORS_PATH).unlink()
    script = tmp_path / "devices.sh"
    script.write_text(_devices_script(p))
    ran = subprocess.run(["bash", str(script)], env=by_bash.env(), capture_output=True, text=True, timeout=60,
                         check=False)
    assert ran.returncode == 0, ran.stderr
    line = next(x for x in ran.stdout.splitlines() if x.startswith("nvidia-gpu-devices "))
    result = dict(part.split("=", 1) for part in line.split()[1:])
    try:
        done = executor.apply_devices(HostRoot(by_agent.root, mknod=device_node_stand_in), p)
    except HostError as e:
        assert result["result"] == "failed"
        assert f"ERROR: {p.log}: {e}" in ran.stderr, "worded alike"
    else:
        assert (result["result"], result["loaded"], result["made"]) == (
            "ok", ",".join(done.loaded), ",".join(done.created))
        for missing in done.missing:
            assert f"WARNING: {p.log}: {missing}" in ran.stderr, "worded alike"
        assert ran.stderr.count("WARNING") == len(done.missing)
    assert _devices_state(by_bash) == _devices_state(by_agent)
    nodes, journal, _ = _devices_state(by_agent)
    assert (journal is None) is (case in {"fresh-boot-uvm-unloadable", "driver-not-loaded"}), "nothing made"
    if case == "set-up":  # a node laid out before boot's end has every node but the caps'
        assert journal is not None
        paths = [f["path"] for f in json.loads(journal)["files"]]
        assert paths and all(path.startswith(f"{facts.CAPS_DEV_DIR}/") for path in paths), paths
    if case == "fresh-boot-admin-node":
        assert nodes["nvidiactl"] == ("an admin's node\n", 0o644)


def test_device_nodes_for_the_mig_managers_instances(tmp_path: Path) -> None:
    """What only the agent asks (the MIG manager, after a change): the caps nodes of instances, by their
    mig-minors keys; a key the driver does not list, or no caps major, is a missing node worded by the plan."""
    host = build_fake_host(tmp_path, "a30x4", fresh_boot=True)
    root = HostRoot(host.root, mknod=device_node_stand_in)
    caps = plan.DEVICES.nodes[-1]
    assert isinstance(caps, plan.CapNodes)
    done = executor.apply_devices(root, plan.DEVICES, load_modules=False,
                                  mig_caps=["gpu0/gi1/access", "gpu0/gi1/ci0/access", "gpu0/gi99/access"])
    assert done.loaded == [] and host.log("modprobe") == []
    assert [m for m in done.missing if "gi99" in m] == [caps.not_listed("gpu0/gi99/access")]
    minors = parse_mig_minors(host.path(facts.MIG_MINORS_PATH).read_text())
    for cap in ("gpu0/gi1/access", "gpu0/gi1/ci0/access"):
        local = host.path(f"{facts.CAPS_DEV_DIR}/nvidia-cap{minors[cap]}")
        assert (local.read_text(), local.stat().st_mode & 0o777) == (f"c {CAPS_MAJOR}:{minors[cap]}\n",
                                                                      caps.access_mode)
    host.path(facts.MIG_MINORS_PATH).unlink()
    again = executor.apply_devices(root, plan.DEVICES, load_modules=False, mig_caps=["gpu0/gi1/access"])
    assert caps.unavailable in again.missing and again.created == []


def test_a_module_the_host_cannot_load_fails_with_the_plans_words(tmp_path: Path) -> None:
    """modprobe missing or hanging: the agent words it as the script does (the plan's messages)."""
    host = build_fake_host(tmp_path, "a30x4", fresh_boot=True)
    module = plan.DEVICES.modules[0]

    def absent(call: Call) -> CommandResult:
        raise CommandNotFound("command 'modprobe' not found on the host", "modprobe")

    def hangs(call: Call) -> CommandResult:
        raise CommandTimeout("modprobe did not finish within 30s", "modprobe")

    for responder, message in ((absent, module.not_found), (hangs, module.timed_out)):
        root = HostRoot(host.root, executor=RecordingExec({"modprobe": responder}), mknod=device_node_stand_in)
        with pytest.raises(HostError) as failed:
            executor.apply_devices(root, plan.DEVICES)
        assert str(failed.value) == message
    assert module.not_found == "cannot load nvidia-uvm: modprobe not found"
    assert module.timed_out == ("cannot load nvidia-uvm: modprobe nvidia-uvm did not finish in "
                                f"{facts.MODPROBE_TIMEOUT_S}s")
    assert not host.path("/dev/nvidiactl").exists()  # nothing made once the module failed


def test_a_node_that_cannot_be_made_fails_alike(tmp_path: Path) -> None:
    """mknod refused (a container without CAP_MKNOD): the step fails on both sides with the plan's words, after
    journaling the node it tried (its rollback finds nothing there)."""
    by_bash, by_agent = (build_fake_host(tmp_path / side, "a30x4", **_fresh()) for side in ("bash", "agent"))
    by_bash.put("/usr/bin/mknod", "#!/bin/sh\necho \"mknod: '$3': Operation not permitted\" >&2\nexit 1\n")
    by_bash.path("/usr/bin/mknod").chmod(0o755)

    def refused(local: Path, major: int, minor: int, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(local))

    script = tmp_path / "devices.sh"
    script.write_text(_devices_script(plan.DEVICES))
    ran = subprocess.run(["bash", str(script)], env=by_bash.env(), capture_output=True, text=True, timeout=60,
                         check=False)
    with pytest.raises(HostError) as failed:
        executor.apply_devices(HostRoot(by_agent.root, mknod=refused), plan.DEVICES)
    assert str(failed.value) == plan.fill(plan.DEVICES.cannot_make, {
        "path": "/dev/nvidiactl", "major": str(NVIDIA_MAJOR), "minor": "255", "why": "Operation not permitted"})
    assert "result=failed" in ran.stdout and f"ERROR: {plan.DEVICES.log}: {failed.value}" in ran.stderr
    assert _devices_state(by_bash) == _devices_state(by_agent)
