"""``runtime`` and ``sysctl`` apply/rollback: layouts, idempotence, byte-for-byte rollback, bad input."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from nvgpu.nodescripts.content import dropin_for
from tests.kit.fakehost import build_fake_host
from tests.node_agent.agent_testkit import Cli

H100 = "simulated:dgx-h100"


@pytest.mark.parametrize(("containerd", "deckhouse", "dropin"), [
    (1, True, "/etc/containerd/conf.d/nvidia-gpu.toml"),
    (2, True, "/etc/containerd/conf2.d/nvidia-gpu.toml"),
    (1, False, "/etc/containerd/conf.d/nvidia-gpu.toml"),
    (2, False, "/etc/containerd/conf.d/nvidia-gpu.toml"),
])
def test_apply_is_idempotent_and_rollback_restores_etc(tmp_path: Path, cli: Cli, containerd: int, deckhouse: bool,
                                                       dropin: str) -> None:
    host = build_fake_host(tmp_path, "dgx-h100", containerd=containerd, deckhouse=deckhouse)  # type: ignore[arg-type]
    before = host.snapshot("/etc")
    code, doc = cli(host.root, H100, "runtime", "apply")
    assert code == 0 and dropin in doc["changed"] and doc["restarted"]
    assert (dropin in doc["changed"]) and (("/etc/containerd/config.toml" in doc["changed"]) == (not deckhouse))
    assert host.log("systemctl") == ["restart containerd"]
    text = host.path(dropin).read_text()
    if deckhouse or containerd == 2:
        assert text == dropin_for(containerd + 1, systemd_cgroup=True, nvidia_default=True)
    else:  # containerd 1.x import: the whole CRI section travels with our keys
        cri = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]
        assert cri["sandbox_image"] == "registry.k8s.io/pause:3.9" and cri["enable_cdi"] is True
        assert cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    if not deckhouse:
        config = tomllib.loads(host.path("/etc/containerd/config.toml").read_text())
        assert config["imports"] == ["/etc/containerd/conf.d/*.toml"]
    applied = host.snapshot("/etc")
    code, doc = cli(host.root, H100, "runtime", "apply")
    assert (code, doc["changed"], doc["restarted"]) == (0, [], False)
    assert host.snapshot("/etc") == applied
    code, doc = cli(host.root, H100, "runtime", "rollback")
    assert code == 0 and doc["restarted"]
    assert host.snapshot("/etc") == before
    assert not host.path("/var/lib/nvidia-gpu-agent/rollback/runtime/manifest.json").exists()


def test_existing_imports_are_extended(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2", containerd=2, deckhouse=False)
    cfg = host.path("/etc/containerd/config.toml")
    original = cfg.read_text().replace("version = 3\n", 'version = 3\nimports = ["/etc/containerd/extra/*.toml"]\n')
    cfg.write_text(original)
    assert cli(host.root, "simulated:l4x2", "runtime", "apply", "--no-restart")[0] == 0
    imports = tomllib.loads(cfg.read_text())["imports"]
    assert imports == ["/etc/containerd/extra/*.toml", "/etc/containerd/conf.d/*.toml"]
    assert cli(host.root, "simulated:l4x2", "runtime", "rollback", "--no-restart")[0] == 0
    assert cfg.read_text() == original


def test_malformed_config_leaves_the_host_alone(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2", containerd=1)
    host.path("/etc/containerd/config.toml").write_text('version = 2\n[plugins\nbroken = "yes"\n')
    before = host.snapshot("/")
    code, doc = cli(host.root, "simulated:l4x2", "runtime", "apply")
    assert code == 3 and "is not valid TOML" in doc["error"]
    assert host.snapshot("/") == before
    code, doc = cli(host.root, "simulated:l4x2", "check")
    assert doc["reasons"] == ["runtime-not-ready"] and "not valid TOML" in doc["runtime"]


def test_unsupported_config_version_and_missing_config(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path / "a", "l4x2", containerd=1)
    host.path("/etc/containerd/config.toml").write_text('[plugins.cri]\nsandbox_image = "pause"\n')
    code, doc = cli(host.root, "simulated:l4x2", "runtime", "apply")
    assert code == 3 and "version 1 is not supported" in doc["error"]
    bare = build_fake_host(tmp_path / "b", "l4x2", containerd=None)
    code, doc = cli(bare.root, "simulated:l4x2", "runtime", "apply")
    assert code == 3 and "is missing" in doc["error"]


def test_foreign_dropin_is_refused(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2", containerd=2)
    host.path("/etc/containerd/conf2.d/nvidia-gpu.toml").write_text("# mine\n")
    before = host.snapshot("/etc")
    code, doc = cli(host.root, "simulated:l4x2", "runtime", "apply")
    assert code == 5 and "not written by nvidia-gpu" in doc["error"]
    assert host.snapshot("/etc") == before


def test_no_gpu_means_no_change(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, None)
    before = host.snapshot("/")
    for command in (("runtime", "apply"), ("sysctl", "apply")):
        code, doc = cli(host.root, "simulated:t4x1", *command)
        assert (code, doc["skipped"]) == (0, "no-gpu")
    assert host.snapshot("/") == before


def test_sysctl_apply_and_rollback(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4", bpf_jit_harden="2")
    live = host.path("/proc/sys/net/core/bpf_jit_harden")
    before = host.snapshot("/etc")
    code, doc = cli(host.root, "simulated:a30x4", "sysctl", "apply")
    assert (code, doc["changedFiles"], doc["live"]) == (0, ["/etc/sysctl.d/99-zz-nvidia-gpu.conf"],
                                                       {"net.core.bpf_jit_harden": "1"})
    assert live.read_text() == "1\n"
    assert host.path("/etc/sysctl.d/99-sysctl.conf").read_text().endswith("= 2\n")  # not ours: untouched
    code, doc = cli(host.root, "simulated:a30x4", "sysctl", "apply")
    assert (doc["changedFiles"], doc["live"]) == ([], {})
    code, doc = cli(host.root, "simulated:a30x4", "sysctl", "rollback")
    assert code == 0 and doc["live"] == {"net.core.bpf_jit_harden": "2"}
    assert live.read_text() == "2\n"
    assert host.snapshot("/etc") == before
    assert not host.path("/var/lib/nvidia-gpu-agent/sysctl.previous").exists()


def test_sysctl_already_at_value_keeps_it_on_rollback(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4", bpf_jit_harden="1")
    assert cli(host.root, "simulated:a30x4", "sysctl", "apply")[1]["live"] == {}
    assert cli(host.root, "simulated:a30x4", "sysctl", "rollback")[1]["live"] == {}
    assert host.path("/proc/sys/net/core/bpf_jit_harden").read_text() == "1\n"
