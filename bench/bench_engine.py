"""The dev stack under the real Pulumi engine against the local control plane, beside the offline preview.

One run, one machine, interleaved rounds so that the figures share its noise:

* **offline**: ``run_preview`` (the SDK's mock engine, the schema validation and the policies, no
  cluster), in this process, as ``make preview`` runs it without the server dry-run;
* **program**: only the program's registration under the mock engine (config, components, every
  registration), timed warm in this process;
* **program process**: the Python process the engine's language host runs for ``pulumi preview``, measured
  from outside (``bench/engine_probe``: each Python process the language host starts records its own CPU
  and wall time since the kernel started it, interpreter start-up and imports included), and the short
  Python processes the language host runs beside it (to list plugins and packages);
* **engine preview**: ``pulumi preview`` by the pinned CLI, language host and Kubernetes provider
  against a control plane prepared like a Deckhouse cluster (``tests/cluster/pulumi_project.py``);
* **engine up / up (no changes) / destroy**: the full cycle, DaemonSets rolling out on kwok Nodes.

Printed: the median of each, and the program's share of the engine's preview and of ``up``: its
registration alone, and the whole process the engine waits for.

    .venv/bin/python bench/bench_engine.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PROBE_DIR = REPO / "bench" / "engine_probe"
PROBE_ENV = "NVIDIA_GPU_BENCH_PROBE"

from localcluster import ControlPlane, tools_bin  # noqa: E402
from nvidia_gpu.preview.pipeline import run_preview  # noqa: E402
from tests.cluster.pulumi_project import make_project, prepare_cluster  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def probed(path: Path, program_dir: Path, show: bool) -> tuple[float, float, float, int]:
    """What the Python processes recorded in ``path`` cost, then empties it: the program's process (the
    language host's executor names the program's directory as its ``argv[0]``) as CPU and wall seconds, the
    others' CPU seconds, how many. ``show`` prints each."""
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    program = [r for r in records if r["argv"] and Path(str(r["argv"][0])) == program_dir]
    others = [r for r in records if r not in program]
    for r in records if show else []:
        what = "the program" if r in program else "python " + " ".join(str(a) for a in r["argv"])[:60]
        print(f"    {what}: {r['cpu_s']:.2f} s CPU, {r['wall_s']:.2f} s wall, peak RSS {r['maxrss_kib'] >> 10} MiB")
    return (sum(r["cpu_s"] for r in program), sum(r["wall_s"] for r in program),
            sum(r["cpu_s"] for r in others), len(others))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {k: [] for k in (
        "offline", "program", "program process wall", "program process CPU", "other Python CPU",
        "engine preview", "engine up", "engine up again", "engine destroy")}
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(directory=work / "cluster", bin_dir=tools_bin())
        cp.start()
        try:
            prepare_cluster(cp)
            project = make_project(cp, work / "engine")
            project.pulumi("stack", "init", "dev")
            probe = work / "probe.jsonl"
            project.env.update(PYTHONPATH=f"{PROBE_DIR}:{project.env.get('PYTHONPATH', '')}",
                               **{PROBE_ENV: str(probe)})
            run_preview(REPO, "dev", work / "warm")  # imports and schemas, paid once per process
            for i in range(args.rounds):
                start = time.perf_counter()
                result = run_preview(REPO, "dev", work / f"out-{i}")
                figures["offline"].append(time.perf_counter() - start)
                figures["program"].append(result.timings_ms.get("program", 0.0) / 1000)
                probe.unlink(missing_ok=True)
                figures["engine preview"].append(timed(lambda: project.pulumi("preview")))
                cpu, wall, others, _ = probed(probe, project.directory, show=i == 0)
                figures["program process wall"].append(wall)
                figures["program process CPU"].append(cpu)
                figures["other Python CPU"].append(others)
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
          f"preview, {med['program'] / med['engine up']:.0%} of up")
    print(f"  the program's process under the engine: {med['program process wall'] / med['engine preview']:.0%} of "
          f"the preview's wall time ({med['program process wall']:.2f} s, {med['program process CPU']:.2f} s CPU); "
          f"the language host's other Python processes {med['other Python CPU']:.2f} s CPU; the rest is the CLI, "
          f"engine, provider and server")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
