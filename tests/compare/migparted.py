"""mig-parted side by side: NVIDIA's ``nvidia-mig-parted`` and our ``mig`` command on one mock machine, with
NVIDIA's shipped config file (``config-default.yaml``), compared on what each does to the GPUs.

The machine's MIG state lives in a file (the mock's ``MOCK_NVML_STATE``), so a layout one program makes
is what the next one reads, as on a real GPU. For each named config, starting from a machine with MIG off:

- ``apply``: whether each side applies it (exit status), the layout each leaves behind (read by NVIDIA's
  ``nvidia-mig-parted export``, so one reader judges both), and the GPU-instance placements (from the
  state file: mig-parted compares profile counts only, so placements may differ and still be "applied");
- ``assert``: on the layout NVIDIA's apply made, whether each side says a config is applied: the same
  config, ``all-disabled`` and ``all-enabled``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.compare.peers import MIG_CONFIG, REPO, Difference, Machine, namespaced

#: The configs whose verdict is checked on every applied layout.
ASSERTED = ("all-disabled", "all-enabled")
#: Configs for GPUs the mock machines do not have, kept in the tests to compare how each side treats a
#: profile the GPU lacks (``all-1g.18gb``, an H200 profile) and a config none of whose device filters
#: matches the GPU (``all-1g.35gb``: H200 and GB300 only).
FOREIGN = {"dgxa100": ("all-1g.18gb", "all-1g.35gb"), "dgxh100": ("all-1g.18gb", "all-1g.35gb")}


def config_names() -> list[str]:
    doc: dict[str, Any] = yaml.safe_load(MIG_CONFIG.read_text())
    return list(doc["mig-configs"])


def test_configs(m: Machine) -> list[str]:
    """The configs the tests run on ``m``: every one whose profiles the machine's GPU has (or that names no
    profile), plus :data:`FOREIGN`. ``make compare`` runs all of them."""
    doc: dict[str, Any] = yaml.safe_load(MIG_CONFIG.read_text())
    known = {p["name"] for p in m.inventory["profiles"]}  # the profiles NVML lists for the machine's GPUs
    pci = f"0x{m.inventory['gpus'][0]['pci_device_id']:04X}10DE"
    out = []
    for name, specs in doc["mig-configs"].items():
        mine = [s for s in specs if "device-filter" not in s or pci in
                ([s["device-filter"]] if isinstance(s["device-filter"], str) else s["device-filter"])]
        profiles = {p for s in mine for p in (s.get("mig-devices") or {})}
        if (mine and profiles <= known) or name in FOREIGN.get(m.name, ()):
            out.append(name)
    return out


@dataclass(frozen=True)
class Applied:
    """What one side's ``apply`` did, from a machine with MIG off."""

    ok: bool
    message: str  #: the last line the command printed (its error when it failed)
    layout: dict[str, Any]  #: per GPU index: {"mig-enabled", "mig-devices"}, as NVIDIA's export reads it
    placements: dict[str, list[list[int]]]  #: per GPU index: [profileId, start, size] of each GPU instance
    state: Path


def _run(m: Machine, argv: Sequence[str], state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=REPO, env=m.env(MOCK_NVML_STATE=str(state)), capture_output=True,
                          text=True, timeout=120, check=False)


def _nvidia(m: Machine, *args: str) -> list[str]:
    return namespaced(m, [str(m.tools / "nvidia-mig-parted"), *args])


def _ours(m: Machine, *args: str) -> list[str]:
    return [sys.executable, "-m", "node_agent", "--host-root", str(m.root), "--nvml", "real", "mig", *args]


def export(m: Machine, state: Path) -> dict[str, Any]:
    """NVIDIA's reading of the layout: per GPU index, its MIG mode and devices."""
    done = _run(m, _nvidia(m, "export", "-o", "json"), state)
    if done.returncode != 0:
        raise AssertionError(f"nvidia-mig-parted export failed:\n{done.stderr[-2000:]}")
    gpus = len(m.inventory["gpus"])
    out: dict[str, Any] = {}
    for spec in json.loads(done.stdout)["mig-configs"]["current"]:
        indices = range(gpus) if spec["devices"] == "all" else spec["devices"]
        for i in indices:
            out[str(i)] = {"mig-enabled": spec["mig-enabled"], "mig-devices": spec.get("mig-devices") or {}}
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def placements(state: Path) -> dict[str, list[list[int]]]:
    if not state.exists():
        return {}
    doc = json.loads(state.read_text())
    return {str(g["index"]): sorted([gi["profileId"], gi["placementStart"], gi["placementSize"]]
                                    for gi in g["gpuInstances"]) for g in doc["gpus"]}


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return lines[-1][-300:] if lines else ""


def apply(m: Machine, side: str, name: str, work: Path) -> Applied:
    state = work / f"{side}-{name}.json"
    state.unlink(missing_ok=True)
    argv = (_nvidia(m, "apply", "-f", str(MIG_CONFIG), "-c", name) if side == "nvidia"
            else _ours(m, "apply", "--config", str(MIG_CONFIG), "--name", name))
    done = _run(m, argv, state)
    return Applied(done.returncode == 0, _last_line(done), export(m, state), placements(state), state)


def asserts(m: Machine, side: str, state: Path, name: str) -> bool:
    argv = (_nvidia(m, "assert", "-f", str(MIG_CONFIG), "-c", name) if side == "nvidia"
            else _ours(m, "assert", "--config", str(MIG_CONFIG), "--name", name))
    return _run(m, argv, state).returncode == 0


def wanted(m: Machine, name: str) -> dict[str, dict[str, Any]]:
    """What the config asks of each GPU it has an entry for (by ``devices`` and ``device-filter``), in
    :func:`export`'s form; GPUs without an entry are absent."""
    doc: dict[str, Any] = yaml.safe_load(MIG_CONFIG.read_text())
    out: dict[str, dict[str, Any]] = {}
    for spec in doc["mig-configs"][name]:
        filters = spec.get("device-filter")
        filters = [filters] if isinstance(filters, str) else filters
        for gpu in m.inventory["gpus"]:
            pci = f"0x{gpu['pci_device_id']:04X}10DE"
            if spec["devices"] != "all" and gpu["index"] not in spec["devices"]:
                continue
            if filters and pci not in [f.upper().replace("0X", "0x") for f in filters]:
                continue
            devices = {k: v for k, v in (spec.get("mig-devices") or {}).items() if v}
            out[str(gpu["index"])] = {"mig-enabled": spec["mig-enabled"], "mig-devices": devices}
    return out


def verdict(ok: bool, layout: dict[str, Any], want: dict[str, dict[str, Any]]) -> str:
    """An apply's outcome judged by the layout it left: ``applied`` only when every GPU the config has an
    entry for now has what the entry asks."""
    if not ok:
        return "refused"
    if not want:
        return "applied, no entry for these GPUs"
    if all(layout.get(i) == w for i, w in want.items()):
        return "applied"
    return "claims applied, layout differs"


def summary(layout: dict[str, Any]) -> str:
    """A layout in words when it is uniform and empty (MIG off, or MIG on with no instances), else JSON."""
    states = {json.dumps(v, sort_keys=True) for v in layout.values()}
    if states == {json.dumps({"mig-devices": {}, "mig-enabled": False})}:
        return "MIG off on every GPU"
    if states == {json.dumps({"mig-devices": {}, "mig-enabled": True})}:
        return "MIG on, no instances, on every GPU"
    return json.dumps(layout, sort_keys=True)


def _verdict(ok: bool) -> str:
    return "applied" if ok else "refused"


def compare(m: Machine, name: str, work: Path) -> tuple[list[Difference], int, str]:
    """The differences for one named config, how many items were compared, and NVIDIA's verdict."""
    case = f"{m.name}/{name}"
    ours, theirs = apply(m, "ours", name, work), apply(m, "nvidia", name, work)
    want = wanted(m, name)
    items: list[tuple[str, str, str]] = [
        ("apply.verdict", verdict(ours.ok, ours.layout, want), verdict(theirs.ok, theirs.layout, want)),
        ("apply.layout", summary(ours.layout), summary(theirs.layout)),
        ("apply.placements", json.dumps(ours.placements), json.dumps(theirs.placements)),
    ]
    for other in dict.fromkeys((name, *ASSERTED)):
        items.append((f"assert.{other}", _verdict(asserts(m, "ours", theirs.state, other)),
                      _verdict(asserts(m, "nvidia", theirs.state, other))))
    found = [Difference("mig-parted", case, item, a, b) for item, a, b in items if a != b]
    return found, len(items), items[0][2]
