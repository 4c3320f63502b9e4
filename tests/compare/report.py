"""``make compare``: run every side-by-side comparison and print what differs, listed or not.

    python -m tests.compare.report [--all-mig-configs]

Exit status 1 when a difference is not in ``docs/compatibility.md`` (the same rule as the tests). The MIG
comparison runs the configs the tests run (those for the machine's GPU, and two foreign ones);
``--all-mig-configs`` runs all of NVIDIA's shipped config file (about 80 per machine, several minutes).
The DRA comparison starts its own local control plane (``make tools`` builds it).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from localcluster import ControlPlane, tools_bin
from tests.compare import deviceplugin, dra, gfd, migparted
from tests.compare.peers import MACHINES, Difference, Machine, machine, unlisted, with_mig
from tests.kit.kubelet.common import short_root

Row = tuple[str, int, int, list[Difference]]


def _gfd(m: Machine, work: Path, rows: list[Row]) -> None:
    for case in gfd.CASES:
        for strategy in gfd.STRATEGIES:
            found, written = gfd.compare(m, case, strategy, work)
            rows.append((f"gfd {m.name}/{case.name}/{strategy}", written, len(found), unlisted(found)))
    for layout in ("all-1g", "all-balanced"):
        mig = with_mig(machine(m.name, work / f"gfd-{layout}"), layout, work / f"gfd-{layout}.json")
        for strategy in gfd.STRATEGIES:
            found, written = gfd.compare(mig, gfd.CASES[0], strategy, work)
            rows.append((f"gfd {m.name}/{layout}/{strategy}", written, len(found), unlisted(found)))


def _device_plugin(m: Machine, work: Path, rows: list[Row], timings: list[tuple[str, float, float]]) -> None:
    cases = [(m, c) for c in deviceplugin.CASES]
    for c in deviceplugin.MIG_CASES:
        cases.append((with_mig(machine(m.name, work / f"dp-{c.name}"), str(c.mig_config), work / f"dp-{c.name}.json"),
                      c))
    for host, case in cases:
        case_work = work / f"dp-run-{case.name}"
        case_work.mkdir(parents=True)
        ours, theirs = deviceplugin.ours(host, case, case_work), deviceplugin.nvidia(host, case, case_work)
        found = deviceplugin.differences(host, case, ours, theirs)
        rows.append((f"device-plugin {m.name}/{case.name}", len(theirs.devices), len(found), unlisted(found)))
        timings.append((f"device plugin {m.name}/{case.name}", ours.seconds_to_register, theirs.seconds_to_register))


def _mig_parted(m: Machine, work: Path, rows: list[Row], all_configs: bool) -> None:
    mig_work = work / "mig"
    mig_work.mkdir()
    for config in migparted.config_names() if all_configs else migparted.test_configs(m):
        found, items, _ = migparted.compare(m, config, mig_work)
        rows.append((f"mig-parted {m.name}/{config}", items, len(found), unlisted(found)))


def _dra(name: str, cp: ControlPlane, rows: list[Row], timings: list[tuple[str, float, float]]) -> None:
    with short_root("nvc-") as root:
        m = machine(name, root / "m")
        for case in dra.CASES:
            seen = dra.compare(m, case, cp.admin(), cp.kubeconfig, root / case.name)
            found = dra.differences(f"{name}/{case.name}", seen["ours"], seen["nvidia"])
            rows.append((f"dra {name}/{case.name}", len(seen["nvidia"]), len(found), unlisted(found)))
            for item, label in (("seconds-to-slices", "start to slices"), ("prepare.seconds", "one prepare")):
                timings.append((f"DRA {label} {name}/{case.name}", float(seen["ours"][item]),
                                float(seen["nvidia"][item])))


def main() -> int:
    all_mig = "--all-mig-configs" in sys.argv[1:]
    rows: list[Row] = []
    timings: list[tuple[str, float, float]] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nvgpu-compare-") as tmp:
        cp = ControlPlane(directory=Path(tmp) / "cluster", bin_dir=tools_bin())
        cp.start()
        try:
            for name in sorted(MACHINES):
                work = Path(tmp) / name
                m = machine(name, work)
                _gfd(m, work, rows)
                _device_plugin(m, work, rows, timings)
                _mig_parted(m, work, rows, all_mig)
                _dra(name, cp, rows, timings)
        finally:
            cp.stop()
    width = max(len(r[0]) for r in rows)
    print(f"{'comparison':<{width}}  NVIDIA's items  differences  unlisted")
    for what, written, found, new in rows:
        print(f"{what:<{width}}  {written:>14}  {found:>11}  {len(new):>8}")
        for d in new:
            print(f"  unlisted: {d.row()}")
    print("\none-shot timings from the comparisons (s): ours, NVIDIA's, ratio (bench/bench_vs_nvidia.py measures)")
    for what, a, b in timings:
        print(f"  {what:<44} {a:6.2f} {b:6.2f} {a / b if b else float('inf'):6.1f}x")
    bad = sum(len(r[3]) for r in rows)
    print(f"\n{len(rows)} comparisons in {time.monotonic() - start:.1f} s; "
          f"{sum(r[2] for r in rows)} difference(s), {bad} not in docs/compatibility.md")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
