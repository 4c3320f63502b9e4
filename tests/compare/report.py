"""``make compare``: run every side-by-side comparison and print what differs, listed or not.

    python -m tests.compare.report [--all-mig-configs]

Exit status 1 when a difference is not in ``docs/compatibility.md`` (the same rule as the tests). The MIG
comparison runs the configs the tests run (those for the machine's GPU, and two foreign ones);
``--all-mig-configs`` runs all of NVIDIA's shipped config file (about 80 per machine, several minutes).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.compare import deviceplugin, gfd, migparted
from tests.compare.peers import MACHINES, Difference, machine, unlisted


def main() -> int:
    all_mig = "--all-mig-configs" in sys.argv[1:]
    rows: list[tuple[str, int, int, list[Difference]]] = []
    timings: list[tuple[str, float, float]] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nvgpu-compare-") as tmp:
        for name in sorted(MACHINES):
            m = machine(name, Path(tmp) / name)
            for case in gfd.CASES:
                for strategy in gfd.STRATEGIES:
                    differences, written = gfd.compare(m, case, strategy, Path(tmp) / name)
                    rows.append((f"gfd {name}/{case.name}/{strategy}", written, len(differences),
                                 unlisted(differences)))
            for dcase in deviceplugin.CASES:
                work = Path(tmp) / name / dcase.name
                work.mkdir(parents=True)
                ours, theirs = deviceplugin.ours(m, dcase, work), deviceplugin.nvidia(m, dcase, work)
                found = deviceplugin.differences(m, dcase, ours, theirs)
                rows.append((f"device-plugin {name}/{dcase.name}", len(theirs.devices), len(found), unlisted(found)))
                timings.append((f"{name}/{dcase.name}", ours.seconds_to_register, theirs.seconds_to_register))
            mig_work = Path(tmp) / name / "mig"
            mig_work.mkdir()
            for config in migparted.config_names() if all_mig else migparted.test_configs(m):
                found, items, _ = migparted.compare(m, config, mig_work)
                rows.append((f"mig-parted {name}/{config}", items, len(found), unlisted(found)))
    width = max(len(r[0]) for r in rows)
    print(f"{'comparison':<{width}}  NVIDIA's items  differences  unlisted")
    for what, written, found, new in rows:
        print(f"{what:<{width}}  {written:>14}  {found:>11}  {len(new):>8}")
        for d in new:
            print(f"  unlisted: {d.row()}")
    print("\nstart to kubelet registration (s): ours, NVIDIA's, ratio")
    for what, a, b in timings:
        print(f"  {what:<28} {a:6.2f} {b:6.2f} {a / b:6.1f}x")
    bad = sum(len(r[3]) for r in rows)
    print(f"\n{len(rows)} comparisons in {time.monotonic() - start:.1f} s; "
          f"{sum(r[2] for r in rows)} difference(s), {bad} not in docs/compatibility.md")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
