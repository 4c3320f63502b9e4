"""The two interpreters of node-setup plans on the same plans and the same fake hosts: the agent's executor
(``node_agent.setup.executor``) and the bash rendering (``nvgpu.nodescripts.bashplan``) leave identical files,
live settings and rollback state, load the same modules, find the same problems and refuse alike.

Parity of the converted steps (sysctl, VFIO) holds by construction once the interpreters agree; so these tests
run every kind of plan item, on the real step plans and on one plan that holds all of them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from node_agent.host import HostRoot, NotOurs
from node_agent.setup import executor
from nvgpu.nodescripts import facts, plan, templates
from nvgpu.nodescripts.bashplan import render_checks, render_plan
from nvgpu.nodescripts.content import HEADER
from nvgpu.nodescripts.plan import FormerFile, KernelModule, KernelSetting, ManagedFile, NonEmptyDir, StepPlan
from nvgpu.nodescripts.render import _common, _fill
from tests.kit.fakehost import FakeHost, build_fake_host

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
