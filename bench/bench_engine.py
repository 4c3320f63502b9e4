"""The dev stack under the real Pulumi engine against the local control plane, beside the offline preview.

One run, one machine, interleaved rounds so that the figures share its noise:

* **offline**: ``run_preview`` (the SDK's mock engine, the schema validation and the policies, no
  cluster), in this process, as ``make preview`` runs it without the server dry-run;
* **program**: only the program's registration under the mock engine (config, components, every
  registration): what our code costs inside any engine run;
* **engine preview**: ``pulumi preview`` by the pinned CLI, language host and Kubernetes provider
  against a control plane prepared like a Deckhouse cluster (``tests/cluster/pulumi_project.py``);
* **engine up / up (no changes) / destroy**: the full cycle, DaemonSets rolling out on kwok Nodes.

Printed: the median of each, and the program's share of the engine's preview and of ``up``.

    .venv/bin/python bench/bench_engine.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster import ControlPlane, tools_bin  # noqa: E402
from nvidia_gpu.preview.pipeline import run_preview  # noqa: E402
from tests.cluster.pulumi_project import make_project, prepare_cluster  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {k: [] for k in ("offline", "program", "engine preview", "engine up",
                                                        "engine up again", "engine destroy")}
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(directory=work / "cluster", bin_dir=tools_bin())
        cp.start()
        try:
            prepare_cluster(cp)
            project = make_project(cp, work / "engine")
            project.pulumi("stack", "init", "dev")
            run_preview(REPO, "dev", work / "warm")  # imports and schemas, paid once per process
            for i in range(args.rounds):
                start = time.perf_counter()
                result = run_preview(REPO, "dev", work / f"out-{i}")
                figures["offline"].append(time.perf_counter() - start)
                figures["program"].append(result.timings_ms.get("program", 0.0) / 1000)
                figures["engine preview"].append(timed(lambda: project.pulumi("preview")))
                figures["engine up"].append(timed(lambda: project.pulumi("up", "--yes", "--skip-preview")))
                figures["engine up again"].append(timed(lambda: project.pulumi("up", "--yes", "--skip-preview",
                                                                               "--expect-no-changes")))
                figures["engine destroy"].append(timed(lambda: project.pulumi("destroy", "--yes")))
                print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in figures.items()), flush=True)
        finally:
            cp.stop()
    med = {k: statistics.median(v) for k, v in figures.items()}
    print("\nmedians over", args.rounds, "rounds:")
    for k, v in med.items():
        print(f"  {k:16} {v:6.2f} s")
    print(f"  engine preview / offline preview: {med['engine preview'] / med['offline']:.2f}x")
    print(f"  our program's registration (mock engine): {med['program'] / med['engine preview']:.0%} of the engine's "
          f"preview, {med['program'] / med['engine up']:.0%} of up; the rest is the engine, provider and server")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
