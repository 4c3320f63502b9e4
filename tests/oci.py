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

from tests.tools import missing, required_bin

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
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Where the agent image (node_agent/Dockerfile) has the code and its virtual environment.
IMAGE_APP = "/app"
IMAGE_VENV = "/opt/agent"


@dataclass(frozen=True)
class ServiceAccountFiles:
    """What the kubelet projects into a pod: the bound token, the cluster CA, the namespace, and the
    ``KUBERNETES_SERVICE_*`` address (the API server on loopback here; the container shares the network)."""

    directory: Path
    host: str
    port: int

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path, directory: Path, namespace: str) -> ServiceAccountFiles:
        import base64
        from urllib.parse import urlsplit

        import yaml

        doc = yaml.safe_load(kubeconfig.read_text())
        cluster = doc["clusters"][0]["cluster"]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(doc["users"][0]["user"]["token"])
        if "certificate-authority-data" in cluster:
            (directory / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        else:
            shutil.copy(cluster["certificate-authority"], directory / "ca.crt")
        (directory / "namespace").write_text(namespace)
        url = urlsplit(cluster["server"])
        return cls(directory, url.hostname or "127.0.0.1", url.port or 443)


class PodContainer:
    """One container of a rendered pod spec, run by runc on a fake node whose root is ``node_root``.

    The "image" is this machine's own system directories, the Python the tests run and the repository,
    read-only; the container's command, args, env, securityContext and volume mounts are the rendered
    ones. hostPath volumes are the node's paths under ``node_root``; ``/sys`` is the node's sysfs
    (``node_root/sys``) as a pod sees the node's; emptyDirs are fresh directories; configMaps are their
    rendered data. The pod shares this machine's network, so the API server on loopback is its
    ``KUBERNETES_SERVICE_HOST``.
    """

    def __init__(self, runtime: Runtime, work: Path, node_root: Path, pod: dict[str, Any], container: dict[str, Any],
                 *, env: dict[str, str], config_maps: dict[str, dict[str, str]],
                 service_account: ServiceAccountFiles | None, repo: Path) -> None:
        import sys

        self.runtime = runtime
        self.name = f"nvgpu-{container['name']}-{uuid.uuid4().hex[:8]}"
        self.bundle = work / self.name
        self.rootfs = self.bundle / "rootfs"
        self.rootfs.mkdir(parents=True)
        self.log = self.bundle / "output.log"
        self.proc: subprocess.Popen[bytes] | None = None
        mounts: list[dict[str, Any]] = []

        def bind(source: Path, destination: str, *, read_only: bool) -> None:
            options = ["rbind", "ro"] if read_only else ["rbind"]
            mounts.append({"destination": destination, "type": "bind", "source": str(source), "options": options})

        # The image: the agent's code at /app and its Python environment at /opt/agent (where the
        # Dockerfile puts them), the interpreter the environment is built on, and the system directories.
        image = {"/usr", "/lib", "/lib64", "/bin", "/sbin", sys.base_prefix}
        for d in sorted(image):
            if Path(d).exists():
                bind(Path(d), d, read_only=True)
        bind(repo, IMAGE_APP, read_only=True)
        bind(Path(sys.prefix), IMAGE_VENV, read_only=True)
        # The image's own /etc: a copy of the few files a process reads, so that volumes can be mounted
        # under /etc as in any image (a bind of this machine's /etc would be read-only there).
        (self.rootfs / "etc").mkdir()
        for name in ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf"):
            if Path("/etc", name).is_file():
                shutil.copy(Path("/etc", name), self.rootfs / "etc" / name)
        bind(node_root / "sys", "/sys", read_only=True)
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for m in container.get("volumeMounts", []):
            volume = volumes[m["name"]]
            if "hostPath" in volume:
                source = node_root / volume["hostPath"]["path"].lstrip("/")
                if volume["hostPath"]["path"] == "/dev/null":  # the node's /dev/null is this machine's
                    source = Path("/dev/null")
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    source.mkdir(parents=True, exist_ok=True)
            elif "emptyDir" in volume:
                source = self.bundle / "volumes" / m["name"]
                source.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume:
                source = self.bundle / "volumes" / m["name"]
                source.mkdir(parents=True, exist_ok=True)
                for key, text in config_maps[volume["configMap"]["name"]].items():
                    (source / key).write_text(text)
            else:
                raise AssertionError(f"volume {m['name']}: no stand-in for {sorted(volume)}")
            assert source.exists(), f"volume {m['name']}: {source} is not on the node"
            bind(source, m["mountPath"], read_only=bool(m.get("readOnly")))
        if service_account is not None:
            bind(service_account.directory, SERVICE_ACCOUNT_DIR, read_only=True)
        security = container.get("securityContext", {})
        config = runtime.bundle(self.bundle, self.rootfs, [*container["command"], *container.get("args", [])], [])
        spec: dict[str, Any] = json.loads(config.read_text())
        base_env = {"PATH": f"{IMAGE_VENV}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
                    "PYTHONPATH": IMAGE_APP, "PYTHONDONTWRITEBYTECODE": "1"}
        if service_account is not None:
            base_env |= {"KUBERNETES_SERVICE_HOST": service_account.host,
                         "KUBERNETES_SERVICE_PORT": str(service_account.port)}
        spec["process"]["env"] = [f"{k}={v}" for k, v in {**base_env, **env}.items()]
        spec["process"]["cwd"] = IMAGE_APP
        spec["process"]["user"] = {"uid": int(security.get("runAsUser", 0)), "gid": 0}
        spec["root"]["readonly"] = bool(security.get("readOnlyRootFilesystem"))
        spec["mounts"] = [m for m in spec["mounts"] if m["destination"] not in ("/sys", "/sys/fs/cgroup")] + mounts
        spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
        if security.get("privileged"):
            caps = {k: privileged_caps() for k in ("bounding", "effective", "permitted")}
            spec["process"]["capabilities"] = caps
            spec["linux"]["maskedPaths"], spec["linux"]["readonlyPaths"] = [], []
        spec["process"].pop("rlimits", None)
        config.write_text(json.dumps(spec, indent=2))

    def start(self) -> PodContainer:
        self.runtime.state.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([str(self.runtime.bin_dir / "runc"), "--root", str(self.runtime.state), "run",
                                          "--bundle", str(self.bundle), self.name], stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int | None:
        runc = [str(self.runtime.bin_dir / "runc"), "--root", str(self.runtime.state)]
        if self.proc is not None and self.proc.poll() is None:
            subprocess.run([*runc, "kill", self.name, "TERM"], capture_output=True, check=False)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                subprocess.run([*runc, "kill", self.name, "KILL"], capture_output=True, check=False)
                self.proc.wait(10)
        subprocess.run([*runc, "delete", "--force", self.name], capture_output=True, check=False)
        return self.proc.returncode if self.proc is not None else None
