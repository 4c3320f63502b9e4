"""``runtime`` and ``check`` on CRI-O hosts: detection, the drop-in, idempotence, byte-for-byte rollback, refusals."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from nvgpu.nodescripts.content import HEADER, render_crio_dropin
from tests.kit.fakecrio import CRIO_VERSION, build_crio_host
from tests.kit.fakehost import build_fake_host
from tests.node_agent.agent_testkit import Cli

L4 = "simulated:l4x2"
DROPIN = "/etc/crio/crio.conf.d/99-nvidia.conf"
TOOLKIT = "/etc/nvidia-container-runtime/config.toml"


def test_apply_is_idempotent_and_rollback_restores_etc(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path)
    before = host.snapshot("/etc")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert (code, doc["runtime"], doc["changed"], doc["restarted"]) == (0, "crio", [DROPIN, TOOLKIT], True)
    assert host.log("systemctl") == ["restart crio"]
    text = host.path(DROPIN).read_text()
    assert text == render_crio_dropin("/usr/libexec/crio/conmon") and text.startswith(HEADER + "\n")
    nvidia = tomllib.loads(text)["crio"]["runtime"]
    assert nvidia["default_runtime"] == "nvidia" and nvidia["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert nvidia["runtimes"]["nvidia"] == {"runtime_path": "/usr/bin/nvidia-container-runtime",
                                            "runtime_type": "oci", "monitor_path": "/usr/libexec/crio/conmon"}
    assert host.path(DROPIN).stat().st_mode & 0o777 == 0o644
    applied = host.snapshot("/etc")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert (code, doc["changed"], doc["restarted"]) == (0, [], False)
    assert host.snapshot("/etc") == applied and host.log("systemctl") == ["restart crio"]
    code, doc = cli(host.root, L4, "runtime", "rollback")
    assert (code, doc["changed"], doc["restarted"]) == (0, [DROPIN, TOOLKIT], True)
    assert host.log("systemctl") == ["restart crio", "restart crio"]
    assert host.snapshot("/etc") == before
    assert not host.path("/var/lib/nvidia-gpu-agent/rollback/runtime/manifest.json").exists()


def test_rollback_removes_a_created_dropin_dir(tmp_path: Path, cli: Cli) -> None:
    """crio.conf alone (no crio.conf.d): apply creates the dir, rollback leaves /etc as it was."""
    host = build_crio_host(tmp_path)
    host.path("/etc/crio/crio.conf.d/10-crio.conf").unlink()
    host.path("/etc/crio/crio.conf.d").rmdir()
    before = host.snapshot("/etc")
    assert cli(host.root, L4, "runtime", "apply", "--no-restart")[1]["changed"] == [DROPIN, TOOLKIT]
    assert cli(host.root, L4, "runtime", "rollback", "--no-restart")[0] == 0
    assert host.snapshot("/etc") == before and not host.path("/etc/crio/crio.conf.d").exists()
    assert host.log("systemctl") == []


def test_without_conmon_crio_finds_it_itself(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path, conmon=False)
    assert cli(host.root, L4, "runtime", "apply", "--no-restart")[0] == 0
    assert host.path(DROPIN).read_text() == render_crio_dropin(None)
    assert "monitor_path" not in host.path(DROPIN).read_text()


def test_check_is_ok_after_apply_and_not_before(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path)
    code, doc = cli(host.root, L4, "check")
    assert (code, doc["verdict"], doc["reasons"], doc["runtimeName"]) == (1, "unusable", ["runtime-not-ready"], "crio")
    assert doc["runtime"].startswith(f"crio {CRIO_VERSION}: CRI-O has no nvidia runtime")
    assert cli(host.root, L4, "runtime", "apply")[0] == 0
    code, doc = cli(host.root, L4, "check")
    assert (code, doc["verdict"], doc["reasons"], doc["runtimeName"]) == (0, "ok", [], "crio")
    assert doc["runtime"] == f"crio {CRIO_VERSION}: nvidia runtime configured (/usr/bin/nvidia-container-runtime)"


def test_check_without_crio_binary_names_crio_only(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path, crio_binary=False)
    assert cli(host.root, L4, "runtime", "apply", "--no-restart")[0] == 0
    code, doc = cli(host.root, L4, "check")
    assert code == 0 and doc["runtime"].startswith("crio: nvidia runtime configured")


def test_setup_and_teardown_on_crio(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path)
    before = host.snapshot("/etc")
    code, doc = cli(host.root, L4, "setup", "--no-patch-node")
    assert (code, doc["complete"]) == (0, True), doc
    assert [s["name"] for s in doc["steps"]] == ["check", "runtime", "sysctl"]
    code, doc = cli(host.root, L4, "teardown", "--no-patch-node")
    assert (code, doc["complete"]) == (0, True)
    assert host.snapshot("/etc") == before
    assert host.log("systemctl") == ["restart crio", "restart crio"]


def test_foreign_dropin_is_refused(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path)
    host.path(DROPIN).write_text('[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n')
    before = host.snapshot("/etc")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert code == 5 and doc["refused"] and "not written by nvidia-gpu" in doc["error"] and DROPIN in doc["error"]
    assert host.snapshot("/etc") == before and host.log("systemctl") == []
    code, doc = cli(host.root, L4, "runtime", "rollback")
    assert code == 0 and doc["changed"] == [] and host.path(DROPIN).exists()  # not ours: left alone


def test_both_runtimes_are_refused(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path, containerd=True)
    before = host.snapshot("/")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert code == 3 and "both containerd (/etc/containerd/config.toml) and CRI-O" in doc["error"]
    assert "/etc/crio/crio.conf" in doc["error"] and "/var/run/crio/crio.sock" in doc["error"]
    assert host.snapshot("/") == before
    code, doc = cli(host.root, L4, "check", "--no-record")
    assert code == 1 and doc["reasons"] == ["runtime-not-ready"] and "both containerd" in doc["runtime"]


def test_neither_runtime_names_the_paths_looked_at(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "l4x2", containerd=None)
    before = host.snapshot("/")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert code == 3 and "/etc/containerd/config.toml is missing" in doc["error"]
    for path in ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d", "/usr/bin/crio", "/var/run/crio/crio.sock"):
        assert path in doc["error"]
    assert host.snapshot("/") == before


@pytest.mark.parametrize("marker", ["/usr/bin/crio", "/var/run/crio/crio.sock", "/etc/crio/crio.conf.d"])
def test_any_crio_marker_is_enough(tmp_path: Path, cli: Cli, marker: str) -> None:
    host = build_fake_host(tmp_path, "l4x2", containerd=None)
    p = host.path(marker)
    if marker.endswith(".d"):
        p.mkdir(parents=True)
    else:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    code, doc = cli(host.root, L4, "runtime", "apply", "--no-restart")
    assert (code, doc["runtime"], doc["changed"]) == (0, "crio", [DROPIN, TOOLKIT])


def test_malformed_crio_config_leaves_the_host_alone(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path)
    host.path("/etc/crio/crio.conf.d/20-site.conf").write_text("[crio.runtime\nbroken = 1\n")
    before = host.snapshot("/")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert code == 3 and "20-site.conf is not valid TOML" in doc["error"]
    assert host.snapshot("/") == before
    code, doc = cli(host.root, L4, "check", "--no-record")
    assert doc["reasons"] == ["runtime-not-ready"] and "not valid TOML" in doc["runtime"]


def test_missing_nvidia_runtime_writes_nothing(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path, nvidia_container_runtime=False)
    before = host.snapshot("/etc")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert (code, doc["changed"], doc["restarted"]) == (0, [], False)
    assert any("nvidia-container-runtime is missing" in n for n in doc["notes"])
    assert host.snapshot("/etc") == before
    code, doc = cli(host.root, L4, "setup", "--no-patch-node")
    assert code == 1 and doc["steps"][-1]["name"] == "runtime" and not doc["steps"][-1]["ok"]


def test_toolkit_runtimes_note(tmp_path: Path, cli: Cli) -> None:
    bad = build_crio_host(tmp_path / "bad", toolkit_runtimes=["docker-runc", "runc"])
    code, doc = cli(bad.root, L4, "runtime", "apply", "--no-restart")
    assert code == 0 and any("none of which is installed" in n for n in doc["notes"])
    good = build_crio_host(tmp_path / "good", toolkit_runtimes=["crun", "runc"])
    code, doc = cli(good.root, L4, "runtime", "apply", "--no-restart")
    assert code == 0 and doc["notes"] == []


def test_no_gpu_crio_host_is_left_alone(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path, None)
    before = host.snapshot("/")
    code, doc = cli(host.root, L4, "runtime", "apply")
    assert (code, doc["skipped"]) == (0, "no-gpu")
    assert host.snapshot("/") == before


def test_toolkit_removed_after_apply_is_noted(tmp_path: Path, cli: Cli) -> None:
    host = build_crio_host(tmp_path)
    assert cli(host.root, L4, "runtime", "apply", "--no-restart")[0] == 0
    host.path("/usr/bin/nvidia-container-runtime").unlink()
    code, doc = cli(host.root, L4, "runtime", "apply", "--no-restart")
    assert code == 0 and doc["changed"] == [] and any("runtime rollback" in n for n in doc["notes"])
    code, doc = cli(host.root, L4, "check", "--no-record")
    # The handler names a binary that is gone, and no other toolkit program is there either.
    assert code == 1 and doc["reasons"] == ["runtime-not-ready", "toolkit-missing"]
