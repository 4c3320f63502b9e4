"""NVIDIA's programs and our agent on one machine: NVIDIA's mock NVML with the same profile, one host tree.

Both sides load the same ``libnvidia-ml.so.1`` (``tools/mocknvml``, ``MOCK_NVML_MACHINE``) and see the same
host: ours through ``--host-root``, NVIDIA's through a private mount namespace in which the host tree's
``/sys/bus/pci/devices`` is bind-mounted over the real one (their PCI code reads fixed paths) and, for the
device plugin, a directory of ours over ``/var/lib/kubelet/device-plugins`` (where it puts its socket);
``/dev`` there holds the host tree's device nodes.
Nothing is mounted outside that namespace. The mock machine's GPU UUIDs are the same in every process.

The known, deliberate differences are the rows of ``docs/compatibility.md``; :func:`unlisted` is what a
comparison has that the table does not explain.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tests.kit.fakehost import PCI_DEVICES, PCIE_ROOT, SYS_DEVICES
from tests.kit.migcaps import CAPS_DEV_DIR, write_mig_minors
from tests.kit.mockhost import mock_env, mock_host, probe_mock
from tests.kit.tools import MOCK_NVML, required_bin

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "docs" / "compatibility.md"
#: NVIDIA's shipped mig-parted config (deployments/systemd/config-default.yaml), copied verbatim.
MIG_CONFIG = REPO / "tests" / "nvgpu" / "nvidia-mig-parted-config-default.yaml"
#: The mock machines (MOCK_NVML_MACHINE) and the DMI product name their hosts get.
MACHINES = {"dgxa100": "DGXA100", "dgxh100": "DGXH100"}
DMI_PRODUCT = "/sys/class/dmi/id/product_name"
DRIVER_LIB_DIR = "/usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class Machine:
    """One mock machine laid out as a host tree, and the tools directory holding its NVML."""

    name: str
    root: Path
    tools: Path
    inventory: Mapping[str, Any]
    #: The mock's MIG state file (``MOCK_NVML_STATE``) when the machine carries a MIG layout (:func:`with_mig`).
    state: Path | None = None

    def env(self, **extra: str) -> dict[str, str]:
        state = {"MOCK_NVML_STATE": str(self.state)} if self.state else {}
        return mock_env(self.tools, self.name, **(state | extra))


def machine(name: str, root: Path) -> Machine:
    """The mock machine ``name`` as a host under ``root`` (PCI devices, /proc, /dev and a DMI product)."""
    tools = required_bin(MOCK_NVML, "gpu-feature-discovery", "nvidia-device-plugin")
    inventory = probe_mock(tools, name, root / "bare")
    host = root / "host"
    mock_host(host, inventory)
    dmi = host / DMI_PRODUCT.lstrip("/")
    dmi.parent.mkdir(parents=True, exist_ok=True)
    dmi.write_text(MACHINES[name] + "\n")
    _device_nodes(host, inventory)
    _proc_devices(host)
    # The driver's libraries where a driver install puts them, named for the driver version: NVIDIA's DRA
    # plugin finds (and loads) NVML under its driver root, and its CDI generation looks up the driver's
    # files there (libcuda.so.<version> is required). NVML is the mock; libcuda is an empty file, which
    # the CDI specs name as a mount and nothing on this machine loads.
    version = inventory["driver"][0]
    libs = host / DRIVER_LIB_DIR.lstrip("/")
    libs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tools / MOCK_NVML, libs / f"libnvidia-ml.so.{version}")  # a copy: links resolve in the root
    (libs / MOCK_NVML).symlink_to(f"libnvidia-ml.so.{version}")
    (libs / f"libcuda.so.{version}").write_bytes(b"")
    (libs / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    # NVIDIA's DRA plugin locates nvidia-smi at start (it runs it only to set time-slicing and compute
    # modes, which the comparison does not do). The mock machine has none: this one says so and fails.
    smi = host / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text('#!/bin/sh\necho "nvidia-smi: not on this mock machine (NVML only)" >&2\nexit 1\n')
    smi.chmod(0o755)
    return Machine(name, host, tools, inventory)


#: The NVIDIA driver's character devices: major 195 (nvidia<minor>, nvidiactl 255, nvidia-modeset 254) and
#: nvidia-uvm's major, which the kernel assigns at load (511 here).
NVIDIA_MAJOR, UVM_MAJOR = 195, 511
CONTROL_NODES = {"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia-modeset": (NVIDIA_MAJOR, 254),
                 "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}


def _device_nodes(host: Path, inventory: Mapping[str, Any]) -> None:
    """The machine's ``/dev`` as character devices with the driver's numbers (the mock host's are plain
    files): NVIDIA's CDI generation takes a device node's type and numbers from the node itself and leaves
    out what is not a character device."""
    nodes = {f"nvidia{g['minor']}": (NVIDIA_MAJOR, int(g["minor"])) for g in inventory["gpus"]} | CONTROL_NODES
    for name, (major, minor) in nodes.items():
        path = host / "dev" / name
        path.unlink(missing_ok=True)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def _proc_devices(host: Path) -> None:
    """``/proc/devices`` as on a node with the driver loaded: the kernel's own table plus the driver's majors
    (its CDI code looks the nvidia-caps major up there)."""
    real = Path("/proc/devices").read_text().splitlines()
    blocks = real.index("") if "" in real else len(real)
    ours = [f"{NVIDIA_MAJOR} nvidia-frontend", f"{CAPS_MAJOR} nvidia-caps", f"{UVM_MAJOR} nvidia-uvm"]
    text = "\n".join([*real[:blocks], *(f"{line:>{len(line) + 1}}" for line in ours), *real[blocks:]]) + "\n"
    (host / "proc" / "devices").write_text(text)


#: The nvidia-caps character devices' major (the kernel assigns it when the driver loads).
CAPS_MAJOR = 234


def mig_capabilities(m: Machine, state: Path) -> None:
    """The driver's MIG capability files for the layout in ``state`` (the mock's MIG state file): the
    ``mig-minors`` table (every GI and CI slot of every GPU, :mod:`tests.kit.migcaps`), the
    ``/dev/nvidia-caps/nvidia-cap<N>`` nodes, and ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>``
    (and ``…/ci<id>``) ``access`` files for the instances that exist, which name those minors. Both plugins
    build a MIG device's CDI device nodes from these."""
    doc = json.loads(state.read_text()) if state.exists() else {"gpus": []}
    minors = {int(g["index"]): int(g["minor"]) for g in m.inventory["gpus"]}
    table = write_mig_minors(m.root, minors.values())
    nodes = m.root / CAPS_DEV_DIR.lstrip("/")
    shutil.rmtree(m.root / "proc/driver/nvidia/capabilities", ignore_errors=True)
    shutil.rmtree(nodes, ignore_errors=True)
    nodes.mkdir(parents=True)
    for cap in (1, 2):
        os.mknod(nodes / f"nvidia-cap{cap}", 0o400 | stat.S_IFCHR, os.makedev(CAPS_MAJOR, cap))
    for g in doc["gpus"]:
        minor = minors[int(g["index"])]
        for gi in g["gpuInstances"]:
            slots = [(gi["id"], None), *((gi["id"], ci["id"]) for ci in gi["computeInstances"])]
            for gi_id, ci_id in slots:
                cap = table[(minor, gi_id, ci_id)]
                where = f"gpu{minor}/mig/gi{gi_id}" + (f"/ci{ci_id}" if ci_id is not None else "")
                access = m.root / "proc/driver/nvidia/capabilities" / where / "access"
                access.parent.mkdir(parents=True, exist_ok=True)
                access.write_text(f"DeviceFileMinor: {cap}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
                os.mknod(nodes / f"nvidia-cap{cap}", 0o444 | stat.S_IFCHR, os.makedev(CAPS_MAJOR, cap))


#: Per mock machine, what a case names generically: NVIDIA's config for a uniform layout of the GPU's 1-slice
#: (``all-1g``) and 3-slice (``all-3g``) profile, and the device plugin's resource for its 1-slice profile
#: under the ``mixed`` strategy (``mig-1g``).
MIG_NAMES = {"dgxa100": {"all-1g": "all-1g.5gb", "all-3g": "all-3g.20gb", "mig-1g": "nvidia.com/mig-1g.5gb"},
             "dgxh100": {"all-1g": "all-1g.10gb", "all-3g": "all-3g.40gb", "mig-1g": "nvidia.com/mig-1g.10gb"}}


def for_machine(m: Machine, name: str) -> str:
    """``name`` as machine ``m`` spells it (:data:`MIG_NAMES`); any other name as it is."""
    return MIG_NAMES[m.name].get(name, name)


def with_mig(m: Machine, config: str, state: Path) -> Machine:
    """The machine with NVIDIA's shipped MIG config ``config`` (or a :data:`MIG_NAMES` name) applied by NVIDIA's
    mig-parted (its layout kept in ``state``), and the driver's MIG capability files for it: what both sides
    then start on."""
    config = for_machine(m, config)
    out = replace(m, state=state)
    done = subprocess.run(namespaced(out, [str(m.tools / "nvidia-mig-parted"), "apply", "-f", str(MIG_CONFIG),
                                           "-c", config]), cwd=REPO, env=out.env(), capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode:
        raise AssertionError(f"nvidia-mig-parted apply {config} failed:\n{done.stderr[-2000:]}")
    mig_capabilities(out, state)
    return out


#: The ``/proc`` entries a program sees from the machine's tree (the rest are the real kernel's).
PROC_FROM_HOST = ("modules", "driver", "devices")
#: The real device nodes a program still gets in the namespace's ``/dev``.
BASIC_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def namespaced(m: Machine, argv: Sequence[str], binds: Mapping[str, Path] | None = None) -> list[str]:
    """``argv`` in a private mount namespace where the machine's PCI devices, device nodes and ``/proc``
    files (and ``binds``: mount point to local directory) replace the host's.

    ``/dev`` becomes a tmpfs holding the machine's ``/dev`` (its GPU and control nodes) and the basic real
    nodes bound from the host's ``/dev``. ``/proc`` becomes a tmpfs of links into the real procfs (bound
    elsewhere, so ``/proc/self`` still names the reader) plus the machine's own ``/proc`` files: its
    ``modules`` (mig-parted and NVIDIA's DRA plugin look for ``nvidia`` there, and this kernel, built
    without modules, has no ``/proc/modules`` at all) and ``driver`` (``driver/nvidia``). Nothing is
    written to the host's own ``/dev`` or ``/proc``."""
    pcie = f"{SYS_DEVICES}/{PCIE_ROOT}"
    mounts = {PCI_DEVICES: m.root / PCI_DEVICES.lstrip("/"), pcie: m.root / pcie.lstrip("/"), **(binds or {})}
    real_dev, real_proc = m.root.parent / "real-dev", m.root.parent / "real-proc"
    host_proc = m.root / "proc"
    steps = [*(f'mkdir -p "{dst}"' for dst in mounts),
             *(f'mount --bind "{src}" "{dst}"' for dst, src in mounts.items()),
             f'mkdir -p "{real_dev}"', f'mount --bind /dev "{real_dev}"', "mount -t tmpfs -o mode=755 tmpfs /dev",
             *(f'touch /dev/{n} && mount --bind "{real_dev}/{n}" /dev/{n}' for n in BASIC_DEVICES),
             f'cp -a "{m.root}/dev/." /dev/',
             f'mkdir -p "{real_proc}"', f'mount --bind /proc "{real_proc}"', "mount -t tmpfs -o mode=555 tmpfs /proc",
             f'for e in "{real_proc}"/*; do n="${{e##*/}}"; case " {" ".join(PROC_FROM_HOST)} " in *" $n "*) ;; '
             f'*) ln -s "$e" "/proc/$n";; esac; done',
             *(f'cp -a "{host_proc}/{n}" /proc/' for n in PROC_FROM_HOST)]
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            " && ".join(steps) + ' && exec "$@"', "sh", *argv]


def run(argv: Sequence[str], env: Mapping[str, str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), cwd=REPO, env=dict(env), capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}\nexited {done.returncode}:\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return done


def agent(m: Machine, *args: str, timeout: float = 60.0) -> dict[str, Any]:
    """``python -m node_agent --json ARGS`` on the machine, NVML from the mock."""
    done = run([sys.executable, "-m", "node_agent", "--host-root", str(m.root), "--nvml", "real", "--json", *args],
               m.env(), timeout)
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def feature_file(text: str) -> dict[str, str]:
    """An NFD feature file (``key=value`` lines) as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


# --- the compatibility table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One way the two sides differ: ``item`` (a label key, a field path) in ``case``."""

    component: str
    case: str
    item: str
    ours: str
    nvidia: str

    def row(self) -> str:
        return f"| {self.component} | {self.case} | `{self.item}` | {self.ours} | {self.nvidia} |"


def listed(component: str) -> list[tuple[str, str, str, str]]:
    """The table's rows for ``component``: (case pattern, item, ours, NVIDIA's); ``*`` matches any case."""
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0] == component:
            rows.append((cells[1], cells[2].strip("`"), cells[3], cells[4]))
    return rows


def _matches(pattern: str, value: str) -> bool:
    return pattern == "*" or re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), value) is not None


def unlisted(differences: Iterable[Difference]) -> list[Difference]:
    """The differences no row of the table explains (same component, case and item; values as listed, or
    ``*`` for any value)."""
    out = []
    for d in differences:
        rows = listed(d.component)
        if not any(_matches(case, d.case) and _matches(item, d.item) and _matches(ours, d.ours)
                   and _matches(nvidia, d.nvidia) for case, item, ours, nvidia in rows):
            out.append(d)
    return out


def edit_items(prefix: str, edits: Mapping[str, Any]) -> dict[str, str]:
    """CDI container edits as comparable items, lists in a fixed order (the order carries no meaning in CDI)."""
    return {f"{prefix}.{key}": json.dumps(sorted(value, key=lambda v: json.dumps(v, sort_keys=True))
                                          if isinstance(value, list) else value, sort_keys=True)
            for key, value in edits.items()}


def label_differences(component: str, case: str, ours: Mapping[str, str], theirs: Mapping[str, str]
                      ) -> list[Difference]:
    """Per label key: present on one side only (``-`` for absent), or with different values."""
    out = []
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key, "-"), theirs.get(key, "-")
        if a != b:
            out.append(Difference(component, case, key, a or '""', b or '""'))
    return out
