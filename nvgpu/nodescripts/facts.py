"""Node-setup facts shared by the bash NodeGroupConfiguration scripts and the agent's Python path.

Both paths must reach the same verdicts on the same host, so every path, threshold, module name and
reason code they use is defined once, here (GPU-model facts stay in ``nvgpu.catalogue``).
"""

from __future__ import annotations

from enum import StrEnum

#: The agent's own state (rollback copies, verdicts) lives here on the host, never in /etc.
STATE_DIR = "/var/lib/nvidia-gpu-agent"
#: The NVIDIA Container Toolkit's hook program where its package installs it: the default of the stack's
#: ``cluster.cdiHookPath`` and of the DRA plugin's ``--cdi-hook-path``.
CDI_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
#: Written by the check (script or agent): one ``key=value`` per line, read by the final step.
CHECK_VERDICT_FILE = f"{STATE_DIR}/check.verdict"

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
NVIDIA_GPUS_PROC_DIR = "/proc/driver/nvidia/gpus"
PROC_MODULES = "/proc/modules"
#: The kernel's record of each module (``<name>/initstate`` is ``live`` once loaded): what is loaded on a
#: kernel without loadable-module support, which has no ``/proc/modules``.
SYS_MODULE_DIR = "/sys/module"
OS_RELEASE_FILES = ("/etc/os-release", "/usr/lib/os-release")  #: os-release(5): the first that exists
KERNEL_RELEASE_FILE = "/proc/sys/kernel/osrelease"  #: what `uname -r` prints
#: A driver installed on the host itself (not by a driver container, which keeps its files under
#: /run/nvidia/driver): its nvidia-smi is on the host's own path.
HOST_DRIVER_MARKERS = ("/usr/bin/nvidia-smi",)
PCI_DEVICES_DIR = "/sys/bus/pci/devices"
IOMMU_GROUPS_DIR = "/sys/kernel/iommu_groups"
NVIDIACTL = "/dev/nvidiactl"

# The device nodes node setup makes on a freshly booted node (the agent's ``node_agent.setup.devnodes``,
# Deckhouse's ``gpu-devices.sh``), as ``nvidia-ctk system create-device-nodes --control-devices
# --load-kernel-modules`` does (nvidia-container-toolkit ``internal/system/nvdevices/control-device-nodes.go``,
# ``internal/system/nvmodules/modules.go``): the driver registers majors but makes no /dev node. The step itself
# is ``nvgpu.nodescripts.plan.DEVICES``, built from these.
PROC_DEVICES = "/proc/devices"
#: Minor numbers of the MIG capability device nodes (``/dev/nvidia-caps/nvidia-cap<N>``).
MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"
CAPS_DEV_DIR = "/dev/nvidia-caps"
#: ``/proc/devices`` names (``internal/info/proc/devices/devices.go``): the GPU major is ``nvidia`` from driver
#: 550.40 on and ``nvidia-frontend`` before.
GPU_MAJOR_NAMES = ("nvidia", "nvidia-frontend")
UVM_MAJOR_NAME = "nvidia-uvm"
CAPS_MAJOR_NAME = "nvidia-caps"
#: Control node -> (``/proc/devices`` names of its major, minor), as ``control-device-nodes.go`` has them.
CONTROL_NODES: dict[str, tuple[tuple[str, ...], int]] = {
    "/dev/nvidiactl": (GPU_MAJOR_NAMES, 255),
    "/dev/nvidia-modeset": (GPU_MAJOR_NAMES, 254),
    "/dev/nvidia-uvm": ((UVM_MAJOR_NAME,), 0),
    "/dev/nvidia-uvm-tools": ((UVM_MAJOR_NAME,), 1),
}
#: The driver's own kernel module.
NVIDIA_MODULE = "nvidia"
#: The kernel module ``nvidia-uvm`` (``/proc/modules`` names it ``nvidia_uvm``), loaded when ``nvidia`` is.
UVM_MODULE = "nvidia-uvm"
MODPROBE_TIMEOUT_S = 30
#: Modes the driver gives the capability nodes by default (its ``DeviceFileMode`` in
#: ``/proc/driver/nvidia/capabilities/...``): only root may configure MIG, anyone may monitor or hold access.
CAP_MODES = {"config": 0o400, "monitor": 0o444}
CAP_ACCESS_MODE = 0o444
CONTROL_MODE = 0o666
#: The setup journal of the nodes made (``node_agent.setup.journal``'s manifest, feature ``devnodes``): both
#: paths record every node in it before making it, so either's teardown removes exactly the nodes made.
DEVNODES_FEATURE = "devnodes"
DEVNODES_JOURNAL = f"{STATE_DIR}/rollback/{DEVNODES_FEATURE}/manifest.json"
DEVNODES_LOCK = f"{STATE_DIR}/{DEVNODES_FEATURE}.lock"
REQUIRED_MODULES = (NVIDIA_MODULE, "nvidia_uvm")
VFIO_MODULES = ("vfio", "vfio_pci", "vfio_iommu_type1")
VFIO_DRIVER = "vfio-pci"
#: PCI class prefixes of GPUs: 0x0300 VGA controller, 0x0302 3D controller.
GPU_PCI_CLASSES = ("0x0300", "0x0302")

NVIDIA_SMI = "nvidia-smi"
#: Deckhouse bounds every nvidia-smi call with ``timeout -k 5 15``; the agent uses the same budget.
NVIDIA_SMI_TIMEOUT_S = 15
NVIDIA_SMI_KILL_AFTER_S = 5
NVIDIA_CONTAINER_RUNTIME = "/usr/bin/nvidia-container-runtime"

#: The NVIDIA Container Toolkit's own config (its package ships it): the two keys below decide whether a
#: container can name GPUs itself. Node setup sets them in a marked block (``nvgpu.nodescripts.content``).
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
#: ``false``: an unprivileged container's own ``NVIDIA_VISIBLE_DEVICES`` is ignored (the toolkit's default
#: is ``true``: any pod that sets ``NVIDIA_VISIBLE_DEVICES=all`` gets every GPU of the node).
TOOLKIT_ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
#: ``true``: the device list comes from ``/dev/null`` mounts under ``/var/run/nvidia-container-devices``,
#: which the device plugin's ``volume-mounts`` strategy hands out and a pod cannot make without hostPath.
TOOLKIT_VOLUME_MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"
TOOLKIT_BLOCK_BEGIN = "# BEGIN nvidia-gpu: the GPUs a container gets come from its device list (removed by teardown)"
TOOLKIT_BLOCK_END = "# END nvidia-gpu"
#: Prefix of a line of the toolkit config that sets one of our keys: disabled while our block is there.
TOOLKIT_DISABLED_PREFIX = "#nvidia-gpu# "

CONTAINERD_DIR = "/etc/containerd"
CONTAINERD_CONFIG = f"{CONTAINERD_DIR}/config.toml"
#: Present on Deckhouse nodes: bashible merges conf.d (containerd 1.x) / conf2.d (2.x) into config.toml.
DECKHOUSE_CONTAINERD_BASE = f"{CONTAINERD_DIR}/deckhouse.toml"
DECKHOUSE_DROPIN_DIRS = {2: f"{CONTAINERD_DIR}/conf.d", 3: f"{CONTAINERD_DIR}/conf2.d"}
#: Elsewhere, containerd's own ``imports`` pulls drop-ins from here.
CONTAINERD_IMPORT_DIR = f"{CONTAINERD_DIR}/conf.d"
RUNTIME_DROPIN_NAME = "nvidia-gpu.toml"
#: containerd config ``version`` → the CRI plugin table holding runtimes and CDI settings.
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
#: Where transient CDI specs go (per-claim and the device plugin's own): the runtime reads it with /etc/cdi.
CDI_DYNAMIC_DIR = "/var/run/cdi"
CDI_SPEC_DIRS = ("/etc/cdi", CDI_DYNAMIC_DIR)
NVIDIA_RUNTIME_NAME = "nvidia"

#: CRI-O: config, drop-in dir (read in lexical order after crio.conf), and where the agent looks for it.
CRIO_DIR = "/etc/crio"
CRIO_CONFIG = f"{CRIO_DIR}/crio.conf"
CRIO_DROPIN_DIR = f"{CRIO_DIR}/crio.conf.d"
#: The drop-in NVIDIA documents (``nvidia-ctk runtime configure --runtime=crio`` writes the same path).
CRIO_DROPIN = f"{CRIO_DROPIN_DIR}/99-nvidia.conf"
CRIO_BINARIES = ("/usr/bin/crio", "/usr/local/bin/crio")
CRIO_SOCKETS = ("/var/run/crio/crio.sock", "/run/crio/crio.sock")
#: conmon, CRI-O's container monitor: the first one present becomes the nvidia handler's monitor_path
#: (without one, CRI-O looks ``conmon`` up in its PATH).
CONMON_PATHS = ("/usr/libexec/crio/conmon", "/usr/local/libexec/crio/conmon", "/usr/bin/conmon",
                "/usr/local/bin/conmon")

#: ``99-zz-``: systemd-sysctl applies files in file-name order, a later one wins; this sorts after the
#: distributions' ``99-sysctl.conf`` (see ``node_agent.setup.sysctl``).
SYSCTL_DROPIN = "/etc/sysctl.d/99-zz-nvidia-gpu.conf"
#: Former names of the sysctl drop-in: removed when they carry our header (migration).
SYSCTL_FORMER_DROPINS = ("/etc/sysctl.d/99-nvidia-gpu.conf",)
#: The live sysctl values from before our first change (``name=value`` lines), which rollback puts back.
SYSCTL_PREVIOUS = f"{STATE_DIR}/sysctl.previous"
#: The NVIDIA container toolkit needs bpf_jit_harden below 2 (nvidia-container-toolkit#117).
SYSCTLS = {"net.core.bpf_jit_harden": "1"}


class Verdict(StrEnum):
    OK = "ok"
    NO_GPU = "no-gpu"  #: silent success: nothing to do on this node
    UNUSABLE = "unusable"  #: a GPU is present but cannot be offered to pods


class Reason(StrEnum):
    """Why a GPU node is unusable; the same codes come out of the script and the agent."""

    DRIVER_MISSING = "driver-missing"
    DRIVER_UNPARSEABLE = "driver-unparseable"
    DRIVER_TOO_OLD = "driver-too-old"
    #: The loaded driver is not the one the node group declares (version or branch, kernel modules).
    DRIVER_MISMATCH = "driver-mismatch"
    MODULE_MISSING = "module-missing"
    DEVICE_NODE_MISSING = "device-node-missing"
    NVML_FAILED = "nvml-failed"
    NO_GPUS_LISTED = "no-gpus-listed"
    COMPUTE_TOO_OLD = "compute-too-old"
    #: An NVSwitch GPU's Fabric Manager registration is not done (not started, in progress) or failed: every
    #: CUDA program fails with error 802 until it completes (kubernetes-sigs/dra-driver-nvidia-gpu
    #: ``cmd/compute-domain-kubelet-plugin/nvlib.go`` ``getCliqueIDStrict`` refuses to start alike).
    FABRIC_NOT_READY = "fabric-not-ready"
    RUNTIME_NOT_READY = "runtime-not-ready"
    #: None of NVIDIA's Container Toolkit programs a GPU container is started with is installed.
    TOOLKIT_MISSING = "toolkit-missing"
    PROC_UNREADABLE = "proc-unreadable"


def sysctl_proc_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")
