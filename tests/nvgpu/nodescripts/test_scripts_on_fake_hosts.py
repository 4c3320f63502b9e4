"""The bash scripts run against fake host roots: verdicts, idempotence, refusals, labels."""

from __future__ import annotations

from pathlib import Path

from nvgpu.nodescripts.content import dropin_for, sysctl_dropin
from nvgpu.nodescripts.facts import SYSCTL_DROPIN
from tests.kit.fakehost import build_fake_host
from tests.nvgpu.nodescripts.nodescript_helpers import RunScript, summary


def test_no_gpu_is_silent_success(tmp_path: Path, run_script: RunScript) -> None:
    host = build_fake_host(tmp_path, None)
    before = host.snapshot()
    check = run_script(host, "gpu-check.sh")
    assert check.returncode == 0
    assert summary(check.stdout, "nvidia-gpu-check") == {"verdict": "no-gpu", "reasons": ""}
    assert run_script(host, "gpu-runtime.sh").returncode == 0
    assert run_script(host, "gpu-sysctl.sh").returncode == 0
    assert host.snapshot() == before
    assert host.log("kubectl")[-1].endswith("node.deckhouse.io/gpu-setup-complete-")


def test_full_flow_on_containerd_1(tmp_path: Path, run_script: RunScript) -> None:
    host = build_fake_host(tmp_path, "dgx-a100-40gb", containerd=1)
    assert summary(run_script(host, "gpu-check.sh").stdout, "nvidia-gpu-check")["verdict"] == "ok"
    first = run_script(host, "gpu-runtime.sh")
    assert first.returncode == 0, first.stderr
    assert summary(first.stdout, "nvidia-gpu-runtime")["containerd"] == "2"
    dropin = host.path("/etc/containerd/conf.d/nvidia-gpu.toml")
    assert dropin.read_text() == dropin_for(2, systemd_cgroup=True, nvidia_default=True)
    assert summary(run_script(host, "gpu-runtime.sh").stdout, "nvidia-gpu-runtime")["result"] == "unchanged"
    sysctl = run_script(host, "gpu-sysctl.sh")
    assert "complete=true" in sysctl.stdout
    assert host.path(SYSCTL_DROPIN).read_text() == sysctl_dropin()
    assert host.path("/proc/sys/net/core/bpf_jit_harden").read_text().strip() == "1"
    assert host.path("/var/lib/nvidia-gpu-agent/sysctl.previous").read_text() == "net.core.bpf_jit_harden=2\n"
    assert host.log("kubectl")[-1].endswith("node.deckhouse.io/gpu-setup-complete=")
    run_script(host, "gpu-sysctl.sh")
    assert host.path("/var/lib/nvidia-gpu-agent/sysctl.previous").read_text() == "net.core.bpf_jit_harden=2\n"


def test_containerd_2_uses_conf2d_and_runc_stays_default_without_the_runtime(tmp_path: Path,
                                                                              run_script: RunScript) -> None:
    host = build_fake_host(tmp_path, "l4x2", containerd=2, nvidia_container_runtime=False)
    result = run_script(host, "gpu-runtime.sh")
    assert result.returncode == 0, result.stderr
    text = host.path("/etc/containerd/conf2.d/nvidia-gpu.toml").read_text()
    assert text == dropin_for(3, systemd_cgroup=True, nvidia_default=False)
    assert "runc stays the default runtime" in result.stderr


def test_unusable_node_removes_the_setup_label(tmp_path: Path, run_script: RunScript) -> None:
    host = build_fake_host(tmp_path, "t4x1", driver_version="418.67", modules=("nvidia",))
    check = run_script(host, "gpu-check.sh")
    assert check.returncode == 0
    assert summary(check.stdout, "nvidia-gpu-check") == {
        "verdict": "unusable", "reasons": "driver-too-old,module-missing"}
    run_script(host, "gpu-runtime.sh")
    sysctl = run_script(host, "gpu-sysctl.sh")
    assert "complete=false verdict=unusable" in sysctl.stdout
    assert host.log("kubectl")[-1].endswith("node.deckhouse.io/gpu-setup-complete-")
    strict = run_script(host, "gpu-check.sh", NVIDIA_GPU_CHECK_STRICT="true")
    assert strict.returncode == 1


def test_runtime_refuses_foreign_dropin_and_plain_containerd(tmp_path: Path, run_script: RunScript) -> None:
    host = build_fake_host(tmp_path / "a", "l4x2", containerd=1)
    host.path("/etc/containerd/conf.d/nvidia-gpu.toml").write_text("# someone else's\n")
    result = run_script(host, "gpu-runtime.sh")
    assert result.returncode == 1 and "not written by nvidia-gpu" in result.stderr
    assert host.path("/etc/containerd/conf.d/nvidia-gpu.toml").read_text() == "# someone else's\n"
    plain = build_fake_host(tmp_path / "b", "l4x2", containerd=1, deckhouse=False)
    before = plain.snapshot()
    result = run_script(plain, "gpu-runtime.sh")
    assert result.returncode == 1 and "not managed by Deckhouse" in result.stderr
    assert plain.snapshot() == before


def test_vfio_needs_the_iommu(tmp_path: Path, run_script: RunScript) -> None:
    good = build_fake_host(tmp_path / "on", "a30x4")
    assert summary(run_script(good, "gpu-vfio.sh").stdout, "nvidia-gpu-vfio") == {"ready": "true", "problems": ""}
    assert good.log("modprobe") == ["vfio", "vfio_pci", "vfio_iommu_type1"]
    off = build_fake_host(tmp_path / "off", "a30x4", iommu=False)
    assert summary(run_script(off, "gpu-vfio.sh").stdout, "nvidia-gpu-vfio") == {
        "ready": "false", "problems": "iommu-off"}
    assert off.log("kubectl")[-1].endswith("node.deckhouse.io/gpu-vfio-ready-")


def test_sysctl_migrates_the_former_dropin_name(tmp_path: Path, run_script: RunScript) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    former = host.path("/etc/sysctl.d/99-nvidia-gpu.conf")
    former.write_text(sysctl_dropin())
    run_script(host, "gpu-check.sh")
    result = run_script(host, "gpu-sysctl.sh")
    assert result.returncode == 0, result.stderr
    assert not former.exists() and host.path(SYSCTL_DROPIN).read_text() == sysctl_dropin()
    foreign = build_fake_host(tmp_path / "foreign", "a30x4")
    mine = foreign.path("/etc/sysctl.d/99-nvidia-gpu.conf")
    mine.write_text("net.core.bpf_jit_harden = 0\n")
    run_script(foreign, "gpu-check.sh")
    result = run_script(foreign, "gpu-sysctl.sh")
    assert "not written by nvidia-gpu; left alone" in result.stderr and mine.exists()
