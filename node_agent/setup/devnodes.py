"""The NVIDIA device nodes, made the way NVIDIA's tools make them: nothing else on a node does.

The ``nvidia`` kernel module registers its character devices (``/proc/devices``) but makes no ``/dev`` node;
``nvidia_uvm`` is not loaded at boot by anything but the first CUDA program (through the setuid
``nvidia-modprobe``). So on a freshly booted node ``/dev/nvidia-uvm`` and often ``/dev/nvidiactl`` and
``/dev/nvidia<N>`` are absent, and the MIG capability nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of a new GPU or
compute instance appear only when something makes them. NVIDIA's stack makes them itself:

- ``nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules`` (nvidia-container-toolkit
  ``cmd/nvidia-ctk/system/create-device-nodes``, ``internal/system/nvdevices/control-device-nodes.go``,
  ``internal/system/nvmodules/modules.go``): ``modprobe`` the modules, then ``nvidiactl`` (minor 255) and
  ``nvidia-modeset`` (254) under the ``nvidia`` major (``nvidia-frontend`` before driver 550.40),
  ``nvidia-uvm`` (0) and ``nvidia-uvm-tools`` (1) under the ``nvidia-uvm`` major, majors read from
  ``/proc/devices`` (``internal/info/proc/devices/devices.go``), and the ``nvidia-caps`` ``config`` and
  ``monitor`` nodes with the minors of ``/proc/driver/nvidia-caps/mig-minors`` (``internal/nvcaps``); a node
  already there is left as it is (``mknod.go``);
- the MIG manager runs it (and ``nvidia-smi``, whose ``nvidia-modprobe`` makes the caps nodes) after every
  change (mig-parted ``Reconfigure.handleCDI`` / ``runNvidiaSMI``), so the new instances' caps nodes exist.

Here the same, through the host root (``HostRoot.make_char_device``, mknod(2)) and the host's ``modprobe``
(``HostRoot.run``). Every node made is first recorded in the setup journal (feature ``devnodes``), so
:func:`rollback` removes exactly the nodes the agent made and never one the driver or an admin made. On
Deckhouse, bashible's ``gpu-devices.sh`` (``nvgpu.nodescripts``) does the same in bash from the same facts
(``nvgpu.nodescripts.facts``) and writes the same journal, so this module's :func:`rollback` undoes it too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from node_agent.host.proc import MIG_MINORS_PATH, gpu_minors, loaded_modules, parse_mig_minors
from node_agent.host.root import CommandNotFound, CommandTimeout, HostError, HostRoot
from node_agent.setup.journal import Journal
from nvgpu.nodescripts.facts import (
    CAP_ACCESS_MODE,
    CAP_MODES,
    CAPS_DEV_DIR,
    CAPS_MAJOR_NAME,
    CONTROL_MODE,
    CONTROL_NODES,
    GPU_MAJOR_NAMES,
    PROC_DEVICES,
    UVM_MAJOR_NAME,
    UVM_MODULE,
)
from nvgpu.nodescripts.facts import DEVNODES_FEATURE as FEATURE
from nvgpu.nodescripts.facts import MODPROBE_TIMEOUT_S as _MODPROBE_TIMEOUT_S

# The facts (majors' names, minors, modes, the journal) are nvgpu.nodescripts.facts': gpu-devices.sh, the
# Deckhouse twin of this module, is rendered from the same ones.
__all__ = ["CAPS_DEV_DIR", "CAPS_MAJOR_NAME", "CAP_ACCESS_MODE", "CAP_MODES", "CONTROL_MODE", "CONTROL_NODES",
           "FEATURE", "GPU_MAJOR_NAMES", "PROC_DEVICES", "UVM_MAJOR_NAME", "UVM_MODULE", "Node", "Result", "ensure",
           "load_uvm", "parse_proc_devices", "rollback", "wanted"]
MODPROBE_TIMEOUT_S = float(_MODPROBE_TIMEOUT_S)
_DEVICE_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s*$")


def parse_proc_devices(text: str) -> dict[str, int]:
    """Name -> major of the character devices in ``/proc/devices`` (fs/proc/devices.c: a ``Character devices:``
    section of ``%3d %s`` lines, a blank line, then ``Block devices:``, which is left out)."""
    out: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        if line.endswith(":") and not line[:1].isspace() and not line[:1].isdigit():
            section = line
            continue
        m = _DEVICE_LINE.match(line)
        if m and section == "Character devices:":
            out.setdefault(m.group(2), int(m.group(1)))
    return out


def _major(majors: dict[str, int], names: Iterable[str]) -> int | None:
    return next((majors[n] for n in names if n in majors), None)


@dataclass(frozen=True)
class Node:
    path: str
    major: int
    minor: int
    mode: int


@dataclass
class Result:
    """What :func:`ensure` did: nodes made, the modules it loaded, and the nodes it could not make (and why)."""

    created: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def wanted(host: HostRoot, mig_caps: Iterable[str] = ()) -> tuple[list[Node], list[str]]:
    """The nodes this host should have now, and the reasons some cannot be made (a major or minor the kernel
    has not published). ``mig_caps``: ``mig-minors`` keys (``gpu0/gi1/access``, ``gpu0/gi1/ci0/access``) of
    instances that exist, whose caps nodes are wanted as well."""
    majors = parse_proc_devices(host.read_text_or_none(PROC_DEVICES) or "")
    nodes: list[Node] = []
    missing: list[str] = []
    for path, (names, minor) in CONTROL_NODES.items():
        major = _major(majors, names)
        if major is None:
            missing.append(f"{path}: no {' or '.join(names)} major in {PROC_DEVICES}")
        else:
            nodes.append(Node(path, major, minor, CONTROL_MODE))
    gpu_major = _major(majors, GPU_MAJOR_NAMES)
    if gpu_major is not None:
        nodes += [Node(f"/dev/nvidia{m}", gpu_major, m, CONTROL_MODE) for m in sorted(set(gpu_minors(host).values()))]
    caps_major = majors.get(CAPS_MAJOR_NAME)
    minors_text = host.read_text_or_none(MIG_MINORS_PATH)
    caps = list(CAP_MODES) + [c for c in mig_caps if c not in CAP_MODES]
    if caps_major is None or minors_text is None:
        if list(mig_caps):
            missing.append(f"{CAPS_DEV_DIR}: no {CAPS_MAJOR_NAME} major in {PROC_DEVICES} or no {MIG_MINORS_PATH}")
        return nodes, missing
    table = parse_mig_minors(minors_text)
    for cap in caps:
        if cap not in table:
            if cap not in CAP_MODES:
                missing.append(f"capability {cap!r} is not in {MIG_MINORS_PATH}")
            continue
        nodes.append(Node(f"{CAPS_DEV_DIR}/nvidia-cap{table[cap]}", caps_major, table[cap],
                          CAP_MODES.get(cap, CAP_ACCESS_MODE)))
    return nodes, missing


def load_uvm(host: HostRoot) -> bool:
    """``modprobe nvidia-uvm`` when the ``nvidia`` module is loaded and ``nvidia_uvm`` is not (``nvmodules``
    loads it the same way); True when it loaded it. A driver that is not loaded at all is left to the check."""
    modules = loaded_modules(host)
    if "nvidia" not in modules or UVM_MODULE.replace("-", "_") in modules:
        return False
    try:
        result = host.run(["modprobe", UVM_MODULE], timeout_s=MODPROBE_TIMEOUT_S)
    except (CommandNotFound, CommandTimeout) as e:
        raise HostError(f"cannot load {UVM_MODULE}: {e}") from e
    if not result.ok:
        raise HostError(f"modprobe {UVM_MODULE} failed (exit {result.returncode}): "
                        f"{(result.stderr or result.stdout).strip() or 'no output'}")
    return True


def ensure(host: HostRoot, *, load_modules: bool = True, mig_caps: Iterable[str] = ()) -> Result:
    """Load ``nvidia-uvm`` (``load_modules``), then make every wanted node that is absent, each recorded in the
    journal before it is made. Idempotent: a second run makes nothing."""
    result = Result()
    with host.lock(FEATURE):
        if load_modules and load_uvm(host):
            result.loaded.append(UVM_MODULE)
        nodes, result.missing = wanted(host, mig_caps)
        journal: Journal | None = None
        for node in nodes:
            if host.exists(node.path) or host.path(node.path).is_symlink():
                continue
            journal = journal or Journal(host, FEATURE)
            journal.record(node.path)
            if host.make_char_device(node.path, node.major, node.minor, node.mode):
                result.created.append(node.path)
    return result


def rollback(host: HostRoot) -> list[str]:
    """Remove the nodes :func:`ensure` made (and the directories it made for them); nothing else."""
    with host.lock(FEATURE):
        return Journal(host, FEATURE).restore()
