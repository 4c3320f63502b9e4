"""A real node for the loopback control plane: containerd and the kubelet in namespaces of their own
(``python -m localcluster node add NAME``; issue 35, whose notes record the prototype this follows).

State lives under ``<cluster>/nodes/NAME/``. Inside the node's mount namespace the standard paths are the
node's own, so containerd and the kubelet run with their defaults and hostPath volumes resolve inside the
node:

- ``/etc``: an overlay, the host's ``/etc`` below and ``root/etc`` above (containerd's config and drop-ins,
  the CNI config). Once mounted, ``root/etc`` is written only through the node's view (overlayfs caches its
  upper layer: edits from outside are not seen, and renames then fail with ESTALE).
- ``/var/lib``, ``/var/log``, ``/run``: binds of ``root/var/lib``, ``root/var/log``, ``root/run``.
- ``/usr``: an overlay like ``/etc`` (``root/usr`` above): the node's ``systemctl`` (its supervisor's, see
  :mod:`localcluster.supervisor`) and, on a GPU node, the driver and the NVIDIA Container Toolkit installed as
  their packages install them.
- ``/dev``: an overlay on the host's ``/dev`` (``root/dev`` above) with fresh ``pts``, ``shm`` and ``mqueue``:
  a GPU node's ``/dev/nvidia*`` character devices exist only in the node's view, never in this machine's.

A GPU node (``--machine dgx-h100``) is the machine's driver without the silicon: NVIDIA's go-nvml model of the
machine (``tools/mocknvml``, the copy linked for that machine and for ``/dev``, so a process sees only the
GPUs whose device node it has, as on a node) installed as the driver's ``libnvidia-ml`` in
``/usr/lib/x86_64-linux-gnu`` beside the driver's other libraries, tools and firmware
(:mod:`localcluster.driverinstall`), the device nodes with the driver's numbers (major 195, the GPU's minor;
``nvidiactl`` 255), and the toolkit's programs in ``/usr/bin``. Opening a device node answers ENXIO (no
kernel module): nothing on the node opens one but a CUDA program, and the mock answers NVML.

Its network namespace holds the node IP (``10.200.0.INDEX/32`` on ``lo``: this kernel has no ``dummy``
links, and the kubelet refuses a loopback node IP), the CNI bridge with ``10.244.INDEX.0/24``, and the DNAT
of the ``kubernetes`` Service (``10.96.0.1:443``) to :mod:`localcluster.netproxy`'s API listener; nothing is
added to the host's network. The pods' cgroups are one tree per node (``/nvgpu-NAME-CLUSTERHASH`` in each cgroup v1
hierarchy). Sandbox limits the settings answer are noted where they are set.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.client import ApiError, Kube
from localcluster.driverinstall import install_driver
from localcluster.images import PAUSE_IMAGE, pause_archive
from localcluster.netproxy import NODE_API_PORT
from localcluster.processes import alive, stop_child, stop_pid

#: The node's ``systemctl``, the client of its supervisor (:mod:`localcluster.supervisor`, which imports this
#: module); ``@CONTROL@`` is the control directory.
SYSTEMCTL = r"""#!/bin/sh
# systemctl of a localcluster node (localcluster/supervisor.py): the node has no systemd; its supervisor
# manages containerd and the kubelet. Requests are files in the node's control directory.
control=@CONTROL@
action="${1:-}"; unit="${2:-}"
unit="${unit%.service}"
case "$action" in start|stop|restart|kill|is-active) ;; *)
  echo "systemctl (localcluster node): '$action' is not supported: start|stop|restart|kill|is-active UNIT" >&2
  exit 1;;
esac
id="$$-$(date +%s%N)"
printf '%s %s\n' "$action" "$unit" > "$control/$id.tmp" && mv "$control/$id.tmp" "$control/$id.req"
i=0
while [ ! -f "$control/$id.done" ]; do
  i=$((i + 1))
  if [ "$i" -gt 1200 ]; then echo "systemctl: the node's supervisor did not answer in 120 s" >&2; exit 1; fi
  sleep 0.1
done
rc="$(head -n 1 "$control/$id.done")"
tail -n +2 "$control/$id.done" >&2
rm -f "$control/$id.done"
exit "$rc"
"""

BOOT_ID = "/proc/sys/kernel/random/boot_id"
SERVICE_IP = "10.96.0.1"
SERVICE_RANGE = "10.96.0.0/16"
#: Node indexes: the node IP is 10.200.0.INDEX, its pod range 10.244.INDEX.0/24.
MAX_INDEX = 250
CGROUP_V1 = Path("/sys/fs/cgroup")
#: Seconds a daemon gets between SIGTERM and SIGKILL.
GRACE_S = 5.0
@dataclass(frozen=True)
class Machine:
    """A ``--machine``: go-nvml's mock server (``tools/mocknvml``) and what its GPUs are (go-nvml
    ``pkg/nvml/mock/gpus/*.go``; eight per machine, bus IDs ``0000:<index>:00.0`` and minors by index as
    ``mock/server/shared.go`` gives them), for the kernel's side of the node: sysfs and ``/proc/driver``."""

    mock: str
    driver_version: str
    product: str
    pci_device_id: int
    dmi_product: str  #: the board's DMI product name (GPU feature discovery's ``nvidia.com/gpu.machine``)


MACHINES: dict[str, Machine] = {
    "dgx-a100": Machine("dgxa100", "550.54.15", "Mock NVIDIA A100-SXM4-40GB", 0x20B0, "DGXA100 920-23687-2530-000"),
    "dgx-h100": Machine("dgxh100", "550.54.15", "NVIDIA H100 80GB HBM3", 0x2330, "DGXH100"),
    "dgx-h200": Machine("dgxh200", "550.54.15", "NVIDIA H200 141GB HBM3e", 0x2333, "DGXH200"),
    "dgx-b200": Machine("dgxb200", "560.28.03", "NVIDIA B200 180GB HBM3e", 0x2B00, "DGXB200"),
}
#: Where a GPU node's MIG state lives (``tools/mocknvml/state.go``, linked into the node's NVML by
#: ``tools/mocknvml/build.sh``): the node's sysfs view, which :mod:`localcluster.kernelview` shows every container
#: (read-only unless the container's ``/sys`` is writable, a privileged one's), as the GPUs' state is the same for
#: every process on a real node.
MIG_STATE_PATH = "/sys/devices/virtual/nvidia-mock/mig-state.json"
#: GPU-instance and compute-instance slots the driver reserves ``nvidia-caps`` minors for, per GPU.
MIG_GI_SLOTS, MIG_CI_SLOTS = 15, 8
#: The driver's kernel modules as a node has them loaded (``/sys/module/<name>``).
DRIVER_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
#: The driver's device numbers: ``nvidia<minor>`` and ``nvidiactl`` have the fixed major 195 (NVIDIA's
#: ``nvidia-modprobe`` and ``/proc/devices``); ``nvidia-uvm`` takes a dynamic major, any free one.
NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR, GPUS_PER_MACHINE = 195, 510, 509, 8
#: The NVIDIA Container Toolkit's programs, as its packages install them in ``/usr/bin``.
TOOLKIT_PROGRAMS = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime", "nvidia-container-runtime.cdi",
                    "nvidia-container-runtime.legacy", "nvidia-container-runtime-hook")
#: Seconds to wait for the supervisor's answer to a request.
REQUEST_TIMEOUT_S = 60.0
#: The daemons this process started, by pid: kept so that a running one is never garbage-collected (which
#: warns) and so that stopping one reaps it.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class NodeError(RuntimeError):
    """A node could not be set up or started; the message names the step and carries the tool's words."""


def _run(argv: Sequence[str], what: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NodeError(f"{what}: {' '.join(argv[:3])} failed: {done.stderr.strip()}")


@dataclass
class Node:
    """One node: :meth:`add` creates and starts it, :meth:`remove` leaves nothing of it behind."""

    cluster_dir: Path
    name: str
    index: int
    bin_dir: Path
    pids: dict[str, int] = field(default_factory=dict)
    removing: bool = False
    machine: str | None = None

    @classmethod
    def new(cls, cluster_dir: Path, name: str, bin_dir: Path, *, machine: str | None = None) -> Node:
        """A node not yet added, with the lowest index no node in ``cluster_dir`` has."""
        if not name or len(name) > 40 or not all(c.isalnum() or c == "-" for c in name) or not name[0].isalnum():
            raise NodeError(f"node name {name!r}: letters, digits and '-' (at most 40), starting alphanumeric")
        if machine is not None and machine not in MACHINES:
            raise NodeError(f"--machine {machine!r}: one of {', '.join(MACHINES)}")
        if (cluster_dir / "nodes" / name).exists():
            raise NodeError(f"node {name} exists in {cluster_dir} (remove it first)")
        taken = {n.index for n in cls.all(cluster_dir)}
        index = next((i for i in range(1, MAX_INDEX + 1) if i not in taken), None)
        if index is None:
            raise NodeError(f"{MAX_INDEX} nodes already")
        return cls(cluster_dir=cluster_dir, name=name, index=index, bin_dir=bin_dir, machine=machine)

    @classmethod
    def all(cls, cluster_dir: Path) -> list[Node]:
        """Every node :meth:`add` left in ``cluster_dir`` (also half-added ones, for :meth:`remove`)."""
        nodes = []
        for state in sorted((cluster_dir / "nodes").glob("*/state.json")):
            with contextlib.suppress(OSError, ValueError, KeyError):
                nodes.append(cls.attach(cluster_dir, state.parent.name))
        return nodes

    @classmethod
    def attach(cls, cluster_dir: Path, name: str) -> Node:
        """The node :meth:`add` left in ``cluster_dir`` (raises if there is none)."""
        state = json.loads((cluster_dir / "nodes" / name / "state.json").read_text())
        return cls(cluster_dir=cluster_dir, name=name, index=int(state["index"]), bin_dir=Path(state["bin_dir"]),
                   pids={k: int(v) for k, v in state["pids"].items()}, removing=bool(state.get("removing")),
                   machine=state.get("machine"))

    # --- names and paths ------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self.cluster_dir / "nodes" / self.name

    @property
    def ip(self) -> str:
        return f"10.200.0.{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def cgroup_root(self) -> str:
        """The node's cgroup tree, named after the node and its cluster: the hierarchies are the machine's,
        and two clusters (parallel test runs, ``make cluster-up`` beside one) may both have a node ``n1``."""
        cluster = hashlib.sha256(str(self.cluster_dir.resolve()).encode()).hexdigest()[:8]
        return f"nvgpu-{self.name}-{cluster}"

    @property
    def runc(self) -> Path:
        """The runc containerd runs: the tools' own, or on a GPU node :mod:`localcluster.kernelview` over it."""
        return self.directory / "bin" / "runc" if self.machine is not None else self.bin_dir / "runc"

    @property
    def boot_id_file(self) -> Path:
        """The node's ``/proc/sys/kernel/random/boot_id`` (a bind in its view; :meth:`reboot` writes a new one)."""
        return self.directory / "boot_id"

    @property
    def mig_state_file(self) -> Path:
        """A GPU node's MIG state (:data:`MIG_STATE_PATH`) as stored on this machine (read it, never write it:
        the node's view is an overlay on it)."""
        return self.directory / "kernel" / "sys-devices" / MIG_STATE_PATH.removeprefix("/sys/devices/")

    @property
    def mig_minors_file(self) -> Path:
        """A GPU node's ``/proc/driver/nvidia-caps/mig-minors`` as stored on this machine."""
        return self.directory / "kernel" / "proc-driver" / "nvidia-caps" / "mig-minors"

    @property
    def containerd_socket(self) -> Path:
        return self.directory / "root" / "run" / "containerd" / "containerd.sock"

    def ctr(self) -> list[str]:
        """``ctr`` on the node's containerd (namespace ``k8s.io``), run inside the node: the socket's path
        from here (``containerd_socket``) can pass the 107 bytes a unix socket address holds."""
        return self.nsenter([str(self.bin_dir / "ctr"), "--address", "/run/containerd/containerd.sock",
                             "-n", "k8s.io"])

    def crictl(self) -> list[str]:
        """``crictl`` on the node's containerd, run inside the node (see :meth:`ctr`)."""
        return self.nsenter([str(self.bin_dir / "crictl"), "--runtime-endpoint",
                             "unix:///run/containerd/containerd.sock"])

    def ns(self, kind: str) -> Path:
        return self.directory / "ns" / kind

    def nsenter(self, argv: Sequence[str], *, path_first: Path | None = None) -> list[str]:
        """``argv`` inside the node (nsenter and env exec, so the child's pid is the program's); ``path_first``:
        a directory ahead of the tools on ``PATH`` (a GPU node's ``runc``, :mod:`localcluster.kernelview`)."""
        path = f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        if path_first is not None:
            path = f"{path_first}:{path}"
        return ["nsenter", f"--net={self.ns('net')}", f"--mount={self.ns('mnt')}", f"--uts={self.ns('uts')}",
                "--", "env", f"PATH={path}", *argv]

    # --- lifecycle ------------------------------------------------------------------------

    def add(self, *, ca_cert: Path, ca_key: Path, images: Sequence[Path], timeout: float = 60.0) -> Node:
        """Credentials, files, namespaces, cgroups; then containerd, the images, the kubelet."""
        d = self.directory
        for sub in ("ns", "root/etc", "work/etc", "root/usr/bin", "work/usr", "root/dev", "work/dev",
                    "work/sys-devices", "work/sys-bus-pci-devices", "work/sys-module", "work/sys-class", "root/var/lib",
                    "root/var/log", "root/run", "pki", "logs", "control"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self._save_state()  # claims the index; remove() can undo a half-done add from here on
        self._credentials(ca_cert, ca_key)
        self._write_files(ca_cert)  # before the overlays exist (see the module docstring)
        self.boot_id_file.write_text(f"{uuid.uuid4()}\n")
        if self.machine is not None:
            self._gpu_host(self.machine)
        self._namespaces()
        self._cgroups()
        self._start_supervisor()
        deadline = time.monotonic() + timeout
        while not self.containerd_socket.is_socket():
            if time.monotonic() > deadline:
                raise NodeError(f"containerd of {self.name} did not listen; see {d / 'logs' / 'containerd.log'}")
            time.sleep(0.1)
        for image in images:
            self.import_image(image)
        self._notify_proxy()  # its API listener in the node's netns, before the kubelet dials it
        self.start("kubelet")
        return self

    def _notify_proxy(self) -> None:
        """SIGHUP to the control plane's netproxy: it re-reads the nodes now (it also does every 0.5 s)."""
        with contextlib.suppress(OSError, ValueError, KeyError, ProcessLookupError, TypeError):
            pid = int(json.loads((self.cluster_dir / "state.json").read_text())["pids"]["netproxy"])
            os.kill(pid, signal.SIGHUP)
            time.sleep(0.2)

    def import_image(self, archive: Path) -> list[str]:
        """An OCI or Docker archive into the node's ``k8s.io`` namespace (no registry anywhere). Each image an
        OCI archive names is also tagged ``REPO@DIGEST``: the CRI reports a repo digest (and so resolves a
        pod's by-digest reference) only for such a name, which a pull makes and an import does not.
        Answers those by-digest references."""
        ctr = self.ctr()
        with archive.open("rb") as tar:  # on stdin: the node's /var/lib, /run ... are not this machine's
            done = subprocess.run([*ctr, "images", "import", "--local", "-"], stdin=tar, capture_output=True,
                                  text=True, check=False)
        if done.returncode != 0:
            raise NodeError(f"importing {archive.name} into {self.name}: ctr images import failed: "
                            f"{done.stderr.strip()}")
        refs = []
        for name, digest in _oci_names(archive):
            repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
            refs.append(f"{repo}@{digest}")
            _run([*ctr, "images", "tag", "--force", name, refs[-1]], f"tagging {name} by digest in {self.name}")
        return refs

    def command(self, component: str) -> list[str]:
        if component == "containerd":
            return self.nsenter([str(self.bin_dir / "containerd")], path_first=self.directory / "bin")
        if component == "kubelet":
            return self.nsenter([str(self.bin_dir / "kubelet"), "--config", str(self.directory / "kubelet.yaml"),
                                 "--kubeconfig", str(self.directory / "kubelet.kubeconfig"),
                                 "--hostname-override", self.name, "--node-ip", self.ip, "--v=2"])
        raise ValueError(component)

    def _start_supervisor(self) -> None:
        """The node's service manager (:mod:`localcluster.supervisor`), which starts containerd at once."""
        log = (self.directory / "logs" / "supervisor.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "localcluster.supervisor", str(self.directory),
                                 "--start", "containerd"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=Path(__file__).resolve().parent.parent)
        log.close()
        _CHILDREN[proc.pid] = proc
        self.pids["supervisor"] = proc.pid
        self._save_state()

    def request(self, action: str, unit: str, *, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, str]:
        """What the node's ``systemctl ACTION UNIT`` does: a request to its supervisor; (exit code, message)."""
        control = self.directory / "control"
        rid = f"h{os.getpid()}-{time.monotonic_ns()}"
        (control / f"{rid}.tmp").write_text(f"{action} {unit}\n")
        (control / f"{rid}.tmp").rename(control / f"{rid}.req")
        done = control / f"{rid}.done"
        deadline = time.monotonic() + timeout
        while not done.exists():
            if time.monotonic() > deadline:
                raise NodeError(f"the supervisor of {self.name} did not answer {action} {unit} in {timeout:.0f} s; "
                                f"see {self.directory / 'logs' / 'supervisor.log'}")
            time.sleep(0.05)
        rc, _, message = done.read_text().partition("\n")
        done.unlink()
        return int(rc), message.strip()

    def unit_pid(self, unit: str) -> int | None:
        """The running pid of ``unit`` as the supervisor last recorded it."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            pid = json.loads((self.directory / "supervisor.json").read_text())[unit]["pid"]
            return int(pid) if pid else None
        return None

    def start(self, component: str) -> None:
        self._expect(self.request("start", component), "start", component)

    def stop(self, component: str) -> None:
        """The unit stopped (SIGTERM, SIGKILL after the supervisor's grace) and not restarted until asked; returns
        once its process is gone (a kubelet started again before the old one let go of :10250 exits with
        "address already in use")."""
        self._expect(self.request("stop", component), "stop", component)

    def restart(self, component: str) -> None:
        self._expect(self.request("restart", component), "restart", component)

    def kill(self, component: str) -> None:
        """SIGKILL, as a crash: the supervisor starts it again (``Restart=always``)."""
        self._expect(self.request("kill", component), "kill", component)

    def _expect(self, answer: tuple[int, str], action: str, unit: str) -> None:
        if answer[0] != 0:
            raise NodeError(f"{action} {unit} on {self.name}: {answer[1]}")

    def reboot(self, *, timeout: float = 60.0) -> str:
        """What a reboot does to the node's software and GPUs, the disk kept (``/var/lib``, ``/etc``):

        - the kubelet and containerd stop and every process of the node's pods dies (SIGKILL: no pod is told);
        - every mount the runtime and the kubelet made in the node's view goes (pods' rootfs, volumes, network
          namespaces), and ``/run``, a tmpfs on a real node, is empty: no CDI spec, socket or state survives there;
        - ``/dev`` has none of the driver's nodes: the kernel module makes none, and nothing made them yet
          (``nvidia-modprobe``, ``nvidia-ctk system create-device-nodes`` or node setup will);
        - a new boot ID, on which the GPUs come back with their MIG mode but without their GPU and compute
          instances (the node's NVML compares the boot its MIG state was written on: ``tools/mocknvml/state.go``);

        then containerd and the kubelet start again, as their units would at boot. Answers the new boot ID (the
        Node reports it once the new kubelet posted its status: :func:`wait_ready`'s ``boot_id``)."""
        for unit in ("kubelet", "containerd"):
            self.stop(unit)
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self._processes():
            if time.monotonic() > deadline:
                raise NodeError(f"processes of {self.name} outlived SIGKILL: {sorted(self._processes())}")
            time.sleep(0.1)
        # Deepest first; lazily, as a shutdown does. /run itself (the node's bind) stays.
        script = r"""set -e
awk '{print $5}' /proc/self/mountinfo | grep -E '^(/run/|/var/lib/kubelet/|/var/lib/containerd/)' | sort -r |
  while read -r m; do umount -l "$m"; done
find /run -mindepth 1 -maxdepth 1 -exec rm -rf {} +
rm -rf /dev/nvidia* /dev/nvidia-caps
"""
        _run(self.nsenter(["sh", "-c", script]), f"rebooting {self.name}")
        boot_id = str(uuid.uuid4())
        with self.boot_id_file.open("r+") as f:  # in place: the node's bind holds this inode
            f.write(f"{boot_id}\n")
        for unit in ("containerd", "kubelet"):
            self.start(unit)
        return boot_id

    def remove(self) -> None:
        """Everything of the node, in the order that leaves nothing: the kubelet (so nothing recreates pods),
        the pods (CNI DEL gives their IPs back), every process in the node's netns (containerd, the shims)
        and cgroup tree, the namespace files (the kernel then frees the namespaces and every mount inside
        them), the cgroup tree, the directory."""
        d = self.directory
        if not d.exists():
            return
        self.removing = True
        self._save_state()
        self._notify_proxy()  # closes its listener in the netns (which would keep the namespace alive)
        supervisor = self.pids.get("supervisor")
        if alive(supervisor):
            with contextlib.suppress(NodeError):
                self.stop("kubelet")
        else:
            stop_pid(self.unit_pid("kubelet"), GRACE_S)
        if self.containerd_socket.is_socket():
            crictl = self.crictl()
            pods = subprocess.run([*crictl, "pods", "-q"], capture_output=True, text=True, check=False).stdout.split()
            if pods:
                subprocess.run([*crictl, "stopp", *pods], capture_output=True, check=False)
                subprocess.run([*crictl, "rmp", "-f", *pods], capture_output=True, check=False)
        supervisor_proc = _CHILDREN.pop(supervisor or 0, None)
        if supervisor_proc is not None:  # stops containerd, then exits
            stop_child(supervisor_proc, GRACE_S * 3)
        else:
            stop_pid(supervisor, GRACE_S * 3)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(1.0 if sig == signal.SIGTERM else 0.2)
        for pid in list(self.pids.values()):
            child = _CHILDREN.pop(pid, None)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(GRACE_S)
        self.pids.clear()
        for path in (self.ns("net"), self.ns("mnt"), self.ns("uts"), d / "ns"):
            subprocess.run(["umount", str(path)], capture_output=True, check=False)
        # runc also makes the path in the cgroup2 ("unified") mount of this hybrid host: remove it there too.
        for hierarchy in [*_v1_hierarchies(), CGROUP_V1 / "unified"]:
            root = hierarchy / self.cgroup_root
            if root.is_dir():
                for sub in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        sub.rmdir()
                with contextlib.suppress(OSError):
                    root.rmdir()
        left = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f" {d}" in line]
        if left:
            raise NodeError(f"mounts remain under {d}: " + "; ".join(left))
        shutil.rmtree(d)

    # --- steps ----------------------------------------------------------------------------

    def _processes(self) -> set[int]:
        """Every process in the node's netns or its cgroup tree (containers sit in their pods' netns)."""
        found: set[int] = set()
        with contextlib.suppress(OSError):
            ino = os.stat(self.ns("net")).st_ino
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):
                        if os.stat(entry / "ns" / "net").st_ino == ino:
                            found.add(int(entry.name))
        pids_root = CGROUP_V1 / "pids" / self.cgroup_root
        if pids_root.is_dir():
            for procs in pids_root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    found.update(int(p) for p in procs.read_text().split())
        found.discard(os.getpid())
        return found

    def _credentials(self, ca_cert: Path, ca_key: Path) -> None:
        """The kubelet's client certificate (the Node authorizer's ``system:node:NAME`` in ``system:nodes``)
        and its serving certificate (the API server verifies it: SANs for the name it dials and the IP)."""
        pki = self.directory / "pki"
        if (pki / "kubelet.crt").exists():
            return
        subject = f"/O=system:nodes/CN=system:node:{self.name}"
        pairs = {"kubelet-client": "extendedKeyUsage=clientAuth\n",
                 "kubelet": f"subjectAltName=IP:{self.ip},IP:127.0.0.1,DNS:{self.name}\nextendedKeyUsage=serverAuth\n"}
        for name, ext in pairs.items():
            (pki / f"{name}.ext").write_text(ext + "keyUsage=digitalSignature,keyEncipherment\n")
            _run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                  "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.csr")], "node key")
            _run(["openssl", "x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(ca_cert),
                  "-CAkey", str(ca_key), "-CAcreateserial", "-days", "30", "-extfile", str(pki / f"{name}.ext"),
                  "-out", str(pki / f"{name}.crt")], "node certificate")

    def _write_files(self, ca_cert: Path) -> None:
        d, pki, b = self.directory, self.directory / "pki", self.bin_dir
        (d / "kubelet.kubeconfig").write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "local", "cluster": {"server": f"https://127.0.0.1:{NODE_API_PORT}",
                                                       "certificate-authority": str(ca_cert)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(pki / "kubelet-client.crt"),
                                                "client-key": str(pki / "kubelet-client.key")}}],
            "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}]}, indent=1))
        etc = d / "root" / "etc"
        (etc / "containerd" / "conf.d").mkdir(parents=True, exist_ok=True)
        (etc / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (etc / "containerd" / "config.toml").write_text(f"""\
version = 3
imports = ["/etc/containerd/conf.d/*.toml"]
# Not on this machine or not needed: btrfs/zfs/devmapper/erofs; opt installs into /opt; NRI.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
                    "io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri",
                    "io.containerd.tracing.processor.v1.otlp"]
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins."io.containerd.cri.v1.runtime"]
  # No CAP_SYS_RESOURCE in this sandbox: a negative oom_score_adj (the kubelet asks -998 for every
  # sandbox, -997 for Guaranteed pods) fails in runc with EACCES; clamp to containerd's own.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{self.runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{b / 'cni'}"]
    conf_dir = "/etc/cni/net.d"
""")
        (etc / "cni" / "net.d" / "10-bridge.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "node", "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_cidr}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=1))
        (d / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(pki / "kubelet.crt"), "tlsPrivateKeyFile": str(pki / "kubelet.key"),
            "readOnlyPort": 0,
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            # PID 1 is not systemd; the per-node root must exist before the kubelet starts (_cgroups).
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True, "cgroupRoot": f"/{self.cgroup_root}",
            "enforceNodeAllocatable": ["pods"],
            "oomScoreAdj": 0,  # the default -999 needs CAP_SYS_RESOURCE
            "failSwapOn": False,
            "resolvConf": "/etc/resolv.conf", "clusterDomain": "cluster.local",
            "imageGCHighThresholdPercent": 100,  # no registry: a collected image cannot come back
            "evictionHard": {"memory.available": "1%", "nodefs.available": "1%", "imagefs.available": "1%"},
            "podCIDR": self.pod_cidr, "registerNode": True}, indent=1))

    def _gpu_host(self, machine: str) -> None:
        """The machine's driver and the toolkit in the node's ``/usr`` (written before the overlay exists)."""
        mock, version = MACHINES[machine].mock, MACHINES[machine].driver_version
        library = self.bin_dir / "mocknvml-node" / mock / "libnvidia-ml.so.1"
        if not library.is_file():
            raise NodeError(f"{library} missing: make tools builds the node's NVML (tools/mocknvml)")
        staging = self.directory / "driver"
        repo = Path(__file__).resolve().parent.parent
        smi = (f'#!/bin/sh\nPYTHONPATH="{repo}" exec "{sys.executable}" -m nvml_sim.smi '
               f'--driver-root / "$@"\n')  # NVIDIA's nvidia-smi needs the kernel module; this reads NVML
        install_driver(staging, version, nvml_library=library.resolve(), nvidia_smi=smi)
        usr = self.directory / "root" / "usr"
        shutil.copytree(staging / "usr", usr, symlinks=True, dirs_exist_ok=True)
        shutil.copytree(staging / "lib", usr / "lib", symlinks=True, dirs_exist_ok=True)  # /lib is usr/lib
        shutil.rmtree(staging)
        for program in TOOLKIT_PROGRAMS:
            source = self.bin_dir / "container-toolkit" / program
            if source.exists():
                shutil.copy(source.resolve(), usr / "bin" / program)
        self._kernel_driver(MACHINES[machine])
        wrapper = self.directory / "bin" / "runc"
        wrapper.parent.mkdir(exist_ok=True)
        program = Path(__file__).with_name("kernelview.py").read_text()
        wrapper.write_text(program.replace('RUNC = "@RUNC@"', f'RUNC = "{(self.bin_dir / "runc").resolve()}"'))
        wrapper.chmod(0o755)

    def _kernel_driver(self, machine: Machine) -> None:
        """What the loaded kernel driver shows, for the node's view only: the GPUs' PCI functions in sysfs
        (under ``/sys/devices/pci0000:00``, linked from ``/sys/bus/pci/devices``, bound to ``nvidia``), the
        modules in ``/sys/module`` (``initstate`` live; this kernel has no loadable modules, hence no
        ``/proc/modules``: the agent reads ``/sys/module`` then), ``/proc/driver/nvidia`` (version, one
        ``information`` per GPU) and ``/proc/devices`` with the driver's majors. Overlays on sysfs and
        binds over procfs entries, mounted by :meth:`_namespaces`; the host's own entries are untouched.
        The GPUs' bus IDs are the mock's, which in this VM are also some virtio functions' addresses: the
        node sees GPUs there (its sysfs overlay shadows those functions' ``vendor``/``device``/``class``)."""
        k = self.directory / "kernel"
        for i in range(GPUS_PER_MACHINE):
            addr = f"0000:{i:02x}:00.0"
            fn = k / "sys-devices" / "pci0000:00" / addr
            fn.mkdir(parents=True, exist_ok=True)
            for name, text in (("vendor", "0x10de"), ("device", f"0x{machine.pci_device_id:04x}"),
                               ("class", "0x030200"), ("numa_node", str(i // 4)), ("driver_override", "(null)")):
                (fn / name).write_text(text + "\n")
            for name, target in (("driver", "../../../bus/pci/drivers/nvidia"),
                                 ("iommu_group", f"../../../kernel/iommu_groups/{10 + i}")):
                with contextlib.suppress(FileExistsError):
                    (fn / name).symlink_to(target)
            (k / "sys-bus-pci-devices").mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                (k / "sys-bus-pci-devices" / addr).symlink_to(f"../../../devices/pci0000:00/{addr}")
            info = k / "proc-driver" / "nvidia" / "gpus" / addr / "information"
            info.parent.mkdir(parents=True, exist_ok=True)
            info.write_text(f"Model: \t\t {machine.product}\nIRQ:   \t\t {100 + i}\n"
                            f"GPU UUID: \t {mock_gpu_uuid(machine.mock, i)}\nBus Type: \t PCIe\n"
                            f"Bus Location: \t {addr}\nDevice Minor: \t {i}\nGPU Excluded:\t No\n")
        self.mig_state_file.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{self.mig_state_file}.lock").touch(0o644)  # a read-only view cannot create it; flock needs it
        self.mig_minors_file.parent.mkdir(parents=True, exist_ok=True)
        self.mig_minors_file.write_text(_mig_minors(range(GPUS_PER_MACHINE)))
        dmi = k / "sys-devices" / "virtual" / "dmi" / "id"
        dmi.mkdir(parents=True, exist_ok=True)
        (dmi / "product_name").write_text(machine.dmi_product + "\n")
        (k / "sys-class").mkdir(exist_ok=True)
        with contextlib.suppress(FileExistsError):
            (k / "sys-class" / "dmi").mkdir()
            (k / "sys-class" / "dmi" / "id").symlink_to("../../devices/virtual/dmi/id")
        (k / "proc-driver" / "nvidia" / "version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {machine.driver_version}  Release Build  "
            f"(localcluster)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        for module in DRIVER_MODULES:
            (k / "sys-module" / module).mkdir(parents=True, exist_ok=True)
            (k / "sys-module" / module / "initstate").write_text("live\n")
        # /proc/devices as fs/proc/devices.c writes it; the GPU major is "nvidia" from driver 550.40 on.
        host_text = Path("/proc/devices").read_text()
        chars, _, blocks = host_text.partition("\nBlock devices:")
        entries = [line for line in chars.splitlines()[1:] if line.strip()]
        entries += [f"{NVIDIA_MAJOR:3d} nvidia", f"{UVM_MAJOR:3d} nvidia-uvm", f"{CAPS_MAJOR:3d} nvidia-caps"]
        entries.sort(key=lambda line: int(line.split()[0]))
        (k / "proc-devices").write_text("Character devices:\n" + "\n".join(entries) + "\n\nBlock devices:" + blocks)

    def _namespaces(self) -> None:
        """Persistent net, mount and UTS namespaces on files under ``ns/`` (which must sit on a private
        mount), with the node's mounts, address, route and Service DNAT made once inside."""
        nsdir = self.directory / "ns"
        if subprocess.run(["mountpoint", "-q", str(nsdir)], check=False).returncode != 0:
            _run(["mount", "--bind", str(nsdir), str(nsdir)], "namespace directory")
            _run(["mount", "--make-private", str(nsdir)], "namespace directory")
        if (nsdir / "created").exists():
            return
        for kind in ("net", "mnt", "uts"):
            self.ns(kind).touch()
        d, api = self.directory, f"{self.ip}:{NODE_API_PORT}"
        systemctl = d / "root" / "usr" / "bin" / "systemctl"
        systemctl.write_text(SYSTEMCTL.replace("@CONTROL@", str(d / "control")))
        systemctl.chmod(0o755)
        gpus = []
        if self.machine is not None:
            k = d / "kernel"
            gpus += [
                f"mount -t overlay overlay -o lowerdir=/sys/devices,upperdir={k}/sys-devices,"
                f"workdir={d}/work/sys-devices /sys/devices",
                f"mount -t overlay overlay -o lowerdir=/sys/bus/pci/devices,upperdir={k}/sys-bus-pci-devices,"
                f"workdir={d}/work/sys-bus-pci-devices /sys/bus/pci/devices",
                f"mount -t overlay overlay -o lowerdir=/sys/module,upperdir={k}/sys-module,"
                f"workdir={d}/work/sys-module /sys/module",
                f"mount -t overlay overlay -o lowerdir=/sys/class,upperdir={k}/sys-class,"
                f"workdir={d}/work/sys-class /sys/class",
                f"mount --bind {k}/proc-driver /proc/driver",
                f"mount --bind {k}/proc-devices /proc/devices",
            ]
            gpus += [f"mknod -m 666 /dev/nvidia{i} c {NVIDIA_MAJOR} {i}" for i in range(GPUS_PER_MACHINE)]
            gpus += [f"mknod -m 666 /dev/nvidiactl c {NVIDIA_MAJOR} 255",
                     f"mknod -m 666 /dev/nvidia-modeset c {NVIDIA_MAJOR} 254",
                     f"mknod -m 666 /dev/nvidia-uvm c {UVM_MAJOR} 0",
                     f"mknod -m 666 /dev/nvidia-uvm-tools c {UVM_MAJOR} 1",
                     "ldconfig"]  # the driver's libraries in the node's /etc/ld.so.cache
        script = "\n".join([
            "set -e", f"hostname {self.name}",
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={d}/root/etc,workdir={d}/work/etc /etc",
            f"mount -t overlay overlay -o lowerdir=/usr,upperdir={d}/root/usr,workdir={d}/work/usr /usr",
            f"mount -t overlay overlay -o lowerdir=/dev,upperdir={d}/root/dev,workdir={d}/work/dev /dev",
            # The overlay hides the host's submounts: the node gets its own (mqueue where the host has one).
            "mkdir -p /dev/pts /dev/shm",
            "mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts",
            "ln -sf pts/ptmx /dev/ptmx",
            "mount -t tmpfs -o mode=1777,size=64m shm /dev/shm",
            "if [ -d /dev/mqueue ]; then mount -t mqueue mqueue /dev/mqueue; fi",
            *gpus,
            # The node's own boot ID, which a reboot changes (the kubelet reports it; agents key journals on it).
            f"mount --bind {self.boot_id_file} {BOOT_ID}",
            f"mount --bind {d}/root/var/lib /var/lib", f"mount --bind {d}/root/var/log /var/log",
            f"mount --bind {d}/root/run /run",
            "ip link set lo up", f"ip addr add {self.ip}/32 dev lo",
            # No kube-proxy: the one Service a node needs is the API server's. PREROUTING for pods on the
            # bridge; OUTPUT for hostNetwork pods, whose route lookup needs a route before the DNAT.
            f"ip route add {SERVICE_RANGE} dev lo",
            f"iptables -t nat -A PREROUTING -d {SERVICE_IP}/32 -p tcp --dport 443 -j DNAT --to-destination {api}",
            f"iptables -t nat -A OUTPUT -d {SERVICE_IP}/32 -p tcp --dport 443 -j DNAT --to-destination {api}",
        ])
        _run(["unshare", f"--net={self.ns('net')}", f"--mount={self.ns('mnt')}", f"--uts={self.ns('uts')}",
              "--propagation", "private", "sh", "-c", script], f"namespaces of {self.name}")
        (nsdir / "created").write_text("")

    def _cgroups(self) -> None:
        for hierarchy in _v1_hierarchies():
            (hierarchy / self.cgroup_root).mkdir(exist_ok=True)
        cpuset = CGROUP_V1 / "cpuset"
        if cpuset.is_dir():  # a cpuset cgroup takes no task before it has cpus and mems
            for key in ("cpuset.cpus", "cpuset.mems"):
                (cpuset / self.cgroup_root / key).write_text((cpuset / key).read_text())

    def _save_state(self) -> None:
        state = {"name": self.name, "index": self.index, "ip": self.ip, "pod_cidr": self.pod_cidr,
                 "machine": self.machine,
                 "bin_dir": str(self.bin_dir), "pids": self.pids, "cgroup_root": self.cgroup_root,
                 "removing": self.removing}
        (self.directory / "state.json").write_text(json.dumps(state, indent=2))


def mock_gpu_uuid(mock: str, index: int) -> str:
    """The UUID ``tools/mocknvml`` gives GPU ``index`` of ``mock`` (its ``stableUUID``: SHA-1 of the machine
    and index, shaped as a version-5 UUID), which the driver's ``/proc`` names too."""
    return _stable_uuid("GPU", f"mocknvml/{mock}/gpu/{index}")


def mock_mig_uuid(mock: str, index: int, gpu_instance: int, compute_instance: int) -> str:
    """The UUID ``tools/mocknvml`` gives the MIG device of a compute instance (``migdevice.go``)."""
    return _stable_uuid("MIG", f"mocknvml/{mock}/gpu/{index}/gi/{gpu_instance}/ci/{compute_instance}")


def _stable_uuid(prefix: str, name: str) -> str:
    b = bytearray(hashlib.sha1(name.encode()).digest())
    b[6] = (b[6] & 0x0F) | 0x50
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{prefix}-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _mig_minors(gpu_minors: range) -> str:
    """``/proc/driver/nvidia-caps/mig-minors`` as the driver writes it at load, whatever the GPUs' MIG mode:
    ``config 1``, ``monitor 2``, then one minor per GPU-instance slot and per compute-instance slot in it, GPU by
    GPU (the MIG user guide's "/dev based nvidia-capabilities"; nvidia-container-toolkit ``internal/nvcaps``)."""
    lines, n = ["config 1", "monitor 2"], 3
    for minor in gpu_minors:
        for gi in range(MIG_GI_SLOTS):
            lines.append(f"gpu{minor}/gi{gi}/access {n}")
            lines += [f"gpu{minor}/gi{gi}/ci{ci}/access {n + 1 + ci}" for ci in range(MIG_CI_SLOTS)]
            n += 1 + MIG_CI_SLOTS
    return "\n".join(lines) + "\n"


def _oci_names(archive: Path) -> list[tuple[str, str]]:
    """(name, manifest digest) of each named image in an OCI archive's index; none for a Docker archive."""
    with tarfile.open(archive) as tar:
        try:
            member = tar.extractfile("index.json")
        except KeyError:
            return []
        if member is None:
            return []
        index = json.loads(member.read())
    return [(str(m["annotations"]["io.containerd.image.name"]), str(m["digest"]))
            for m in index.get("manifests", []) if "io.containerd.image.name" in m.get("annotations", {})]


def _v1_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies (this machine mounts cgroup2 beside them as ``unified``)."""
    if not CGROUP_V1.is_dir():
        return []
    return sorted(p for p in CGROUP_V1.iterdir() if p.is_dir() and p.name != "unified")


def wait_ready(kube: Kube, name: str, *, timeout: float = 120.0, boot_id: str | None = None) -> float:
    """Until the Node ``name`` reports Ready (and, with ``boot_id``, that boot: the status of the kubelet before
    a reboot can still say Ready); answers the seconds waited."""
    t0 = time.monotonic()
    last = "not registered"
    while time.monotonic() - t0 < timeout:
        node = kube.get_or_none("v1", "Node", name)
        if node is not None:
            conditions = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
            ready = conditions.get("Ready", {})
            booted = boot_id is None or node.get("status", {}).get("nodeInfo", {}).get("bootID") == boot_id
            if ready.get("status") == "True" and booted:
                return time.monotonic() - t0
            last = f"Ready={ready.get('status')} ({ready.get('message', '')})"
        time.sleep(0.5)
    raise TimeoutError(f"node {name} not Ready after {timeout:.0f} s: {last}")


def add_node(cluster_dir: Path, name: str, bin_dir: Path, kube: Kube, *, images: Sequence[Path] = (),
             machine: str | None = None, timeout: float = 120.0) -> Node:
    """A node joined to the control plane in ``cluster_dir``, the pause image and ``images`` imported, Ready.
    A failed add is undone (:meth:`Node.remove`) before the error propagates."""
    pause = cluster_dir / "images" / "pause.tar"
    pause_archive(pause)
    node = Node.new(cluster_dir, name, bin_dir, machine=machine)
    try:
        node.add(ca_cert=cluster_dir / "pki" / "ca.crt", ca_key=cluster_dir / "pki" / "ca.key",
                 images=[pause, *images], timeout=timeout)
        wait_ready(kube, name, timeout=timeout)
    except BaseException:
        node.remove()
        with contextlib.suppress(ApiError):
            kube.delete("v1", "Node", name)
        raise
    return node


def remove_node(cluster_dir: Path, name: str, kube: Kube | None) -> bool:
    """The node's processes, pods, mounts, cgroups and files, then its Node object; False if there was none."""
    if not (cluster_dir / "nodes" / name).exists():
        return False
    Node.attach(cluster_dir, name).remove()
    if kube is not None:
        with contextlib.suppress(ApiError, OSError):
            kube.delete("v1", "Node", name)
    return True
