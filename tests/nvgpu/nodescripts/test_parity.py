"""Parity: the bash NodeGroupConfiguration scripts and the agent's Python path reach the same verdicts
on the same fake hosts, and write byte-identical files.

The steps that are plans (``nvgpu.nodescripts.plan``: sysctl, VFIO, the check's host requirements) agree by
construction; ``test_plan_interpreters`` tests the two interpreters of plans on the same plans. What stays here
is end to end: the flows, and the parts of the check and the runtime step still written per backend.

How the scripts see GPUs without a GPU: each fake root carries an ``nvidia-smi`` that runs
``nvml_sim.smi`` over the same simulated state file the agent's NVML reads, so a fault
injected into the simulated machine (lost GPU, init failure, old driver, odd model) reaches both.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node_agent.cli import main
from node_agent.host import HostRoot, osinfo
from nvgpu import labels
from nvgpu.nodescripts import facts, render_node_scripts
from nvml_sim.state import FabricStateName, SimProcess
from tests.kit.fakecrio import build_crio_host
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.nvgpu.nodescripts.nodescript_helpers import RunScript, summary

Scenario = Callable[[Path], FakeHost]


def _compute_52(root: Path) -> FakeHost:
    host = build_fake_host(root, "t4x1")
    assert host.machine is not None
    host.machine.override_gpu(0, name="Tesla M60", compute_capability=(5, 2), pci_device_id=0x13F2)
    return host


def _renamed_gpu(root: Path) -> FakeHost:
    """A known board under a name the catalogue lacks (NVIDIA's mock A100): both find it by PCI device ID."""
    host = build_fake_host(root, "dgx-a100-40gb", containerd=2)
    assert host.machine is not None
    host.machine.override_gpu(0, name="Mock NVIDIA A100-SXM4-40GB")
    return host


def _lost_gpu(root: Path) -> FakeHost:
    host = build_fake_host(root, "dgx-a100-40gb")
    assert host.machine is not None
    host.machine.lose_gpu(3)
    return host


def _nvml_broken(root: Path) -> FakeHost:
    host = build_fake_host(root, "l4x2")
    assert host.machine is not None
    host.machine.fail_init("lib-rm-version-mismatch")
    return host


def _in_use(root: Path) -> FakeHost:
    host = build_fake_host(root, "a30x4")
    assert host.machine is not None
    host.machine.set_processes(2, [SimProcess(pid=4242, used_mib=512)])
    return host


def _fabric(machine: str, state: FabricStateName, status: int = 0) -> Scenario:
    """An NVSwitch board whose Fabric Manager has not registered GPU 2 (CUDA error 802): NVML's fabric info
    for the agent, ``nvidia-smi -q``'s Fabric section for the script."""
    def build(root: Path) -> FakeHost:
        host = build_fake_host(root, machine)
        assert host.machine is not None
        host.machine.set_fabric_manager(state, status, gpus=[2])
        return host
    return build


def _fabric_query_fails(root: Path) -> FakeHost:
    host = build_fake_host(root, "dgx-h100")
    assert host.machine is not None
    host.machine.fail_call(2, "nvmlDeviceGetGpuFabricInfo", 999)
    return host


def _no_proc_modules(machine: str, **options: Any) -> Scenario:
    """A kernel built without loadable-module support (``CONFIG_MODULES=n``, as this project's CI VM): no
    ``/proc/modules`` at all; ``/sys/module/<name>/initstate`` says what is live."""
    def build(root: Path) -> FakeHost:
        host = build_fake_host(root, machine, **options)
        host.path("/proc/modules").unlink()
        return host
    return build


SCENARIOS: dict[str, Scenario] = {
    "no-proc-modules": _no_proc_modules("dgx-h100", containerd=2),
    "no-proc-modules-uvm-not-live": _no_proc_modules("l4x2", modules=("nvidia", "nvidia_modeset")),
    "fabric-not-started": _fabric("dgx-h100", "not-started"),
    "fabric-in-progress": _fabric("hgx-h200", "in-progress"),
    "fabric-failed": _fabric("dgx-h100", "completed", 10),  # NVML_ERROR_TIMEOUT
    "fabric-query-fails": _fabric_query_fails,
    # A board the catalogue lacks (PCI 0x2FF0): a notice on both sides, the global driver minimum, verdict ok.
    "unknown-model": lambda r: build_fake_host(r, "unlisted-x2"),
    "unknown-model-old-driver": lambda r: build_fake_host(r, "unlisted-x2", driver_version="418.67"),
    "no-gpu": lambda r: build_fake_host(r, None),
    "good-dgx-h100-containerd1": lambda r: build_fake_host(r, "dgx-h100", containerd=1),
    "good-hgx-h200-containerd2": lambda r: build_fake_host(r, "hgx-h200", containerd=2),
    "old-driver": lambda r: build_fake_host(r, "hgx-h200", driver_version="535.161.08"),
    "driver-below-floor": lambda r: build_fake_host(r, "t4x1", driver_version="418.67"),
    "compute-5.2": _compute_52,
    "renamed-gpu": _renamed_gpu,
    "modules-missing": lambda r: build_fake_host(r, "l4x2", modules=("nvidia_modeset",)),
    "device-nodes-missing": lambda r: build_fake_host(r, "a30x4", device_nodes=False),
    # Right after boot: nvidia_uvm not loaded, no /dev/nvidia* node; setup (gpu-devices.sh, the agent's
    # devnodes) makes them, the check alone reports them.
    "fresh-boot": lambda r: build_fake_host(r, "a30x4", containerd=2, fresh_boot=True),
    "fresh-boot-uvm-unloadable": lambda r: build_fake_host(r, "a30x4", containerd=2, fresh_boot=True,
                                                           unloadable_modules=("nvidia-uvm",)),
    "driver-not-loaded": lambda r: build_fake_host(r, "dgx-a100-80gb", driver_loaded=False),
    "driver-unparseable": lambda r: build_fake_host(r, "l4x2", driver_text="NVRM version: who knows\n"),
    "two-part-driver": lambda r: build_fake_host(
        r, "l4x2", driver_text="NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.67  Tue Mar 12 2024\n"),
    "nvml-broken": _nvml_broken,
    "lost-gpu": _lost_gpu,
    "gpu-in-use": _in_use,
    "iommu-off": lambda r: build_fake_host(r, "a30x4", iommu=False),
    "no-nvidia-runtime-containerd2": lambda r: build_fake_host(r, "l4x2", containerd=2,
                                                               nvidia_container_runtime=False),
    "good-l4x2-crio": lambda r: build_crio_host(r, "l4x2"),
    "crio-without-conmon": lambda r: build_crio_host(r, "a30x4", conmon=False),
    "crio-no-nvidia-runtime": lambda r: build_crio_host(r, "l4x2", nvidia_container_runtime=False),
    "crio-and-containerd": lambda r: build_crio_host(r, "l4x2", containerd=True),
    "no-runtime": lambda r: build_fake_host(r, "l4x2", containerd=None),
}


def _agent(host: FakeHost, *args: str) -> int:
    nvml = host.nvml_spec
    return main(["--host-root", str(host.root), "--host-exec", "direct", "--nvml", nvml, "--json", *args])


def _agent_json(host: FakeHost, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = _agent(host, *args)
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_check_verdicts_agree(scenario: str, tmp_path: Path, run_script: RunScript,
                              capsys: pytest.CaptureFixture[str]) -> None:
    host = SCENARIOS[scenario](tmp_path)
    for phase in ("host", "all"):
        script = summary(run_script(host, "gpu-check.sh", NVIDIA_GPU_CHECK_PHASE=phase).stdout, "nvidia-gpu-check")
        script_file = host.path("/var/lib/nvidia-gpu-agent/check.verdict").read_text()
        code, doc = _agent_json(host, capsys, "check", "--phase", phase)
        agent_file = host.path("/var/lib/nvidia-gpu-agent/check.verdict").read_text()
        assert (doc["verdict"], ",".join(doc["reasons"])) == (script["verdict"], script["reasons"]), (phase, doc)
        assert agent_file == script_file
        assert code == (1 if doc["verdict"] == "unusable" else 0)


@pytest.mark.parametrize("scenario", ["good-dgx-h100-containerd1", "good-hgx-h200-containerd2",
                                      "no-nvidia-runtime-containerd2", "no-gpu", "old-driver", "good-l4x2-crio",
                                      "crio-without-conmon", "fresh-boot", "fresh-boot-uvm-unloadable"])
def test_setup_writes_identical_files(scenario: str, tmp_path: Path, run_script: RunScript,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    by_script = SCENARIOS[scenario](tmp_path / "script")
    by_agent = SCENARIOS[scenario](tmp_path / "agent")
    for script in render_node_scripts():  # every step, in the weight order bashible runs them
        ran = run_script(by_script, script.name)
    script_complete = summary(ran.stdout, "nvidia-gpu-setup")["complete"] if scenario != "no-gpu" else "false"
    _, doc = _agent_json(by_agent, capsys, "setup", "--no-patch-node", "--no-restart")
    assert str(doc["complete"]).lower() == script_complete
    etc_script, etc_agent = by_script.snapshot("/etc"), by_agent.snapshot("/etc")
    assert etc_agent == etc_script
    for path in ("/proc/sys/net/core/bpf_jit_harden", "/var/lib/nvidia-gpu-agent/sysctl.previous"):
        a, s = by_agent.path(path), by_script.path(path)
        assert (a.read_text() if a.exists() else None) == (s.read_text() if s.exists() else None), path


@pytest.mark.parametrize("scenario", ["good-hgx-h200-containerd2", "good-l4x2-crio"])
def test_teardown_after_script_setup_restores_etc(scenario: str, tmp_path: Path, run_script: RunScript,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Nodes set up by the scripts can be torn down by the agent: /etc and the live sysctl come back."""
    host = SCENARIOS[scenario](tmp_path)
    before = host.snapshot("/etc")
    for name in ("gpu-check.sh", "gpu-runtime.sh", "gpu-sysctl.sh"):
        run_script(host, name)
    assert host.snapshot("/etc") != before
    code, _ = _agent_json(host, capsys, "teardown", "--no-patch-node", "--no-restart")
    assert code == 0
    assert host.snapshot("/etc") == before
    assert host.path("/proc/sys/net/core/bpf_jit_harden").read_text() == "2\n"


_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Tue Jun  4 22:38:28 UTC 2024\n"


@pytest.mark.parametrize("case", [
    ("550.90.07", "", False, False),
    ("550", "open", False, False),
    ("550.90.12", "", False, True),
    ("535", "", False, True),
    ("", "proprietary", False, True),
    ("550", "proprietary", True, False),
    ("", "open", True, True),
], ids=["release", "branch-open", "other-release", "other-branch", "open-loaded-proprietary-declared",
        "proprietary", "proprietary-loaded-open-declared"])
def test_the_declared_driver_is_verified_alike(case: tuple[str, str, bool, bool], tmp_path: Path,
                                               run_script: RunScript, capsys: pytest.CaptureFixture[str]) -> None:
    """The group's driver (gpu.driver.version, kernelModules) against the loaded one (a DGX H100 on 550.90.07,
    open modules unless ``proprietary``): gpu-check.sh and the agent's check find the same mismatch."""
    expect_driver, expect_modules, proprietary, mismatch = case
    options: dict[str, Any] = {"driver_text": _PROPRIETARY} if proprietary else {}
    host = build_fake_host(tmp_path, "dgx-h100", **options)
    env = {"NVIDIA_GPU_CHECK_PHASE": "host", "NVIDIA_GPU_EXPECT_DRIVER": expect_driver,
           "NVIDIA_GPU_EXPECT_MODULES": expect_modules}
    script = summary(run_script(host, "gpu-check.sh", **env).stdout, "nvidia-gpu-check")
    args = [*(["--expect-driver", expect_driver] if expect_driver else []),
            *(["--expect-kernel-modules", expect_modules] if expect_modules else [])]
    code, doc = _agent_json(host, capsys, "check", "--phase", "host", *args)
    assert (doc["verdict"], ",".join(doc["reasons"])) == (script["verdict"], script["reasons"]), doc
    assert (doc["reasons"] == ["driver-mismatch"]) is mismatch, doc
    assert code == (1 if mismatch else 0)
    if mismatch:
        (finding,) = doc["findings"]
        assert "the node group declares" in finding["message"]


@pytest.mark.parametrize("case", [
    ("gpu", 0, False), ("gpu", 1, False), ("vgpu", 2, False), ("vgpu-host-manager", 3, False),
    ("gpu", 2, True), ("vgpu", 0, True), ("vgpu-host-manager", 2, True), ("vgpu", 3, True),
], ids=["bare-metal", "passthrough", "vgpu-guest", "vgpu-host", "gpu-on-a-vgpu", "vgpu-on-bare-metal",
        "host-manager-in-a-guest", "guest-driver-on-a-host"])
def test_the_declared_driver_type_is_verified_against_the_virtualization_mode_alike(
        case: tuple[str, int, bool], tmp_path: Path, run_script: RunScript, capsys: pytest.CaptureFixture[str]) -> None:
    """gpu.driver.type against NVML's virtualization mode of the GPUs (the agent through NVML, gpu-check.sh
    through ``nvidia-smi -q``): a bare-metal driver on a vGPU, a guest driver on bare metal or a host, a
    vGPU manager in a guest are each a driver-mismatch, worded alike."""
    driver_type, mode, mismatch = case
    host = build_fake_host(tmp_path, "l4x2")
    assert host.machine is not None
    host.machine.set_virtualization_mode(mode)
    ran = run_script(host, "gpu-check.sh", NVIDIA_GPU_CHECK_PHASE="host", NVIDIA_GPU_EXPECT_DRIVER_TYPE=driver_type)
    script = summary(ran.stdout, "nvidia-gpu-check")
    code, doc = _agent_json(host, capsys, "check", "--phase", "host", "--expect-driver-type", driver_type)
    assert (doc["verdict"], ",".join(doc["reasons"])) == (script["verdict"], script["reasons"]), doc
    assert (doc["reasons"] == ["driver-mismatch"]) is mismatch, doc
    assert code == (1 if mismatch else 0)
    if mismatch:
        (finding,) = doc["findings"]
        assert finding["message"].startswith("the GPUs are in virtualization mode ")
        assert f"driver type {driver_type} needs" in finding["message"]
        assert finding["message"] in ran.stdout + ran.stderr, "worded alike"


@pytest.mark.parametrize("case", [(("rhel", "9.4"), "5.14.0-427.13.1.el9_4.x86_64", False),
                                  (("ubuntu", "24.04"), "6.8.0-45-generic", True)], ids=["rhel-no-driver", "ubuntu"])
def test_the_os_labels_are_published_alike(case: tuple[tuple[str, str], str, bool], tmp_path: Path,
                                           run_script: RunScript) -> None:
    """gpu-check.sh labels the node with the OS, the kernel and a host driver as the agent's setup does
    (node_agent.host.osinfo), before any verdict: a node waiting for its driver container gets them too."""

    os_release, kernel, has_driver = case
    host = build_fake_host(tmp_path, "dgx-h100", os_release=os_release, kernel=kernel, nvidia_smi=has_driver,
                           driver_loaded=has_driver)
    run_script(host, "gpu-check.sh", NVIDIA_GPU_CHECK_PHASE="host")
    by_script = dict(call.rsplit(" ", 1)[-1].split("=", 1) for call in host.log("kubectl") if "=" in call)
    by_script = {k: v for k, v in by_script.items() if k not in (labels.NODE_CHECK, labels.NODE_CHECK_REASONS)}
    agent = {k: v for k, v in osinfo.os_labels(HostRoot(host.root)).items() if v is not None}
    if osinfo.host_driver_installed(HostRoot(host.root)):
        agent[labels.GPU_DEPLOY_DRIVER] = labels.DRIVER_PREINSTALLED
    assert by_script == agent
    assert by_script[labels.OS_RELEASE_ID] == os_release[0] and (labels.GPU_DEPLOY_DRIVER in agent) is has_driver


_WITH_ROOT = ('disable-require = false\n\n[nvidia-container-cli]\nenvironment = []\nroot = "/"\n'
              'load-kmods = true\n\n[nvidia-container-runtime]\nlog-level = "info"\n')


@pytest.mark.parametrize("toolkit", ["nvidia-default", "root-set", "no-cli-table", "no-file"])
def test_a_driver_containers_root_reaches_the_toolkit_alike(toolkit: str, tmp_path: Path, run_script: RunScript,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Where the driver is a container's (/run/nvidia/driver), gpu-runtime.sh and the agent's runtime step set
    nvidia-container-cli's root there, byte for byte alike, in the toolkit's own config (NVIDIA's default
    with its table and a commented root; one with a root of its own, which is disabled; one without the
    table; none at all); the result is TOML with that root, and teardown gives the file back unchanged."""
    hosts = [build_fake_host(tmp_path / side, "dgx-h100", containerd=2) for side in ("script", "agent")]
    for host in hosts:
        target = host.path(facts.TOOLKIT_CONFIG)
        if toolkit == "root-set":
            target.write_text(_WITH_ROOT)
        elif toolkit == "no-cli-table":
            target.write_text('disable-require = false\n\n[nvidia-container-runtime]\nlog-level = "info"\n')
        elif toolkit == "no-file":
            target.unlink()
    script, agent = hosts
    before = agent.path(facts.TOOLKIT_CONFIG).read_text() if toolkit != "no-file" else None
    run_script(script, "gpu-check.sh")
    done = run_script(script, "gpu-runtime.sh", NVIDIA_GPU_TOOLKIT_ROOT="/run/nvidia/driver")
    assert done.returncode == 0, done.stderr
    code, doc = _agent_json(agent, capsys, "runtime", "apply", "--no-restart", "--toolkit-driver-root",
                            "/run/nvidia/driver")
    assert code == 0, doc
    by_script, by_agent = (h.path(facts.TOOLKIT_CONFIG).read_text() for h in hosts)
    assert by_agent == by_script
    assert tomllib.loads(by_agent)["nvidia-container-cli"]["root"] == "/run/nvidia/driver"
    _agent_json(agent, capsys, "runtime", "rollback", "--no-restart")
    after = agent.path(facts.TOOLKIT_CONFIG)
    # Given back as it was (a file only we wrote is left empty of ours, as the toolkit's own default).
    assert (after.read_text() if after.exists() else "") == (before or "")


@pytest.mark.parametrize("case", ["good-dgx-h100-containerd1", "old-driver", "modules-missing", "no-gpu"])
def test_the_check_labels_are_written_alike(case: str, tmp_path: Path, run_script: RunScript,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The node's check labels (the verdict, the reasons .-joined) that gpu-check.sh writes with kubectl are
    the ones the agent's setup and monitor write (nvgpu.labels.check_labels); none on a node without a GPU."""

    host = SCENARIOS[case](tmp_path)
    run_script(host, "gpu-check.sh", NVIDIA_GPU_CHECK_PHASE="host")
    by_script: dict[str, str | None] = {}
    for call in host.log("kubectl"):
        arg = call.rsplit(" ", 1)[-1]
        key, _, value = arg.partition("=")
        if key.rstrip("-") in (labels.NODE_CHECK, labels.NODE_CHECK_REASONS):
            by_script[key.rstrip("-")] = value if "=" in arg else None
    _, doc = _agent_json(host, capsys, "check", "--phase", "host", "--no-record")
    wanted = labels.check_labels(doc["verdict"], doc["reasons"])
    if doc["verdict"] == "no-gpu":
        assert by_script == {}, "nothing is written on a node without a GPU"
    else:
        assert by_script == wanted, (by_script, wanted)
        assert by_script[labels.NODE_CHECK] == doc["verdict"]


@pytest.mark.parametrize("scenario", ["good-dgx-h100-containerd1", "good-hgx-h200-containerd2"])
def test_an_edited_dropin_is_put_back_alike_and_teardown_keeps_the_operators_own(
        scenario: str, tmp_path: Path, run_script: RunScript, capsys: pytest.CaptureFixture[str]) -> None:
    """On Deckhouse, someone edits our drop-in and adds one of their own beside it: gpu-runtime.sh and the agent's
    ``runtime apply`` put ours back byte for byte alike (the agent naming the key it puts back), and the
    agent's teardown then removes ours, keeps the edited copy aside and leaves the operator's drop-in."""

    hosts = [SCENARIOS[scenario](tmp_path / side) for side in ("script", "agent")]
    script, agent = hosts
    version = 2 if scenario.endswith("containerd1") else 3
    dropin = f"{facts.DECKHOUSE_DROPIN_DIRS[version]}/{facts.RUNTIME_DROPIN_NAME}"
    theirs = f"{facts.DECKHOUSE_DROPIN_DIRS[version]}/20-mirrors.toml"
    for name in ("gpu-check.sh", "gpu-runtime.sh"):
        run_script(script, name)
    _agent_json(agent, capsys, "check", "--phase", "host")
    code, _ = _agent_json(agent, capsys, "runtime", "apply", "--no-restart")
    assert code == 0
    for host in hosts:
        ours = host.path(dropin)
        ours.write_text(ours.read_text().replace("SystemdCgroup = true", "SystemdCgroup = false"))
        host.path(theirs).write_text('[plugins."x".registry]\n  config_path = "/etc/containerd/certs.d"\n')
    assert run_script(script, "gpu-runtime.sh").returncode == 0
    code, doc = _agent_json(agent, capsys, "runtime", "apply", "--no-restart")
    assert code == 0 and dropin in doc["changed"]
    assert any("SystemdCgroup" in n and "changed since nvidia-gpu wrote it" in n for n in doc["notes"]), doc["notes"]
    assert agent.snapshot("/etc") == script.snapshot("/etc")
    operators = agent.path(theirs).read_bytes()
    agent.path(dropin).write_text(agent.path(dropin).read_text() + "# mine\n")
    code, doc = _agent_json(agent, capsys, "teardown", "--no-patch-node", "--no-restart")
    assert code == 0
    assert not agent.path(dropin).exists() and agent.path(f"{facts.STATE_DIR}/edited{dropin}").exists()
    assert agent.path(theirs).read_bytes() == operators


@pytest.mark.parametrize(("scenario", "missing"), [("no-proc-modules", False), ("no-proc-modules-uvm-not-live", True)])
def test_without_proc_modules_sys_module_says_what_is_loaded(scenario: str, missing: bool, tmp_path: Path,
                                                             run_script: RunScript,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    host = SCENARIOS[scenario](tmp_path)
    script = summary(run_script(host, "gpu-check.sh", NVIDIA_GPU_CHECK_PHASE="host").stdout, "nvidia-gpu-check")
    _, doc = _agent_json(host, capsys, "check", "--phase", "host")
    for reasons in (script["reasons"].split(","), doc["reasons"]):
        assert ("module-missing" in reasons) is missing, (script, doc)
        assert "proc-unreadable" not in reasons, (script, doc)
