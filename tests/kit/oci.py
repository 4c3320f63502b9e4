"""Real containers for the tests: OCI bundles run by the pinned runc, devices added by the CDI library.

What a node's container runtime does for a pod on a runc-default node, without the kubelet: the pinned
``cdi-inject`` (tools/cdi: the CNCF container-device-interface library containerd and CRI-O use) adds the
CDI devices a plugin named to ``config.json``, and runc creates the container, running the spec's OCI
hooks (the NVIDIA Container Toolkit's ``nvidia-cdi-hook``) on the way. The root file system is a minimal
one built from this machine's own files: the programs asked for and the libraries they link against.
Needs root (runc creates namespaces and device nodes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kit.tools import missing, required_bin

#: Debian's library directories, as a multiarch container image lists them in /etc/ld.so.conf.d.
MULTIARCH = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu")


def require_root() -> None:
    if os.geteuid() != 0:
        missing("real containers need root (runc)")


def _deps(program: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=False).stdout
    found = [Path(m) for m in re.findall(r"(/\S+) \(0x", out)]
    return [p for p in found if p.exists()]


def minimal_rootfs(dest: Path, programs: dict[str, Path]) -> Path:
    """A root file system holding ``programs`` (container path -> file here) and what they link against."""
    for d in ("proc", "sys", "dev", "tmp", "etc/ld.so.conf.d", "usr/bin", *(m.lstrip("/") for m in MULTIARCH)):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (dest / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text("\n".join(MULTIARCH) + "\n")
    for inside, program in programs.items():
        target = dest / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(program, target)
        for lib in _deps(program):
            real = lib.resolve()
            copy = dest / str(lib).lstrip("/")
            copy.parent.mkdir(parents=True, exist_ok=True)
            if not copy.exists():
                shutil.copy2(real, copy)
    # Like any image: a linker cache built from its own configuration (the toolkit's update-ldcache hook
    # only updates a cache the image has).
    subprocess.run(["ldconfig", "-r", str(dest)], check=True, capture_output=True)
    return dest


@dataclass(frozen=True)
class Runtime:
    bin_dir: Path
    state: Path

    @classmethod
    def pinned(cls, state: Path) -> Runtime:
        require_root()
        return cls(required_bin("runc", "cdi-inject", "nvidia-cdi-hook"), state)

    @property
    def hook(self) -> Path:
        return self.bin_dir / "nvidia-cdi-hook"

    def bundle(self, directory: Path, rootfs: Path, args: list[str], env: list[str]) -> Path:
        """``runc spec`` made into a one-shot container running ``args`` in ``rootfs``."""
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(self.bin_dir / "runc"), "spec", "--bundle", str(directory)], check=True)
        config = directory / "config.json"
        spec: dict[str, Any] = json.loads(config.read_text())
        spec["root"] = {"path": str(rootfs), "readonly": False}
        spec["process"].update(args=args, env=["PATH=/usr/bin:/bin", *env], terminal=False)
        config.write_text(json.dumps(spec, indent=2))
        return config

    def inject(self, config: Path, spec_dirs: list[Path], devices: list[str]) -> dict[str, Any]:
        done = subprocess.run([str(self.bin_dir / "cdi-inject"), "-spec-dirs", ",".join(map(str, spec_dirs)),
                               "-config", str(config), *devices], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(config.read_text())
        return result

    def list_devices(self, spec_dirs: list[Path]) -> list[str]:
        done = subprocess.run([str(self.bin_dir / "cdi-inject"), "-spec-dirs", ",".join(map(str, spec_dirs)),
                               "-list"], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def run(self, bundle: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        name = f"nvgpu-test-{uuid.uuid4().hex[:12]}"
        self.state.mkdir(parents=True, exist_ok=True)
        try:
            return subprocess.run([str(self.bin_dir / "runc"), "--root", str(self.state), "run", "--bundle",
                                   str(bundle), name], capture_output=True, text=True, timeout=timeout, check=False)
        finally:
            subprocess.run([str(self.bin_dir / "runc"), "--root", str(self.state), "delete", "--force", name],
                           capture_output=True, check=False)


#: Every Linux capability runc knows, for privileged containers (``securityContext.privileged``).
_CAP_NAMES = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
              "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
              "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE "
              "AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ "
              "PERFMON BPF CHECKPOINT_RESTORE")
ALL_CAPS = [f"CAP_{c}" for c in _CAP_NAMES.split(" ")]  # in capability-number order


def privileged_caps() -> list[str]:
    """What a privileged container gets: every capability this process's bounding set holds (a runtime
    cannot grant more than it has)."""
    bounding = next(int(line.split()[1], 16) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("CapBnd:"))
    return [name for bit, name in enumerate(ALL_CAPS) if bounding >> bit & 1]
