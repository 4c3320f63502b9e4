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
* the device-node step, a :class:`DevicePlan`: a :class:`ModuleWhenLoaded` (loaded when the driver is) and the
  nodes wanted, :class:`ControlNode`, :class:`GpuNodes` and :class:`CapNodes` (majors by their ``/proc/devices``
  names, minors fixed or read from the driver's files), with their messages;
* :class:`ChosenFile`: a managed file whose path and content are chosen by facts each backend detects on the
  host (its :class:`Case` table: the first case the facts match writes its file, skips it with a note, or
  refuses the step), content and messages filled from the facts' values (``${fact}`` slots);
* :class:`MarkedBlock`: an edit of a file that is someone else's (a package's config): our lines between
  markers, their conflicting lines disabled by a prefix, undone exactly (optionally a :class:`TableKey`);
* the node check's requirements, each with its :class:`~nvgpu.nodescripts.facts.Reason` and message
  (:data:`Check`): :class:`ModuleLoaded`, :class:`NodeExists`, :class:`GpuNodesExist`, :class:`ProgramInstalled`;
  and those on what the check found out before (the loaded driver, the GPUs' virtualization modes, the driver
  their models require) against the node group's declaration: :class:`DriverDeclared`, :class:`ModulesDeclared`,
  :class:`VirtualizationAllowed`, :class:`DriverAtLeast`, :class:`ComputeAtLeast`, :class:`FabricReady`, their
  messages with ``${name}`` slots.

The messages both interpreters print are here too (:func:`not_ours` ...), so they are worded alike.
See ``docs/node-setup.md`` for which steps are plans and which are still written per backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvgpu import catalogue, toolkit
from nvgpu.driver import VIRTUALIZATION_MODES
from nvgpu.nodescripts import facts
from nvgpu.nodescripts.content import render_crio_dropin, render_dropin, sysctl_dropin, toolkit_block
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
class ModuleWhenLoaded:
    """A kernel module loaded (``modprobe``, bounded by :data:`~nvgpu.nodescripts.facts.MODPROBE_TIMEOUT_S`) when
    the module ``when`` is loaded and it is not, as ``/proc/modules`` lists them (``nvidia-uvm`` once ``nvidia``
    is: the first CUDA program's ``nvidia-modprobe`` would load it, NVIDIA's ``nvmodules`` loads it so); a driver
    that is not loaded at all is left to the check. Unlike a :class:`KernelModule`, one that cannot be loaded
    fails the step (nothing made), worded as :attr:`not_found`, :attr:`timed_out` or :attr:`failed`."""

    name: str  #: as ``modprobe`` takes it (``nvidia-uvm``)
    when: str  #: as ``/proc/modules`` names it (``nvidia``)

    def __post_init__(self) -> None:
        for name in (self.name, self.when):
            if not re.fullmatch(r"[a-z0-9_-]+", name):
                raise ValueError(f"{name!r}: a kernel module's name")

    @property
    def loaded_name(self) -> str:
        """The name ``/proc/modules`` lists it by (the kernel's, ``-`` as ``_``)."""
        return self.name.replace("-", "_")

    @property
    def not_found(self) -> str:
        return f"cannot load {self.name}: modprobe not found"

    @property
    def timed_out(self) -> str:
        return f"cannot load {self.name}: modprobe {self.name} did not finish in {facts.MODPROBE_TIMEOUT_S}s"

    @property
    def failed(self) -> str:
        """``${rc}``: modprobe's exit status; ``${output}``: what it printed, trimmed (:attr:`no_output` if nothing)."""
        return f"modprobe {self.name} failed (exit ${{rc}}): ${{output}}"

    no_output = "no output"


@dataclass(frozen=True)
class ControlNode:
    """A device node with a fixed minor (``/dev/nvidiactl``: 255) under the character major ``/proc/devices``
    lists for the first of ``majors`` (its ``Character devices:`` section), made with ``mode``. No such major:
    the node is not made, :attr:`missing` says why (a warning: the check finds the node missing)."""

    path: str
    minor: int
    majors: tuple[str, ...]
    mode: int

    @property
    def missing(self) -> str:
        return f"{self.path}: no {' or '.join(self.majors)} major in {facts.PROC_DEVICES}"


@dataclass(frozen=True)
class GpuNodes:
    """``<prefix><minor>`` (``/dev/nvidia0``) for each GPU the driver lists, its minor the ``Device Minor`` of
    ``/proc/driver/nvidia/gpus/<bus>/information``, in minor order, under the major of the first of ``majors``
    (none: no GPU node is wanted), made with ``mode``."""

    majors: tuple[str, ...]
    mode: int
    prefix: str = "/dev/nvidia"


@dataclass(frozen=True)
class CapNodes:
    """The MIG capability nodes ``<directory>/nvidia-cap<minor>`` under the ``major`` device, their minors from
    ``minors_file`` (``mig-minors``: ``<key> <minor>`` lines, the last one for a key wins): those of ``modes``'
    keys (``config``, ``monitor``) always, each with its mode, where the file lists them; those of the instances
    the agent's MIG manager names (``gpu0/gi1/access``), with ``access_mode``, where it lists them, and
    :meth:`not_listed` where it does not. No major or no file: none made (:attr:`unavailable` when the manager
    named instances)."""

    major: str
    directory: str
    minors_file: str
    modes: tuple[tuple[str, int], ...]
    access_mode: int

    def __post_init__(self) -> None:
        for key, _ in self.modes:
            if not re.fullmatch(r"[a-z0-9/_-]+", key):
                raise ValueError(f"{key!r}: a mig-minors key")

    @property
    def unavailable(self) -> str:
        return f"{self.directory}: no {self.major} major in {facts.PROC_DEVICES} or no {self.minors_file}"

    def not_listed(self, cap: str) -> str:
        return f"capability {cap!r} is not in {self.minors_file}"


DeviceNodes = ControlNode | GpuNodes | CapNodes


@dataclass(frozen=True)
class DevicePlan:
    """The device-node step: ``modules`` loaded first (a failure fails the step), then ``nodes`` wanted, in order,
    each made (``mknod``) where nothing is at its path (a node, file or link someone made is left as it is, as
    NVIDIA's ``nvdevices`` does), recorded first in the setup journal of feature ``name``
    (:data:`~nvgpu.nodescripts.facts.DEVNODES_JOURNAL`), so a teardown removes exactly the nodes made. ``log``
    prefixes the scripts' messages."""

    name: str
    log: str
    modules: tuple[ModuleWhenLoaded, ...]
    nodes: tuple[DeviceNodes, ...]
    #: A node that cannot be made (``${why}``: the system's reason, ``EPERM``'s words): the step fails.
    cannot_make = "cannot create device node ${path} (c ${major}:${minor}): ${why}"


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


@dataclass(frozen=True)
class DriverDeclared:
    """A check: the loaded driver (``${driver}``) is the node group's declared one (``${declared}``, when it
    declares one): the same release, compared as numbers (``550.90.7`` is ``550.90.07``), or, for a declared
    branch (no dot), a release whose major number is the branch."""

    reason = Reason.DRIVER_MISMATCH
    release_message = "driver ${driver} is loaded; the node group declares ${declared}"
    branch_message = "driver ${driver} is loaded; the node group declares the ${declared} branch"


@dataclass(frozen=True)
class ModulesDeclared:
    """A check: the kernel modules loaded are the declared ones (``${declared}``: ``open`` or ``proprietary``,
    when declared). ``${loaded}`` is ``open`` when the driver version file's first line holds ``open_marker``
    (case-insensitive: its NVRM line names the open modules "NVIDIA UNIX Open Kernel Module"), ``proprietary``
    otherwise."""

    open_marker = "Open Kernel Module"
    reason = Reason.DRIVER_MISMATCH
    message = "the ${loaded} kernel modules are loaded; the node group declares ${declared}"


@dataclass(frozen=True)
class VirtualizationAllowed:
    """A check: each distinct virtualization mode of the GPUs (``${mode}``, as NVML and ``nvidia-smi -q`` name
    it; ``unknown`` where the driver cannot tell, not compared) is one the declared driver type
    (``${driver_type}``, when declared) runs in: ``modes``, per type (``${allowed}``: them, ``or``-joined)."""

    modes: tuple[tuple[str, tuple[str, ...]], ...] = tuple((t.value, m) for t, m in VIRTUALIZATION_MODES.items())
    unknown = "N/A"
    reason = Reason.DRIVER_MISMATCH
    message = "the GPUs are in virtualization mode ${mode}; driver type ${driver_type} needs ${allowed}"

    def allowed(self, driver_type: str) -> tuple[str, ...]:
        return dict(self.modes)[driver_type]


@dataclass(frozen=True)
class DriverAtLeast:
    """A check: the loaded driver (``${driver}``) is at least the one the GPUs require (``${required}``: the
    global minimum, raised by each catalogued model's own), compared as numbers."""

    reason = Reason.DRIVER_TOO_OLD
    message = "driver ${driver} is older than the required ${required}"


@dataclass(frozen=True)
class ComputeAtLeast:
    """A check: each GPU's compute capability (``${cc}``, ``major.minor``) is at least ``minimum``
    (``${minimum}``); one that is not two numbers fails too. ``${gpu}`` names the GPU as its backend lists it
    (the agent: ``GPU <index> '<name>'`` from NVML; the script: ``GPU '<name>'`` from ``nvidia-smi``)."""

    minimum: tuple[int, int] = catalogue.MIN_COMPUTE_CAPABILITY
    reason = Reason.COMPUTE_TOO_OLD
    message = "${gpu} has compute capability ${cc}, below ${minimum}"

    @property
    def minimum_text(self) -> str:
        return f"{self.minimum[0]}.{self.minimum[1]}"


@dataclass(frozen=True)
class FabricReady:
    """A check: each GPU (``${gpu}``) on an NVLink fabric (HGX/DGX H100, H200 and newer) has been registered by
    Fabric Manager; until then every CUDA program fails with error 802. Its state (``${state}``) and status
    (``${status}``) in ``nvidia-smi -q``'s words (the agent words NVML's enum so): a state of ``not_ready`` fails;
    ``done`` with a status other than ``ok`` is a failed registration; any other state (``N/A``: a GPU without a
    fabric) passes. The rule is NVIDIA's (kubernetes-sigs/dra-driver-nvidia-gpu's ``getCliqueIDStrict``)."""

    not_ready: tuple[str, ...] = ("Not Started", "In Progress")
    done = "Completed"
    ok = "Success"
    reason = Reason.FABRIC_NOT_READY
    not_ready_message = ("${gpu}: its NVLink fabric registration is ${state}: CUDA fails with error 802 until Fabric "
                         "Manager (nvidia-fabricmanager) has finished")
    failed_message = ("${gpu}: Fabric Manager failed to register it with the NVLink fabric (${status}): CUDA fails "
                      "with error 802; check nvidia-fabricmanager")


Check = ModuleLoaded | NodeExists | GpuNodesExist | ProgramInstalled
#: A check on what the check found out before, against the declaration (see ``executor.CheckInputs``).
InputCheck = DriverDeclared | ModulesDeclared | VirtualizationAllowed | DriverAtLeast | ComputeAtLeast | FabricReady

#: A slot in a :class:`Case`'s content or message: ``${name}``, filled with the detected fact ``name``.
SLOT_RE = re.compile(r"\$\{([a-z_]+)\}")


@dataclass(frozen=True)
class Case:
    """One arm of a :class:`ChosenFile`, taken when every ``(fact, value)`` of ``when`` holds (no ``when``:
    always). Exactly one outcome:

    * ``refuse``: the step is refused with this message before anything changes;
    * ``path`` with ``content``: the managed file written there (refused, as a :class:`ManagedFile` is, when
      the path holds someone else's file); ``note`` is logged beside it;
    * ``path`` without ``content``: nothing written, ``note`` says why (the path is still checked to be ours);
    * ``agent_layout``: the agent handles this case with a layout of its own whose content is derived from a
      host file, not from facts; the scripts refuse it with ``refuse``.
    """

    when: tuple[tuple[str, str], ...] = ()
    path: str = ""
    content: str | None = None
    note: str = ""
    refuse: str = ""
    agent_layout: bool = False

    def __post_init__(self) -> None:
        if bool(self.refuse) == bool(self.path):
            raise ValueError(f"case {self.when}: either a path or a refusal")
        if self.content is not None and not self.content.endswith("\n"):
            raise ValueError(f"{self.path}: a managed file's content ends with a newline")

    def matches(self, detected: dict[str, str]) -> bool:
        return all(detected.get(name) == value for name, value in self.when)


@dataclass(frozen=True)
class ChosenFile:
    """A managed file whose path and content depend on host facts. ``facts`` names what each backend detects
    (its own way: the agent parses, a script greps), each a string; the :class:`Case` table, in order, is the
    one place that says what follows from them. ``log`` prefixes the scripts' messages."""

    facts: tuple[str, ...]
    cases: tuple[Case, ...]
    log: str

    def __post_init__(self) -> None:
        for case in self.cases:
            used = {n for n, _ in case.when}
            for text in (case.content or "", case.note, case.refuse):
                used |= set(SLOT_RE.findall(text))
            if not used <= set(self.facts):
                raise ValueError(f"case {case.when}: undeclared facts {sorted(used - set(self.facts))}")

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path a case may write: rollback removes those of ours."""
        return tuple(sorted({c.path for c in self.cases if c.path}))


@dataclass(frozen=True)
class TableKey:
    """A key of ours in a table of theirs (a table header matching ``table_ere``): ``line`` (its ``${slot}``
    filled) set in our markers right after the first such header, the table's own lines matching ``key_ere``
    disabled; where the file has no such table, ``header`` and ``line`` in our markers at the end. Set only when
    the slot's value is not empty."""

    table_ere: str
    key_ere: str
    header: str
    line: str
    slot: str

    def __post_init__(self) -> None:
        if SLOT_RE.findall(self.line) != [self.slot]:
            raise ValueError(f"{self.line!r}: one ${{{self.slot}}} slot")


@dataclass(frozen=True)
class MarkedBlock:
    """An edit of ``path``, a file someone else owns: ``lines`` (ours, the markers ``begin`` / ``end`` first and
    last) on top; the root table's lines (those before the first header matching ``table_ere``) matching
    ``root_keys_ere`` disabled by ``disabled_prefix`` (TOML refuses a key twice); ``table_key`` when given. Undone
    exactly: our marked lines out, the prefix taken off. Applying it again to its result changes nothing. The
    patterns are POSIX EREs as awk reads them (the agent reads ``[[:space:]]`` as ``[ \\t]``)."""

    path: str
    lines: tuple[str, ...]
    disabled_prefix: str
    root_keys_ere: str
    table_ere: str
    table_key: TableKey | None = None

    def __post_init__(self) -> None:
        if len(self.lines) < 2:
            raise ValueError(f"{self.path}: a block holds its begin and end markers")
        patterns = [self.root_keys_ere, self.table_ere]
        patterns += [self.table_key.table_ere, self.table_key.key_ere] if self.table_key else []
        if any("/" in p for p in patterns):
            raise ValueError(f"{self.path}: an ERE with '/' does not fit an awk /regex/")

    @property
    def begin(self) -> str:
        return self.lines[0]

    @property
    def end(self) -> str:
        return self.lines[-1]


def fill(text: str, detected: dict[str, str]) -> str:
    """``text`` with its ``${fact}`` slots filled from ``detected``."""
    return SLOT_RE.sub(lambda m: detected[m.group(1)], text)


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

#: The driver's device nodes on a freshly booted node, made as ``nvidia-ctk system create-device-nodes
#: --control-devices --load-kernel-modules`` makes them (the agent's ``node_agent.setup.devnodes``, also for the MIG
#: manager's new instances; Deckhouse's ``gpu-devices.sh``): nvidia-uvm loaded, the control nodes, the GPUs', the
#: MIG capability nodes ``config`` and ``monitor``.
DEVICES = DevicePlan(
    name=facts.DEVNODES_FEATURE,
    log="nvidia-gpu devices",
    modules=(ModuleWhenLoaded(facts.UVM_MODULE, facts.NVIDIA_MODULE),),
    nodes=(*(ControlNode(path, minor, names, facts.CONTROL_MODE)
             for path, (names, minor) in facts.CONTROL_NODES.items()),
           GpuNodes(facts.GPU_MAJOR_NAMES, facts.CONTROL_MODE),
           CapNodes(facts.CAPS_MAJOR_NAME, facts.CAPS_DEV_DIR, facts.MIG_MINORS_PATH, tuple(facts.CAP_MODES.items()),
                    facts.CAP_ACCESS_MODE)),
)

#: What the node check requires of the host before it asks NVML: the driver's modules and device nodes
#: (the agent's ``node_agent.setup.check``, Deckhouse's ``gpu-check.sh``).
HOST_CHECKS: tuple[Check, ...] = (*(ModuleLoaded(m) for m in facts.REQUIRED_MODULES), NodeExists(facts.NVIDIACTL),
                                  GpuNodesExist())
#: The loaded driver against the declared one (version or branch, kernel modules), as soon as it is read.
DRIVER_CHECKS: tuple[InputCheck, ...] = (DriverDeclared(), ModulesDeclared())
#: The GPUs' NVLink fabric registration (once the GPUs are listed).
FABRIC_CHECKS: tuple[InputCheck, ...] = (FabricReady(),)
#: The GPUs' virtualization modes against the declared driver type (once the GPUs are listed).
VIRTUALIZATION_CHECKS: tuple[InputCheck, ...] = (VirtualizationAllowed(),)
#: The GPUs' compute capabilities, and the loaded driver against the one their models require (once the GPUs are
#: listed).
REQUIRED_DRIVER_CHECKS: tuple[InputCheck, ...] = (ComputeAtLeast(), DriverAtLeast())
#: What the check requires in phase ``all``, beside a ready runtime: a program of the toolkit's GPU containers are
#: started with (the node's own, or a toolkit container's).
RUNTIME_CHECKS: tuple[Check, ...] = (
    ProgramInstalled((facts.NVIDIA_CONTAINER_RUNTIME, facts.CDI_HOOK_PATH), toolkit.RUNTIME_WRAPPER),)

_CRIO_LOOKED = ", ".join((facts.CRIO_CONFIG, facts.CRIO_DROPIN_DIR, *facts.CRIO_BINARIES, *facts.CRIO_SOCKETS))
_NO_NVIDIA_RUNTIME = (("nvidia_runtime", "false"),)


def _containerd_cases(version: int) -> tuple[Case, ...]:
    """Deckhouse's layout for one containerd config version: our keys alone, in the directory bashible merges;
    the nvidia runtime the default only where its binary is installed."""
    on = (("runtime", "containerd"), ("containerd_version", str(version)), ("deckhouse", "true"))
    path = f"{facts.DECKHOUSE_DROPIN_DIRS[version]}/{facts.RUNTIME_DROPIN_NAME}"
    cri = facts.CRI_PLUGIN[version]
    default = f'default_runtime_name = "{facts.NVIDIA_RUNTIME_NAME}"'
    return (Case(when=(*on, *_NO_NVIDIA_RUNTIME), path=path,
                 content=render_dropin(cri, "${systemd_cgroup}", "", "${binary}"),
                 note="${binary} is missing; runc stays the default runtime"),
            Case(when=on, path=path, content=render_dropin(cri, "${systemd_cgroup}", default, "${binary}")))


#: The container runtime's drop-in (the agent's ``node_agent.setup.runtime``, Deckhouse's ``gpu-runtime.sh``):
#: which runtime, which layout, which content, and when the step is refused. Detected by each backend:
#: ``runtime`` (containerd, crio, both, none) and ``crio_markers`` (the CRI-O paths found, ``, ``-joined);
#: ``containerd_version`` (config.toml's ``version``, 1 without one); ``deckhouse`` (bashible's
#: ``deckhouse.toml`` is there); ``systemd_cgroup`` (runc's ``SystemdCgroup``); ``nvidia_runtime`` (``binary``,
#: the nvidia runtime the drop-in names, is installed); ``conmon`` (CRI-O's conmon, empty when none is found).
RUNTIME_DROPIN = ChosenFile(
    facts=("runtime", "crio_markers", "containerd_version", "deckhouse", "systemd_cgroup", "nvidia_runtime",
           "binary", "conmon"),
    log="nvidia-gpu runtime",
    cases=(
        Case(when=(("runtime", "both"),),
             refuse=f"both containerd ({facts.CONTAINERD_CONFIG}) and CRI-O (${{crio_markers}}) are on this host; "
                    "not guessing which one kubelet uses: remove the unused one's config"),
        Case(when=(("runtime", "none"),),
             refuse=f"{facts.CONTAINERD_CONFIG} is missing and there is no CRI-O either (looked at {_CRIO_LOOKED}): "
                    "is a container runtime installed?"),
        # CRI-O does not start with a handler whose runtime_path is missing: nothing is written then.
        Case(when=(("runtime", "crio"), *_NO_NVIDIA_RUNTIME), path=facts.CRIO_DROPIN,
             note=f"${{binary}} is missing; {facts.CRIO_DROPIN} not written (CRI-O does not start with a runtime "
                  "whose runtime_path is missing)"),
        Case(when=(("runtime", "crio"), ("conmon", "")), path=facts.CRIO_DROPIN,
             content=render_crio_dropin(None, "${binary}")),
        Case(when=(("runtime", "crio"),), path=facts.CRIO_DROPIN, content=render_crio_dropin("${conmon}", "${binary}")),
        *_containerd_cases(2),
        *_containerd_cases(3),
        # Outside Deckhouse the agent adds an imports entry to config.toml, and on containerd 1.x its drop-in
        # carries a copy of config.toml's CRI section (an import replaces the whole section there).
        *(Case(when=(("runtime", "containerd"), ("containerd_version", str(v))), agent_layout=True,
               refuse=f"{facts.DECKHOUSE_CONTAINERD_BASE} is missing: containerd is not managed by Deckhouse here")
          for v in facts.CRI_PLUGIN),
        Case(when=(("runtime", "containerd"),),
             refuse=f"{facts.CONTAINERD_CONFIG}: config version ${{containerd_version}} is not supported; expected 2 "
                    "(containerd 1.x) or 3 (containerd 2.x)"),
    ),
)


def toolkit_config(accept_envvar: bool) -> MarkedBlock:
    """The NVIDIA toolkit's config, edited in place (its package owns it): our keys on top (``accept_envvar``: the
    node group chose the device plugin's ``envvar`` strategy), and nvidia-container-cli's ``root`` set to the
    ``driver_root`` fact (a driver container's root; empty: the host's ``/``, left alone). The agent's
    ``node_agent.setup.runtime`` and ``gpu-runtime.sh`` apply it; the agent's rollback undoes it."""
    return MarkedBlock(
        path=facts.TOOLKIT_CONFIG,
        lines=tuple(toolkit_block(accept_envvar)),
        disabled_prefix=facts.TOOLKIT_DISABLED_PREFIX,
        # The keys are plain [a-z-] words, so they go in unescaped (awk warns about "\-").
        root_keys_ere=f"^[[:space:]]*({facts.TOOLKIT_ENVVAR_KEY}|{facts.TOOLKIT_VOLUME_MOUNTS_KEY})[[:space:]]*=",
        table_ere=r"^[[:space:]]*\[",
        table_key=TableKey(table_ere=r"^[[:space:]]*\[nvidia-container-cli\][[:space:]]*$",
                           key_ere=r"^[[:space:]]*root[[:space:]]*=", header="[nvidia-container-cli]",
                           line='root = "${driver_root}"', slot="driver_root"),
    )


@dataclass(frozen=True)
class SetupStep:
    """One step of node setup in the order both backends take it: the agent's step ``name`` (in its
    ``setup`` result) and the Deckhouse script that is the same step, run at ``weight`` (bashible runs
    NodeGroupConfiguration scripts and its own steps in weight order)."""

    name: str
    script: str
    weight: int


#: Node setup's steps, in order; each backend's first failing step stops the rest. The device nodes come
#: before the check (a freshly booted node has none until NVIDIA's stack makes them); the runtime's drop-in
#: lands before bashible's step 032 merges containerd's conf.d; the VFIO modules before the sysctls, whose
#: step ends the flow (``gpu-sysctl.sh`` sets ``gpu-setup-complete``, as the agent sets it after its last
#: step). The agent's ``node_agent.setup.flow`` runs its steps in this order and the scripts take these
#: weights (``render.WEIGHTS``).
SETUP_ORDER = (
    SetupStep("devices", "gpu-devices.sh", 24),
    SetupStep("check", "gpu-check.sh", 25),
    SetupStep("runtime", "gpu-runtime.sh", 31),
    SetupStep("vfio", "gpu-vfio.sh", 35),
    SetupStep("sysctl", "gpu-sysctl.sh", 40),
)
