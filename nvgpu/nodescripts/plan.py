"""Node setup as data: what a setup step does to a node, declared once and applied by two interpreters.

Why: the two backends (Deckhouse's bash NodeGroupConfiguration scripts, the node agent's Python in its setup
DaemonSet) must leave a node in the same state. A step written twice, once per backend, drifts; a step
declared once as a :class:`StepPlan` cannot: ``node_agent.setup.executor`` applies the plan with the agent's
host access and rollback journal, ``nvgpu.nodescripts.bashplan`` renders the same plan as the bash a script
runs, and a change to the plan reaches both. What a plan may hold is only what the converted steps need:

* :class:`ManagedFile`: a file wholly ours, marked by :data:`~nvgpu.nodescripts.content.HEADER`;
* :class:`FormerFile`: a name such a file had before (migrated away when it is ours);
* :class:`KernelSetting`: a sysctl set live, its value before our first change kept for rollback;
* :class:`KernelModule`: a module that must be loaded (``modprobe`` when it is not);
* :class:`NonEmptyDir`: a requirement on the host (a directory with entries), with the problem it reports;
* the node check's requirements, each with its :class:`~nvgpu.nodescripts.facts.Reason` and message
  (:data:`Check`): :class:`ModuleLoaded`, :class:`NodeExists`, :class:`GpuNodesExist`, :class:`ProgramInstalled`.

The messages both interpreters print are here too (:func:`not_ours` ...), so they are worded alike.
See ``docs/node-setup.md`` for which steps are plans and which are still written per backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvgpu import toolkit
from nvgpu.nodescripts import facts
from nvgpu.nodescripts.content import sysctl_dropin
from nvgpu.nodescripts.facts import Reason


@dataclass(frozen=True)
class ManagedFile:
    """A file wholly ours: written atomically (mode 0644) when its content differs, recorded in the step's
    rollback journal first (by the agent). A file at ``path`` that does not start with our header is someone
    else's: the step is refused before it changes anything. ``content`` ends with a newline."""

    path: str
    content: str

    def __post_init__(self) -> None:
        if not self.content.endswith("\n"):
            raise ValueError(f"{self.path}: a managed file's content ends with a newline")


@dataclass(frozen=True)
class FormerFile:
    """A name a managed file had before: removed after the new file is in place when it starts with our header
    (the agent journals it first, so rollback puts it back); someone else's file there is left alone."""

    path: str


@dataclass(frozen=True)
class KernelSetting:
    """A sysctl set live through ``/proc/sys``. Its value before our first change is appended to the plan's
    ``previous_file`` (``name=value`` lines, the first one for a name wins), which rollback puts back. A setting
    this kernel lacks is a note, not a failure."""

    name: str
    value: str

    @property
    def proc_path(self) -> str:
        return facts.sysctl_proc_path(self.name)


@dataclass(frozen=True)
class KernelModule:
    """A kernel module that must be loaded (``/sys/module/<name>`` exists): ``modprobe``'d, bounded by
    :data:`~nvgpu.nodescripts.facts.MODPROBE_TIMEOUT_S`, when it is not; the problem when it still is not."""

    name: str

    @property
    def sys_path(self) -> str:
        return f"{facts.SYS_MODULE_DIR}/{self.name}"

    @property
    def problem(self) -> str:
        return f"module-missing:{self.name}"


@dataclass(frozen=True)
class NonEmptyDir:
    """A requirement: the directory ``path`` has an entry (``/sys/kernel/iommu_groups``: the IOMMU is on);
    ``problem`` when it has none."""

    path: str
    problem: str


@dataclass(frozen=True)
class StepPlan:
    """One setup step, applied in this order: the files (all checked to be ours first), the former files, the
    kernel settings, the modules, then the requirements, whose problems (with the modules') say whether the
    step is ready. ``name`` is the agent's journal feature and the scripts' log prefix (``nvidia-gpu <name>``)."""

    name: str
    files: tuple[ManagedFile, ...] = ()
    former_files: tuple[FormerFile, ...] = ()
    settings: tuple[KernelSetting, ...] = ()
    #: Where the settings' values before our first change are kept (needed when there are settings).
    previous_file: str = ""
    modules: tuple[KernelModule, ...] = ()
    requirements: tuple[NonEmptyDir, ...] = ()

    def __post_init__(self) -> None:
        if self.settings and not self.previous_file:
            raise ValueError(f"step {self.name}: kernel settings need a previous_file for rollback")


@dataclass(frozen=True)
class ModuleLoaded:
    """A check: the kernel module ``name`` is loaded (``/proc/modules``; on a kernel without loadable-module
    support, which has none, ``/sys/module/<name>/initstate`` is ``live``). An unreadable ``/proc/modules`` is
    ``proc-unreadable``, once for all the modules."""

    name: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name):
            raise ValueError(f"{self.name!r}: a module as /proc/modules names it")

    reason = Reason.MODULE_MISSING

    @property
    def message(self) -> str:
        return f"kernel module {self.name} is not loaded"


@dataclass(frozen=True)
class NodeExists:
    """A check: the device node ``path`` exists."""

    path: str
    reason = Reason.DEVICE_NODE_MISSING

    @property
    def message(self) -> str:
        return f"{self.path} is missing"


@dataclass(frozen=True)
class GpuNodesExist:
    """A check: ``/dev/nvidia<minor>`` exists for every GPU the driver lists (its ``Device Minor`` in
    ``/proc/driver/nvidia/gpus/<bus>/information``)."""

    reason = Reason.DEVICE_NODE_MISSING

    @staticmethod
    def message(minor: str) -> str:
        return f"/dev/nvidia{minor} is missing"


@dataclass(frozen=True)
class ProgramInstalled:
    """A check: one of ``programs`` is an executable file, or ``in_toolkit_dir`` under the toolkit directory a
    toolkit container installed (when the step is given one)."""

    programs: tuple[str, ...]
    in_toolkit_dir: str
    reason = Reason.TOOLKIT_MISSING

    def candidates(self, toolkit_dir: str | None) -> tuple[str, ...]:
        return (*self.programs, f"{toolkit_dir.rstrip('/')}/{self.in_toolkit_dir}") if toolkit_dir else self.programs

    @staticmethod
    def message(candidates: str) -> str:
        """``candidates``: the programs looked for, ``, ``-joined."""
        return (f"the NVIDIA Container Toolkit is not installed: none of {candidates} is there (install it on the "
                "node, or set the group's toolkit.source: container)")


Check = ModuleLoaded | NodeExists | GpuNodesExist | ProgramInstalled


def not_ours(path: str) -> str:
    """A managed file's path holds a file that is not ours: the step is refused."""
    return f"{path} exists and was not written by nvidia-gpu; not overwriting it"


def former_not_ours(path: str) -> str:
    return f"{path} was not written by nvidia-gpu; left alone"


def former_removed(path: str) -> str:
    return f"{path} (former name) removed"


def setting_absent(name: str) -> str:
    return f"{name} does not exist on this kernel"


#: The sysctls the NVIDIA container toolkit needs: our drop-in (read at boot), applied live now
#: (the agent's ``node_agent.setup.sysctl``, Deckhouse's ``gpu-sysctl.sh``).
SYSCTL = StepPlan(
    name="sysctl",
    files=(ManagedFile(facts.SYSCTL_DROPIN, sysctl_dropin()),),
    former_files=tuple(FormerFile(p) for p in facts.SYSCTL_FORMER_DROPINS),
    settings=tuple(KernelSetting(n, v) for n, v in facts.SYSCTLS.items()),
    previous_file=facts.SYSCTL_PREVIOUS,
)

#: What DRA's VFIO passthrough needs on the node: the VFIO modules and an IOMMU (the agent's ``vfio prepare``,
#: Deckhouse's ``gpu-vfio.sh``).
VFIO = StepPlan(
    name="vfio",
    modules=tuple(KernelModule(m) for m in facts.VFIO_MODULES),
    requirements=(NonEmptyDir(facts.IOMMU_GROUPS_DIR, "iommu-off"),),
)

#: What the node check requires of the host before it asks NVML: the driver's modules and device nodes
#: (the agent's ``node_agent.setup.check``, Deckhouse's ``gpu-check.sh``).
HOST_CHECKS: tuple[Check, ...] = (*(ModuleLoaded(m) for m in facts.REQUIRED_MODULES), NodeExists(facts.NVIDIACTL),
                                  GpuNodesExist())
#: What the check requires in phase ``all``, beside a ready runtime: a program of the toolkit's GPU containers are
#: started with (the node's own, or a toolkit container's).
RUNTIME_CHECKS: tuple[Check, ...] = (
    ProgramInstalled((facts.NVIDIA_CONTAINER_RUNTIME, facts.CDI_HOOK_PATH), toolkit.RUNTIME_WRAPPER),)
