"""A simulated GPU node laid out in a directory: what ``--nvml simulated:<machine>`` needs besides NVML.

The agent finds GPUs the way it does on a node, through the host root: PCI functions in sysfs (under
their root complex, with ``/sys/bus/pci/devices`` links, as the kernel lays them out: that link is what
Kubernetes and both DRA plugins read ``resource.kubernetes.io/pcieRoot`` from), ``/proc/driver/nvidia``,
the device nodes, loaded kernel modules, the container runtime's config. A simulated machine's NVML alone
answers none of that, so ``check`` on an empty host root said "no GPU". :func:`lay_out` writes a tree
that matches the machine (same bus IDs, minors, driver version, NUMA nodes) plus the host's stand-in
tools: an ``nvidia-smi`` backed by the same simulated state file, and ``modprobe``, ``systemctl`` and
``kubectl`` that only record their calls (``/var/log/simulated-<tool>.log``), so nothing reaches the
machine the agent runs on. The ``sim host`` command and an empty ``--host-root`` with ``--nvml
simulated:<machine>`` use it; the tests' fake hosts (``tests/kit/fakehost.py``) are it with the options
that make bad nodes (no driver, old driver, missing modules, no IOMMU, containerd 1.x or 2.x, CRI-O).

:data:`MARKER` records which machine a tree was laid out for: the CLI runs host commands directly
(resolved inside the tree) on such a root, since there is no OS in it to ``chroot`` into.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import node_agent
import nvml_sim
from node_agent.host.pci import normalize_address
from nvgpu import hostpaths
from nvgpu.catalogue import parse_driver_version
from nvgpu.nodescripts import facts
from nvml_sim import DEFAULT_STATE_DIR, SimulatedMachine, get_machine

#: The file that says a tree is a simulated host, and of which machine.
MARKER = f"{hostpaths.AGENT_RUN_DIR}/simulated-host.json"
DEFAULT_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
#: The stand-in tools of a simulated host; each records its arguments in /var/log/simulated-<tool>.log.
RECORDING_TOOLS = ("kubectl", "systemctl")
TOOLKIT_CONFIG = facts.TOOLKIT_CONFIG
#: The toolkit config a node has after installing NVIDIA's container toolkit package: the layout of what the
#: package installs (its root keys commented out at their defaults, so unprivileged containers' own
#: NVIDIA_VISIBLE_DEVICES is honoured), written here for the simulated hosts.
TOOLKIT_PACKAGE_CONFIG = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
#debug = "/var/log/nvidia-container-toolkit.log"
environment = []
#ldcache = "/etc/ld.so.cache"
ldconfig = "@/sbin/ldconfig"
load-kmods = true
#no-cgroups = false
#path = "/usr/bin/nvidia-container-cli"
#root = "/run/nvidia/driver"
#user = "root:video"

[nvidia-container-runtime]
#debug = "/var/log/nvidia-container-runtime.log"
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime.modes.csv]
mount-spec-path = "/etc/nvidia-container-runtime/host-files-for-container.d"

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false

[nvidia-ctk]
path = "nvidia-ctk"
"""

CONTAINERD_V1_CONFIG = """\
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
oom_score = -999

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "/etc/containerd/registry.d"
"""

CONTAINERD_V2_CONFIG = """\
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = false

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


#: The driver's character-device majors in the simulated ``/proc/devices``: 195 is the ``nvidia`` module's fixed
#: major (``NV_MAJOR_DEVICE_NUMBER``); ``nvidia-uvm`` and ``nvidia-caps`` get theirs from the kernel at load.
NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 511, 234
#: The kernel's own character and block devices, as fs/proc/devices.c prints them (``%3d %s``), around the driver's.
_KERNEL_CHAR_DEVICES = ((1, "mem"), (4, "/dev/vc/0"), (4, "tty"), (5, "/dev/tty"), (5, "/dev/console"),
                        (5, "/dev/ptmx"), (7, "vcs"), (10, "misc"), (13, "input"), (136, "pts"), (226, "drm"))
_KERNEL_BLOCK_DEVICES = ((7, "loop"), (8, "sd"), (259, "blkext"))
#: GPU-instance and compute-instance slots the driver reserves ``nvidia-caps`` minors for, per GPU.
MIG_GI_SLOTS, MIG_CI_SLOTS = 15, 8


def proc_devices_text(driver_version: str, *, uvm: bool) -> str:
    """``/proc/devices`` of a node with the driver loaded (``uvm``: and ``nvidia-uvm``), as fs/proc/devices.c
    writes it: ``Character devices:``, ``%3d %s`` lines by major, a blank line, ``Block devices:``. The GPU
    major is named ``nvidia`` from driver 550.40 on and ``nvidia-frontend`` before (nvidia-container-toolkit
    ``internal/info/proc/devices/devices.go``)."""
    gpu_name = "nvidia" if parse_driver_version(driver_version) >= parse_driver_version("550.40") else "nvidia-frontend"
    chars = [*_KERNEL_CHAR_DEVICES, (NVIDIA_MAJOR, gpu_name), (CAPS_MAJOR, "nvidia-caps")]
    if uvm:
        chars.append((UVM_MAJOR, "nvidia-uvm"))
    lines = ["Character devices:", *(f"{major:3d} {name}" for major, name in sorted(chars, key=lambda c: c[0])),
             "", "Block devices:", *(f"{major:3d} {name}" for major, name in _KERNEL_BLOCK_DEVICES)]
    return "\n".join(lines) + "\n"


def mig_minors_text(gpu_minors: Iterable[int]) -> str:
    """``/proc/driver/nvidia-caps/mig-minors`` as the driver writes it at load, for every GPU whatever its MIG
    mode: ``config 1``, ``monitor 2``, then ``gpu<minor>/gi<id>/access <n>`` and ``gpu<minor>/gi<id>/ci<id>/access
    <n>`` for every slot, numbered on in GPU-minor order (NVIDIA's MIG user guide, "/dev based nvidia-capabilities";
    parsed by nvidia-container-toolkit ``internal/nvcaps``)."""
    lines = ["config 1", "monitor 2"]
    n = 3
    for minor in sorted(set(gpu_minors)):
        for gi in range(MIG_GI_SLOTS):
            lines.append(f"gpu{minor}/gi{gi}/access {n}")
            n += 1
            for ci in range(MIG_CI_SLOTS):
                lines.append(f"gpu{minor}/gi{gi}/ci{ci}/access {n}")
                n += 1
    return "\n".join(lines) + "\n"


def device_node_stand_in(local: Path, major: int, minor: int, mode: int) -> None:
    """The simulated host's mknod (``HostRoot(mknod=...)``): tests run as non-root, where mknod(2) fails, so a
    device node is a regular file, as every node :func:`lay_out` makes is, holding ``c <major>:<minor>`` so a
    test can tell what was made."""
    with open(local, "x") as f:  # O_EXCL, like mknod: an existing path fails with FileExistsError
        f.write(f"c {major}:{minor}\n")
    local.chmod(mode)


def modprobe_stand_in(root: Path, kernel: str, unloadable: Iterable[str] = ()) -> str:
    """The simulated host's ``modprobe``: marks each module loaded in this root (the kernel names it with
    underscores); ``nvidia-uvm`` also registers its character major in ``/proc/devices``, as the module does.
    A module of ``unloadable`` is not in the kernel's module directory: it fails as kmod's modprobe does
    (``modprobe: FATAL: Module nvidia-uvm not found in directory /lib/modules/<release>``, exit 1), loading
    nothing, the way a driver installed without ``nvidia-uvm`` or built for another kernel fails on a node."""
    logs = root / "var/log"
    missing = " ".join(sorted({m.replace("_", "-") for m in unloadable}))
    return ("#!/bin/sh\n# simulated modprobe (nvml_sim.host.modprobe_stand_in)\n"
            'for arg in "$@"; do\n  case "$arg" in -*) continue ;; esac\n'
            '  for gone in ' + (missing or '""') + '; do\n'
            '    if [ "$(echo "$arg" | tr _ -)" = "$gone" ]; then\n'
            f'      echo "$arg" >>"{logs}/simulated-modprobe.log"\n'
            f'      echo "modprobe: FATAL: Module $arg not found in directory /lib/modules/{kernel}" >&2\n'
            "      exit 1\n    fi\n  done\n"
            '  m=$(echo "$arg" | tr - _)\n'
            f'  mkdir -p "{root}/sys/module/$m"\n'
            f'  echo "$m 16384 0 - Live 0x0000000000000000" >>"{root}/proc/modules"\n'
            f'  if [ "$m" = nvidia_uvm ] && [ -f "{root}/proc/devices" ] && '
            f'! grep -q " nvidia-uvm$" "{root}/proc/devices"; then\n'
            f'    sed -i "/^\\$/i{UVM_MAJOR} nvidia-uvm" "{root}/proc/devices"\n'
            "  fi\n"
            f'  echo "$arg" >>"{logs}/simulated-modprobe.log"\n'
            "done\n")


#: The simulated host's ``mknod`` (coreutils' ``mknod -m MODE PATH c MAJOR MINOR``, the one form the node scripts
#: use), for the bash node scripts as :func:`device_node_stand_in` is for the agent: tests run as non-root, where
#: mknod(2) fails, so the node is a regular file holding ``c <major>:<minor>`` with the mode; an existing path
#: fails as mknod(2) does (EEXIST).
MKNOD_STAND_IN = """#!/bin/sh
# simulated mknod (nvml_sim.host.MKNOD_STAND_IN): mknod -m MODE PATH c MAJOR MINOR
if [ "$#" -ne 6 ] || [ "$1" != -m ] || [ "$4" != c ]; then
  echo "mknod: the simulated host's mknod takes only -m MODE PATH c MAJOR MINOR, not: $*" >&2
  exit 2
fi
if [ -e "$3" ] || [ -L "$3" ]; then
  echo "mknod: '$3': File exists" >&2
  exit 1
fi
printf 'c %s:%s\\n' "$5" "$6" >"$3" && chmod "$2" "$3"
"""


def _import_path() -> str:
    """The stand-in tools' ``PYTHONPATH``: this package's import root and the agent's (one directory in the
    repository; two where the simulator is installed apart from the agent)."""
    roots = (Path(nvml_sim.__file__).resolve().parent.parent, Path(node_agent.__file__).resolve().parent.parent)
    return ":".join(dict.fromkeys(str(r) for r in roots))


def sim_state_file(root: Path, machine: str) -> Path:
    """The simulated machine's state file under a host root: where the agent's ``--nvml simulated:<machine>``
    keeps it by default, so the tests, the simulated ``nvidia-smi`` and the agent share one machine."""
    return root / DEFAULT_STATE_DIR.lstrip("/") / f"{machine}.json"


def driver_version_text(version: str) -> str:
    """``/proc/driver/nvidia/version`` as an open kernel module of ``version`` writes it."""
    return (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Thu Jul 18 22:18:41 UTC 2024\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def is_simulated_host(root: Path) -> bool:
    return (root / MARKER.lstrip("/")).is_file()


def machine_of(root: Path) -> str | None:
    """The machine ``root`` was laid out for, or None when it is no simulated host."""
    try:
        data = json.loads((root / MARKER.lstrip("/")).read_text())
    except (OSError, ValueError):
        return None
    machine = data.get("machine") if isinstance(data, dict) else None
    return str(machine) if machine else None


def _write(root: Path, host_path: str, text: str, mode: int = 0o644) -> None:
    p = root / host_path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    p.chmod(mode)


def _link(root: Path, host_path: str, target: str) -> None:
    p = root / host_path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink() or p.exists():
        p.unlink()
    p.symlink_to(target)


#: The PCIe root complex the simulated hosts' devices sit under: neither the simulated machines nor NVIDIA's mock
#: model a PCI topology, so there is one root, as on a single-socket board.
PCIE_ROOT = "pci0000:00"
PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
SYS_DEVICES = "/sys/devices"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
NVIDIA_VENDOR, GPU_CLASS = 0x10DE, 0x030200


def pci_device(root: Path, address: str, *, vendor: int, device: int, pci_class: int,
               driver: str | None = None, numa_node: int | None = None, iommu_group: int | None = None,
               config: bytes | None = None, pcie_root: str = PCIE_ROOT) -> Path:
    """A PCI function as sysfs lays it out, under the host root ``root``; its sysfs directory.

    The directory is ``/sys/devices/<root complex>/<address>`` and ``/sys/bus/pci/devices/<address>`` is a
    link to it, as on a real node: that link is what Kubernetes (and so both DRA plugins) read
    ``resource.kubernetes.io/pcieRoot`` from. It holds ``vendor``, ``device``, ``class``, and if given
    ``numa_node``, the ``config`` space, the ``driver`` link (:func:`set_driver`) and the ``iommu_group``
    link with the group's ``devices`` entry.
    """
    addr = normalize_address(address)
    sysfs = root / SYS_DEVICES.lstrip("/") / pcie_root / addr
    sysfs.mkdir(parents=True, exist_ok=True)
    _link(root, f"{PCI_DEVICES}/{addr}", f"../../..{SYS_DEVICES.removeprefix('/sys')}/{pcie_root}/{addr}")
    base = f"{SYS_DEVICES}/{pcie_root}/{addr}"
    _write(root, f"{base}/vendor", f"0x{vendor:04x}\n")
    _write(root, f"{base}/device", f"0x{device:04x}\n")
    _write(root, f"{base}/class", f"0x{pci_class:06x}\n")
    if numa_node is not None:
        _write(root, f"{base}/numa_node", f"{numa_node}\n")
    if config is not None:
        (sysfs / "config").write_bytes(config)
    if driver is not None:
        set_driver(sysfs, driver)
    if iommu_group is not None:
        (root / IOMMU_GROUPS.lstrip("/") / str(iommu_group) / "devices" / addr).mkdir(parents=True, exist_ok=True)
        _link(root, f"{base}/iommu_group", f"../../..{IOMMU_GROUPS.removeprefix('/sys')}/{iommu_group}")
    return sysfs


def set_driver(sysfs: Path, driver: str | None) -> None:
    """Bind the device whose sysfs directory is ``sysfs`` (the real directory or its bus link) to ``driver``
    (None: unbound), as the kernel shows it: a ``driver`` link into ``/sys/bus/pci/drivers``."""
    link = sysfs / "driver"
    if link.is_symlink() or link.exists():
        link.unlink()
    if driver is not None:
        link.symlink_to(f"../../..{PCI_DRIVERS.removeprefix('/sys')}/{driver}")


def hold_device(root: Path, pid: int, host_path: str, *, comm: str = "cuda-app", fd: int = 3) -> None:
    """A process ``pid`` (named ``comm``) holding ``host_path`` open, as ``/proc`` shows it: an ``fd/<fd>`` link
    to the path and a ``comm`` file. What NVIDIA's VFIO code looks for before it unbinds a GPU (``fuser``, or
    ``findFileUsers`` scanning ``/proc/*/fd``: NVIDIA/k8s-dra-driver-gpu ``cmd/gpu-kubelet-plugin/vfio-device.go``);
    a GPU whose ``/dev/nvidia<N>`` is held cannot leave the ``nvidia`` driver: the unbind blocks in the kernel
    until the holder closes it (``tests.kit.fakekernel`` plays that part)."""
    fd_dir = root / f"proc/{pid}/fd"
    fd_dir.mkdir(parents=True, exist_ok=True)
    (root / f"proc/{pid}/comm").write_text(comm + "\n")
    _link(root, f"/proc/{pid}/fd/{fd}", host_path)


def release_device(root: Path, pid: int) -> None:
    """Process ``pid`` exits: its ``/proc`` entry goes, and with it every file it held."""
    shutil.rmtree(root / f"proc/{pid}", ignore_errors=True)


def sriov_vfs(root: Path, pf_address: str, count: int, *, total: int = 16, driver: str | None = None,
              iommu_group_base: int = 100) -> list[str]:
    """Enable ``count`` SR-IOV virtual functions on the GPU at ``pf_address``, as the kernel lays them out once
    ``sriov_numvfs`` is written (NVIDIA's ``sriov-manage -e``): ``sriov_totalvfs``/``sriov_numvfs`` on the PF,
    a ``virtfn<i>`` link per VF, and each VF a PCI function of its own (same IDs and class, its own IOMMU group,
    a ``physfn`` link back), at the PF's function + 4 + i (the A100/H100 "First VF Offset" 4, stride 1). The VFs'
    addresses."""
    pf = normalize_address(pf_address)
    pf_sysfs = root / PCI_DEVICES.lstrip("/") / pf
    domain_bus, _, devfn = pf.rpartition(":")
    dev, fn = (int(x, 16) for x in devfn.split("."))
    vendor, device = (int((pf_sysfs / f).read_text(), 16) for f in ("vendor", "device"))
    pci_class = int((pf_sysfs / "class").read_text(), 16)
    _write(root, f"{PCI_DEVICES}/{pf}/sriov_totalvfs", f"{total}\n")
    _write(root, f"{PCI_DEVICES}/{pf}/sriov_numvfs", f"{count}\n")
    vfs = []
    for i in range(count):
        n = dev * 8 + fn + 4 + i
        addr = f"{domain_bus}:{n // 8:02x}.{n % 8}"
        pci_device(root, addr, vendor=vendor, device=device, pci_class=pci_class, driver=driver,
                   iommu_group=iommu_group_base + i)
        _link(root, f"{PCI_DEVICES}/{pf}/virtfn{i}", f"../{addr}")
        _link(root, f"{PCI_DEVICES}/{addr}/physfn", f"../{pf}")
        (root / PCI_DEVICES.lstrip("/") / addr / "driver_override").write_text("(null)\n")
        vfs.append(addr)
    return vfs


def pci_config_space(device_id: int, *, vgpu_host_driver: tuple[str, str] | None = None) -> bytes:
    """A 256-byte PCI config space of an NVIDIA 3D controller, as a privileged reader of sysfs gets it.

    Without ``vgpu_host_driver`` it carries the IDs and class and no capability list (not a vGPU). With
    ``(version, branch)`` it is a vGPU guest's: a capability list whose vendor-specific capability has
    the ``VF`` signature and the host driver record NVIDIA's GFD reads (``node_agent.host.vgpu``).
    """
    config = bytearray(256)
    config[0:4] = (0x10DE).to_bytes(2, "little") + device_id.to_bytes(2, "little")
    config[9:12] = bytes((0x00, 0x02, 0x03))  # programming interface, subclass 3D, class display
    if vgpu_host_driver is not None:
        version, branch = (v.encode().ljust(10, b"\0")[:10] for v in vgpu_host_driver)
        config[0x06] |= 0x10  # status: capability list
        config[0x34] = 0x60  # first capability: power management, then the vendor's
        config[0x60:0x62] = bytes((0x01, 0x68))
        records = bytes((0x00, 22)) + version + branch  # record 0: host driver version and branch
        capability = bytes((0x09, 0x00, 5 + len(records))) + b"VF" + records
        config[0x68:0x68 + len(capability)] = capability
    return bytes(config)


def lay_out(
    root: Path,
    machine: str | None = "dgx-h100",
    *,
    containerd: Literal[1, 2] | None = 1,
    deckhouse: bool = False,
    driver_loaded: bool = True,
    driver_version: str | None = None,
    driver_text: str | None = None,
    modules: Iterable[str] = DEFAULT_MODULES,
    device_nodes: bool = True,
    fresh_boot: bool = False,
    unloadable_modules: Iterable[str] = (),
    iommu: bool = True,
    nvidia_container_runtime: bool = True,
    toolkit_config: bool = True,
    nvidia_smi: bool = True,
    bpf_jit_harden: str = "2",
    os_release: tuple[str, str] | None = ("ubuntu", "22.04"),
    kernel: str = "5.15.0-105-generic",
) -> SimulatedMachine | None:
    """Lay out a simulated node for ``machine`` under ``root`` (None: a node with no GPU) and answer the
    machine's handle. Idempotent: an existing tree is brought back to this layout, its simulated state kept.
    ``deckhouse`` adds the containerd drop-in layout Deckhouse manages; the other options make the bad
    nodes the tests need. ``fresh_boot``: the node as it is right after boot, before anything ran a CUDA
    program: only the ``nvidia`` module loaded (``nvidia_uvm`` is loaded by the first CUDA program's
    ``nvidia-modprobe``, not at boot), ``/proc/devices`` and ``mig-minors`` as the driver writes them at load,
    and no ``/dev/nvidia*`` node at all (the module registers majors but makes no node: nvidia-modprobe or
    ``nvidia-ctk system create-device-nodes`` does). ``unloadable_modules``: modules (``nvidia-uvm``) the
    kernel's module directory lacks, so the host's ``modprobe`` fails for them as kmod's does (a driver
    installed without them, or built for another kernel): :func:`modprobe_stand_in`."""
    root.mkdir(parents=True, exist_ok=True)
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    modules = ("nvidia",) if fresh_boot else tuple(modules)
    device_nodes = device_nodes and not fresh_boot
    if fresh_boot:  # a reboot of an existing layout: /dev is a new devtmpfs, /sys/module the kernel's own again
        for dev_node in (root / "dev").glob("nvidia*"):
            if dev_node.is_dir() and not dev_node.is_symlink():
                shutil.rmtree(dev_node)
            else:
                dev_node.unlink()
        for m in DEFAULT_MODULES:
            if m != "nvidia":
                shutil.rmtree(root / f"sys/module/{m}", ignore_errors=True)
    # The OS and kernel node setup publishes (NFD's labels): os-release(5) and `uname -r`.
    if os_release is not None:
        os_id, version_id = os_release
        _write(root, "/etc/os-release", f'NAME="{os_id.capitalize()}"\nID={os_id}\nVERSION_ID="{version_id}"\n')
    _write(root, "/proc/sys/kernel/osrelease", kernel + "\n")
    sim: SimulatedMachine | None = None

    # Ordinary PCI devices every server has, so GPU detection has something to skip.
    for drv in ("nvidia", "vfio-pci", "e1000e"):
        for attr in ("bind", "unbind", "new_id"):
            _write(root, f"{PCI_DRIVERS}/{drv}/{attr}", "")
    _write(root, "/sys/bus/pci/drivers_probe", "")
    pci_device(root, "0000:00:1f.6", vendor=0x8086, device=0x15FA, pci_class=0x020000, driver="e1000e")
    if iommu:
        (root / "sys/kernel/iommu_groups/0/devices").mkdir(parents=True, exist_ok=True)
    else:
        (root / "sys/kernel/iommu_groups").mkdir(parents=True, exist_ok=True)

    proc_modules = ["e1000e 327680 0 - Live 0x0000000000000000"]
    if machine is not None:
        spec = get_machine(machine)
        sim = SimulatedMachine(spec.name, sim_state_file(root, spec.name))
        version = driver_version or spec.driver_version
        if driver_version:
            sim.set_driver_version(driver_version)
        _write(root, "/sys/class/dmi/id/product_name", spec.dmi_product + "\n")
        for i, bus in enumerate(spec.bus_ids):
            addr = normalize_address(bus)
            sysfs = pci_device(root, addr, vendor=NVIDIA_VENDOR, device=spec.pci_device_id, pci_class=GPU_CLASS,
                               driver="nvidia" if driver_loaded else None, numa_node=spec.numa_nodes[i],
                               iommu_group=10 + i if iommu else None, config=pci_config_space(spec.pci_device_id))
            (sysfs / "driver_override").write_text("(null)\n")
            if driver_loaded:
                _write(root, f"/proc/driver/nvidia/gpus/{addr}/information",
                       f"Model: \t\t {spec.product_name}\nIRQ:   \t\t {100 + i}\nGPU UUID: \t {spec.gpu_uuid(i)}\n"
                       f"Bus Type: \t PCIe\nBus Location: \t {addr}\nDevice Minor: \t {i}\nGPU Excluded:\t No\n")
            if device_nodes and driver_loaded:
                _write(root, f"/dev/nvidia{i}", "")
        if driver_loaded:
            _write(root, "/proc/driver/nvidia/version", driver_text or driver_version_text(version))
            if device_nodes:
                for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
                    _write(root, f"/dev/{node}", "")
            proc_modules += [f"{m} 1234567 0 - Live 0x0000000000000000" for m in modules]
            for m in modules:  # a loaded module's own record (kmod's modprobe reads its initstate)
                _write(root, f"/sys/module/{m}/initstate", "live\n")
            _write(root, "/proc/devices", proc_devices_text(version, uvm="nvidia_uvm" in modules))
            if not (root / "proc/driver/nvidia-caps/mig-minors").exists():
                _write(root, "/proc/driver/nvidia-caps/mig-minors", mig_minors_text(range(spec.gpu_count)), 0o444)
        else:
            sim.fail_init("driver-not-loaded")
        if nvidia_smi:
            state = sim_state_file(root, spec.name)
            pythonpath = _import_path()
            _write(root, "/usr/bin/nvidia-smi",
                   f'#!/bin/sh\nPYTHONPATH="{pythonpath}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
                   f'-m nvml_sim.smi --machine {spec.name} --state "{state}" "$@"\n', 0o755)
            # The driver's MPS control program over the same machine (nvml_sim.mpsctl).
            _write(root, "/usr/bin/nvidia-cuda-mps-control",
                   f'#!/bin/sh\nPYTHONPATH="{pythonpath}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
                   f'-m nvml_sim.mpsctl --machine {spec.name} --state "{state}" "$@"\n', 0o755)
    _write(root, "/proc/modules", "\n".join(proc_modules) + "\n")
    _write(root, "/proc/sys/net/core/bpf_jit_harden", bpf_jit_harden + "\n")

    if containerd is not None:
        _write(root, "/etc/containerd/config.toml", CONTAINERD_V1_CONFIG if containerd == 1 else CONTAINERD_V2_CONFIG)
        if deckhouse:
            _write(root, "/etc/containerd/deckhouse.toml", CONTAINERD_V1_CONFIG if containerd == 1
                   else CONTAINERD_V2_CONFIG)
            (root / ("etc/containerd/conf.d" if containerd == 1 else "etc/containerd/conf2.d")).mkdir(
                parents=True, exist_ok=True)
    _write(root, "/etc/sysctl.d/99-sysctl.conf", "# distribution defaults\nnet.core.bpf_jit_harden = 2\n")
    _write(root, "/etc/kubernetes/kubelet.conf", "apiVersion: v1\nkind: Config\n")
    _write(root, "/etc/hostname", "gpu-node-1\n")
    if nvidia_container_runtime:
        _write(root, "/usr/bin/nvidia-container-runtime", "#!/bin/sh\nexit 0\n", 0o755)
        if toolkit_config and not (root / TOOLKIT_CONFIG.lstrip("/")).exists():
            _write(root, TOOLKIT_CONFIG, TOOLKIT_PACKAGE_CONFIG)

    logs = root / "var/log"
    logs.mkdir(parents=True, exist_ok=True)
    for tool in RECORDING_TOOLS:
        _write(root, f"/usr/bin/{tool}", f'#!/bin/sh\necho "$*" >>"{logs}/simulated-{tool}.log"\n', 0o755)
    if machine is not None and nvidia_smi:
        # systemctl also starts and stops the host's GPU clients of the machine (nvml_sim.systemctl).
        pythonpath = _import_path()
        _write(root, "/usr/bin/systemctl",
               f'#!/bin/sh\nPYTHONPATH="{pythonpath}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
               f'-m nvml_sim.systemctl --machine {machine} --state "{sim_state_file(root, machine)}" '
               f'--log "{logs}/simulated-systemctl.log" -- "$@"\n', 0o755)
    _write(root, "/usr/sbin/modprobe", modprobe_stand_in(root, kernel, unloadable_modules), 0o755)
    _write(root, "/usr/bin/mknod", MKNOD_STAND_IN, 0o755)
    _write(root, MARKER, json.dumps({"machine": machine}) + "\n")
    return sim
