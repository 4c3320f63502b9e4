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
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.nvml_mock.mockhost import mock_env, mock_host, probe_mock
from tests.tools import MOCK_NVML, required_bin

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "docs" / "compatibility.md"
#: The mock machines (MOCK_NVML_MACHINE) and the DMI product name their hosts get.
MACHINES = {"dgxa100": "DGXA100", "dgxh100": "DGXH100"}
PCI_DEVICES = "/sys/bus/pci/devices"
DMI_PRODUCT = "/sys/class/dmi/id/product_name"


@dataclass(frozen=True)
class Machine:
    """One mock machine laid out as a host tree, and the tools directory holding its NVML."""

    name: str
    root: Path
    tools: Path
    inventory: Mapping[str, Any]

    def env(self, **extra: str) -> dict[str, str]:
        return mock_env(self.tools, self.name, **extra)


def machine(name: str, root: Path) -> Machine:
    """The mock machine ``name`` as a host under ``root`` (PCI devices, /proc, /dev and a DMI product)."""
    tools = required_bin(MOCK_NVML, "gpu-feature-discovery", "nvidia-device-plugin")
    inventory = probe_mock(tools, name, root / "bare")
    host = root / "host"
    mock_host(host, inventory)
    dmi = host / DMI_PRODUCT.lstrip("/")
    dmi.parent.mkdir(parents=True, exist_ok=True)
    dmi.write_text(MACHINES[name] + "\n")
    return Machine(name, host, tools, inventory)


#: The real device nodes a program still gets in the namespace's ``/dev``.
BASIC_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def namespaced(m: Machine, argv: Sequence[str], binds: Mapping[str, Path] | None = None) -> list[str]:
    """``argv`` in a private mount namespace where the machine's PCI devices and device nodes (and
    ``binds``: mount point to local directory) replace the host's.

    ``/dev`` becomes a tmpfs holding the machine's ``/dev`` (its GPU and control nodes) and the basic real
    nodes bound from the host's ``/dev``; nothing is written to the host's own ``/dev``."""
    mounts = {PCI_DEVICES: m.root / PCI_DEVICES.lstrip("/"), **(binds or {})}
    real_dev = m.root.parent / "real-dev"
    steps = [*(f'mkdir -p "{dst}"' for dst in mounts),
             *(f'mount --bind "{src}" "{dst}"' for dst, src in mounts.items()),
             f'mkdir -p "{real_dev}"', f'mount --bind /dev "{real_dev}"', "mount -t tmpfs -o mode=755 tmpfs /dev",
             *(f'touch /dev/{n} && mount --bind "{real_dev}/{n}" /dev/{n}' for n in BASIC_DEVICES),
             f'cp -a "{m.root}/dev/." /dev/']
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
    return pattern == "*" or re.fullmatch(pattern.replace("*", ".*"), value) is not None


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


def label_differences(component: str, case: str, ours: Mapping[str, str], theirs: Mapping[str, str]
                      ) -> list[Difference]:
    """Per label key: present on one side only (``-`` for absent), or with different values."""
    out = []
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key, "-"), theirs.get(key, "-")
        if a != b:
            out.append(Difference(component, case, key, a or '""', b or '""'))
    return out
