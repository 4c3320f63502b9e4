"""What a node group declares about its NVIDIA driver, and the rules that decide whether it can work.

One place for the driver's semantics, used by the stack config (refusing what cannot work, with the field
named), the components (the driver DaemonSets and NVIDIA's ``NVIDIADriver`` objects) and the agent's
``check`` (the loaded driver against the declaration):

* a **version** is a full release (``550.90.07``, also two-part ``550.67``) or a **branch** (``550``); a
  precompiled driver is chosen by branch and kernel, a compiled one by its full release, a pre-installed one
  by either (a branch matches any release on it);
* **kernel modules** are NVIDIA's open GPU kernel modules or the proprietary ones; ``/proc/driver/nvidia/
  version`` says which are loaded ("Open Kernel Module" in the NVRM line);
* the **type** is a bare-metal driver (``gpu``), a vGPU guest driver (``vgpu``), or the vGPU host manager
  (``vgpu-host-manager``), which turns the node's GPUs into vGPUs for VMs.

The facts behind the rules are NVIDIA's: the open modules exist from the 515 branch on and support Turing
and later; precompiled driver images are built for the data-center ``gpu`` type only; the driver image tag
is ``<version>-<os>`` (``<branch>-<kernel>-<os>`` when precompiled).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nvgpu import catalogue
from nvgpu.errortext import shown

#: The first branch NVIDIA ships the open GPU kernel modules on.
OPEN_MODULES_MIN_BRANCH = 515
#: The open modules support Turing and later GPUs.
OPEN_MODULES_MIN_COMPUTE = (7, 5)
#: NVIDIA's driver images (``<repository>/<image>:<tag>``) and the OS releases they are built for.
DEFAULT_REPOSITORY = "nvcr.io/nvidia"
DEFAULT_IMAGE = "driver"
#: The driver container's component name: its pods' ``app.kubernetes.io/name``, which the upgrade controller
#: selects by, and the role the policy pack allows privileged, hostPID and host paths.
CONTAINER_COMPONENT = "nvidia-driver"
#: Where NVIDIA's driver container (and the GPU Operator's) installs the driver on the host.
CONTAINER_DRIVER_ROOT = "/run/nvidia/driver"

#: Config patterns, matched with ``fullmatch``: ``re.match`` with ``$`` also took ``550.90.07\n``, written
#: as it is into image tags, labels and node scripts.
_BRANCH = re.compile(r"[1-9][0-9]{2,3}")
#: A full release as a config writes it: ASCII digits, nothing around them.
_RELEASE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?")
#: ``ID`` + ``VERSION_ID`` of /etc/os-release as the driver images are tagged (Ubuntu's is always YY.MM).
_OS_RELEASE = re.compile(r"ubuntu[0-9]{2}\.[0-9]{2}|(rhel|rhcos|centos|rocky|sles|debian)[0-9]{1,3}(\.[0-9]{1,3})?")


class DriverSource(StrEnum):
    """Who installs the driver on the group's nodes."""

    #: Already on the node (the image, bashible, a configuration manager); the agent verifies it.
    PREINSTALLED = "preinstalled"
    #: This stack deploys NVIDIA's driver container, one DaemonSet per OS release (per kernel if precompiled).
    CONTAINER = "container"
    #: NVIDIA's GPU Operator runs in the cluster; this stack emits its ``NVIDIADriver`` objects.
    GPU_OPERATOR = "gpuOperator"


class DriverType(StrEnum):
    """Which NVIDIA driver: the data-center driver, a vGPU guest driver, or the vGPU manager of a hypervisor."""

    #: The data-center driver.
    GPU = "gpu"
    #: A vGPU guest driver.
    VGPU = "vgpu"
    #: The vGPU manager: the node's GPUs become vGPUs for VMs.
    VGPU_HOST_MANAGER = "vgpu-host-manager"


#: The GPU virtualization modes (NVML's, as ``nvidia-smi -q`` words them) each driver type runs in: the
#: bare-metal driver on a host or with the whole GPU passed to a VM, a vGPU guest driver on a vGPU, the
#: vGPU manager on the hypervisor's GPU.
VIRTUALIZATION_MODES: dict[DriverType, tuple[str, ...]] = {
    DriverType.GPU: ("None", "Pass-Through"),
    DriverType.VGPU: ("VGPU",),
    DriverType.VGPU_HOST_MANAGER: ("Host VGPU",),
}


class KernelModules(StrEnum):
    """Which kernel modules a deployed driver loads."""

    #: NVIDIA's choice for the GPU and driver (the open modules on recent branches and GPUs).
    AUTO = "auto"
    #: NVIDIA's open GPU kernel modules (branch 515 or later, Turing or later GPUs).
    OPEN = "open"
    #: The proprietary kernel modules.
    PROPRIETARY = "proprietary"


@dataclass(frozen=True)
class DriverVersion:
    """A full release or a branch, as written in the config."""

    text: str

    @property
    def is_branch(self) -> bool:
        return bool(_BRANCH.fullmatch(self.text))

    @property
    def branch(self) -> int:
        return int(self.text.split(".", 1)[0])

    def matches(self, loaded: str) -> bool:
        """Whether the loaded driver ``loaded`` (a full release) is this one: the same release, or on this
        branch."""
        if self.is_branch:
            return loaded.split(".", 1)[0] == self.text
        return catalogue.parse_driver_version(loaded) == catalogue.parse_driver_version(self.text)

    def at_least(self, minimum: str) -> bool:
        """Whether every driver this names is at least ``minimum``; a branch is compared by its number
        (a release on it may still be older, which ``check`` reports on the node)."""
        if self.is_branch:
            return self.branch >= catalogue.parse_driver_version(minimum)[0]
        return catalogue.driver_at_least(self.text, minimum)


def parse_version(text: str) -> DriverVersion:
    """A branch (``550``) or a full release (``550.90.07``), exactly (no whitespace around it: it is written
    into image tags and labels as it is); anything else raises ``ValueError``."""
    if _BRANCH.fullmatch(text) or _RELEASE.fullmatch(text):
        return DriverVersion(text)
    raise ValueError(f"{shown(text)} is neither a driver branch (like 550) nor a release (like 550.90.07)")


def check_os_release(text: str) -> str:
    """An OS release as NVIDIA's driver image tags spell it: ``ubuntu22.04``, ``rhel9.4``, ``rhcos4.16``."""
    if not _OS_RELEASE.fullmatch(text):
        raise ValueError(f"{shown(text)} is not an OS release as NVIDIA's driver images name it: the OS ID and its "
                         "VERSION_ID from /etc/os-release, like ubuntu22.04, ubuntu24.04, rhel9.4 or rhcos4.16")
    return text


def os_release(os_id: str, version_id: str) -> str:
    """The image-tag form of ``/etc/os-release``'s ``ID`` and ``VERSION_ID`` (``ubuntu`` + ``22.04``)."""
    return f"{os_id}{version_id}"


def image_tag(version: DriverVersion, os: str, kernel: str | None = None) -> str:
    """NVIDIA's driver image tag: ``550.90.07-ubuntu22.04``, or ``535-5.15.0-105-generic-ubuntu22.04``."""
    return f"{version.text}-{kernel}-{os}" if kernel else f"{version.text}-{os}"


def open_modules_supported(compute_capability: tuple[int, int]) -> bool:
    return compute_capability >= OPEN_MODULES_MIN_COMPUTE


_NVRM_OPEN = re.compile(r"Open Kernel Module", re.IGNORECASE)


def loaded_modules(proc_version_text: str) -> KernelModules:
    """Which kernel modules ``/proc/driver/nvidia/version`` says are loaded (its NVRM line names the open
    ones "NVIDIA UNIX Open Kernel Module"; the proprietary ones "NVIDIA UNIX x86_64 Kernel Module")."""
    return KernelModules.OPEN if _NVRM_OPEN.search(proc_version_text) else KernelModules.PROPRIETARY


@dataclass(frozen=True)
class DriverExpectation:
    """What ``check`` compares the loaded driver with: the group's declared version and kernel modules
    (``auto`` and no version: nothing to compare). The agent and ``gpu-check.sh`` word the mismatch alike."""

    version: DriverVersion | None = None
    modules: KernelModules = KernelModules.AUTO
    #: The declared driver type (``gpu.driver.type`` when set): compared with the GPUs' virtualization mode.
    driver_type: DriverType | None = None

    @property
    def empty(self) -> bool:
        return self.version is None and self.modules is KernelModules.AUTO and self.driver_type is None

    def args(self) -> list[str]:
        """The agent's ``--expect-*`` options for this expectation."""
        out = []
        if self.version is not None:
            out += ["--expect-driver", self.version.text]
        if self.modules is not KernelModules.AUTO:
            out += ["--expect-kernel-modules", self.modules.value]
        if self.driver_type is not None:
            out += ["--expect-driver-type", self.driver_type.value]
        return out


#: Nothing declared: ``check`` compares nothing (the default of every caller).
NO_EXPECTATION = DriverExpectation()


#: On a driver DaemonSet: its node group's upgrade policy (``gpu.driver.upgrade``) as JSON, which the
#: upgrade controller reads (the stack config stays its one source).
UPGRADE_POLICY_ANNOTATION = "gpu.nvidia-gpu.io/driver-upgrade-policy"
#: On a driver pod template (and so on each pod): a hash of what decides the driver a pod runs (the driver
#: container, its volumes, the declaration its check verifies). A pod is outdated when its hash is not
#: its DaemonSet's: a change elsewhere in the template (the check's image, its interval) reaches a node at
#: its next driver replacement and never restarts a driver by itself.
DRIVER_SPEC_ANNOTATION = "gpu.nvidia-gpu.io/driver-spec"
#: The taint the upgrade puts on a node before it stops the node's GPU agents (device plugin, DRA plugin,
#: labeller, exporters): DaemonSet pods ignore a cordon, so the taint keeps their replacements away while
#: the old driver unloads (NVIDIA's ``nvidia-driver init`` fails while anything holds the GPUs). Only the
#: driver DaemonSets tolerate it; the upgrade removes it when the node is uncordoned.
UPGRADE_TAINT_KEY = "gpu.nvidia-gpu.io/driver-upgrade"

#: NVIDIA's startup probe of the driver container: compiling and loading the modules takes minutes, so it
#: allows ``initialDelay + period * failureThreshold`` seconds before the kubelet restarts the container.
STARTUP_INITIAL_DELAY_S = 60
STARTUP_PERIOD_S = 10
STARTUP_FAILURE_THRESHOLD = 120
STARTUP_ALLOWANCE_S = STARTUP_INITIAL_DELAY_S + STARTUP_PERIOD_S * STARTUP_FAILURE_THRESHOLD


@dataclass(frozen=True)
class UpgradePolicy:
    max_unavailable: int = 1
    drain: bool = True
    drain_timeout_s: float = 1800.0
    validation_timeout_s: float = 1800.0
    #: Evict pods no controller owns (gone for good once evicted), as ``kubectl drain --force`` does.
    force: bool = False
    #: Evict pods with ``emptyDir`` volumes (their data is lost), as ``kubectl drain --delete-emptydir-data``.
    delete_empty_dir: bool = False

    def to_annotation(self) -> str:
        return json.dumps({"maxUnavailable": self.max_unavailable, "drain": self.drain,
                           "drainTimeoutSeconds": self.drain_timeout_s,
                           "validationTimeoutSeconds": self.validation_timeout_s,
                           "force": self.force, "deleteEmptyDir": self.delete_empty_dir}, sort_keys=True)

    @classmethod
    def from_annotation(cls, text: str | None) -> UpgradePolicy:
        """The policy a DaemonSet carries; the defaults where it carries none or an unreadable one."""
        try:
            raw: Any = json.loads(text) if text else {}
        except ValueError:
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        d = cls()
        return cls(max_unavailable=int(raw.get("maxUnavailable", d.max_unavailable)),
                   drain=bool(raw.get("drain", d.drain)),
                   drain_timeout_s=float(raw.get("drainTimeoutSeconds", d.drain_timeout_s)),
                   validation_timeout_s=float(raw.get("validationTimeoutSeconds", d.validation_timeout_s)),
                   force=bool(raw.get("force", d.force)),
                   delete_empty_dir=bool(raw.get("deleteEmptyDir", d.delete_empty_dir)))
