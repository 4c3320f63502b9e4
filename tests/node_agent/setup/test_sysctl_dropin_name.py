"""The sysctl drop-in wins at boot (file-name order of systemd-sysctl) and migrates the former name."""

from __future__ import annotations

from pathlib import Path

from node_agent.host import HostRoot
from node_agent.setup.journal import Journal
from node_agent.setup.sysctl import DROPIN
from nvgpu.nodescripts.content import sysctl_dropin
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.node_agent.agent_testkit import Cli

A30 = "simulated:a30x4"
FORMER = "/etc/sysctl.d/99-nvidia-gpu.conf"
_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/lib/sysctl.d")  # earlier dir shadows a same-named file


def _boot_values(host: FakeHost) -> dict[str, str]:
    """What systemd-sysctl sets at boot: all ``*.conf`` merged by file name, sorted, a later file wins."""
    files: dict[str, Path] = {}
    for d in _DIRS:
        local = host.path(d)
        if local.is_dir():
            for f in local.glob("*.conf"):
                files.setdefault(f.name, f)
    values: dict[str, str] = {}
    for name in sorted(files):
        for line in files[name].read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith(("#", ";")):
                values[key.strip()] = value.strip()
    return values


def test_dropin_sorts_after_the_distribution_99_sysctl_conf(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4", bpf_jit_harden="2")
    assert _boot_values(host)["net.core.bpf_jit_harden"] == "2"  # the distribution's 99-sysctl.conf
    assert cli(host.root, A30, "sysctl", "apply")[0] == 0
    assert Path(DROPIN).name > "99-sysctl.conf"
    assert _boot_values(host)["net.core.bpf_jit_harden"] == "1"  # ours wins at the next boot


def test_former_dropin_is_migrated_and_rollback_restores_it(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4", bpf_jit_harden="2")
    host.path(FORMER).write_text(sysctl_dropin())  # written by an earlier agent or gpu-sysctl.sh
    host.path(FORMER).chmod(0o640)
    before = host.snapshot("/etc")
    code, doc = cli(host.root, A30, "sysctl", "apply")
    assert code == 0 and doc["changedFiles"] == [DROPIN, FORMER]
    assert not host.path(FORMER).exists() and host.path(DROPIN).read_text() == sysctl_dropin()
    assert _boot_values(host)["net.core.bpf_jit_harden"] == "1"
    assert cli(host.root, A30, "sysctl", "apply")[1]["changedFiles"] == []  # idempotent
    code, doc = cli(host.root, A30, "sysctl", "rollback")
    assert code == 0 and host.snapshot("/etc") == before  # the former file is back, byte for byte
    assert (host.path(FORMER).stat().st_mode & 0o777) == 0o640


def test_former_name_after_an_old_agent_apply_rolls_back_to_nothing(tmp_path: Path, cli: Cli) -> None:
    """An old agent journaled the former name as absent; rollback after migration leaves neither file."""
    host = build_fake_host(tmp_path, "a30x4", bpf_jit_harden="2")
    before = host.snapshot("/etc")
    Journal(HostRoot(host.root), "sysctl").record(FORMER)  # what the old apply journaled
    host.path(FORMER).write_text(sysctl_dropin())
    assert cli(host.root, A30, "sysctl", "apply")[0] == 0
    assert not host.path(FORMER).exists()
    assert cli(host.root, A30, "sysctl", "rollback")[0] == 0
    assert host.snapshot("/etc") == before


def test_foreign_file_under_the_former_name_is_left_alone(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4", bpf_jit_harden="2")
    host.path(FORMER).write_text("kernel.foo = 1\n")
    code, doc = cli(host.root, A30, "sysctl", "apply")
    assert code == 0 and doc["changedFiles"] == [DROPIN]
    assert any(FORMER in n and "left alone" in n for n in doc["notes"])
    assert host.path(FORMER).read_text() == "kernel.foo = 1\n"
    assert cli(host.root, A30, "sysctl", "rollback")[0] == 0
    assert host.path(FORMER).read_text() == "kernel.foo = 1\n" and not host.path(DROPIN).exists()
