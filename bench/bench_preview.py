"""Offline preview cost per registered resource, against a bare Pulumi-mock baseline measured in the same run.

For synthetic stacks of 1, 10 and 100 node groups (cycling through the four sharing modes) each round
runs, interleaved and in alternating order, three things in this process:

* **preview**: ``run_preview`` with the preview's own steps: config (read and validate the stack file),
  validate-start, program (the real ``__main__.py`` under the recording mock engine: config decode,
  every component's code, every registration, ``register_outputs``, stack exports), render (manifests
  and ``plan.json`` text, written by a background thread), validate (every manifest against its
  OpenAPI/CRD schema) and the wait for the file writes. Not included: the policy step (measured by
  ``bench/bench_policies.py``).
* **plain**: the baseline the issue names. A fresh recording mock engine (same ``run_in_engine``, same
  monitor, same collector settings) registers exactly as many resources as the preview recorded, each a
  plain ``pulumi.CustomResource`` with the inputs that resource was recorded with (components and the
  provider included, their type tokens swapped for a plain one), flat: no parents, providers,
  dependencies or outputs. That is the SDK's registration cost for the same count and input sizes, as the
  preview runs the SDK (its collector settings, ``engine.program_gc``, included): not a bare SDK process,
  which ``bench_engine.py`` and the CLI's own runs measure.
* **shaped**: the same registrations with their recorded parents, provider and dependencies (the SDK's
  cost for a component tree of this shape), still without any of the program's own code.

Printed per size (medians over the rounds): ms per resource for each, the ratios (``no-io``: the
preview less its wait for the output files after the last step, which on a busy disk varies tenfold
from run to run), and the preview's steps; a flat per-resource cost from 1 to 100 groups means linear
growth. Then the split of the preview into a fixed part and a part proportional to the SDK's work:
the line ``preview = fixed + k x plain`` through the two smallest sizes (plain time rather than the
resource count measures the work, because kinds differ in cost and their mix changes with size).
``k`` is the ratio without fixed costs, ``fixed`` what every run pays regardless of size (stack-wide
components, stack file, output directory), next to an empty run of the mock engine (the part of
plain that is fixed). Per-process costs (imports, loading schemas on first use) are paid once by a
warm-up run before measuring and are reported separately.
Target: preview <= 1.3x plain.

Usage: ``python bench/bench_preview.py [--rounds 5] [--sizes 1,10,100] [--profile GROUPS]``;
``--profile`` prints a pyinstrument profile of one preview of that many groups instead.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nvidia_gpu.preview.engine import install_mocks, run_in_engine  # noqa: E402
from nvidia_gpu.preview.model import RecordedResource  # noqa: E402
from nvidia_gpu.preview.pipeline import DEFAULT_STEPS, run_preview  # noqa: E402

SIZES = (1, 10, 100)
#: The preview's own steps; the policy step (analysis through the pack) has its own benchmark.
CORE_STEPS = tuple(s for s in DEFAULT_STEPS if s.name in ("config", "validate-start", "program", "render", "validate"))
ROUNDS = 5
TARGET = 1.3
PLAIN_TYPE = "bench:index:Plain"
MODES: tuple[dict[str, Any], ...] = (
    {"model": "H100-80GB", "sharing": "MIG", "mig": {"partedConfig": "all-1g.10gb"}},
    {"model": "L4", "sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 8}},
    {"model": "A100-80GB", "sharing": "Exclusive"},
    {"model": "A30-24GB", "sharing": "MPS", "mps": {"partitionCount": 4}},
)


def synthetic_stack(groups: int) -> dict[str, Any]:
    return {
        "config": {
            "nvidia-gpu:cluster": {
                "kubernetesVersion": "1.34",
                "nodeSetup": "deckhouse",
                "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.1.0"},
            },
            "nvidia-gpu:nodeGroups": [
                {"name": f"g{i:03d}", "nodeGroup": f"gpu-{i:03d}", "gpu": dict(MODES[i % len(MODES)])}
                for i in range(groups)
            ],
        }
    }


def project(tmp: Path, groups: int) -> Path:
    directory = tmp / f"p{groups}"
    directory.mkdir(exist_ok=True)
    shutil.copy(ROOT / "Pulumi.yaml", directory / "Pulumi.yaml")
    shutil.copy(ROOT / "__main__.py", directory / "__main__.py")
    (directory / "Pulumi.bench.yaml").write_text(yaml.safe_dump(synthetic_stack(groups)))
    return directory


def baseline(resources: tuple[RecordedResource, ...]) -> float:
    """Seconds to register the same count of plain resources, with the same inputs, under the mock engine."""
    install_mocks("bench", "baseline")

    def program() -> None:
        for i, r in enumerate(resources):
            token = r.type_token if r.custom and not r.is_provider else PLAIN_TYPE
            pulumi.CustomResource(token, f"r{i}", dict(r.inputs))

    start = time.perf_counter()
    run_in_engine(program)
    return time.perf_counter() - start


def structured_baseline(resources: tuple[RecordedResource, ...]) -> float:
    """Seconds to register the same resources with the same parents, provider and dependencies, and nothing else."""
    install_mocks("bench", "structured")
    by_urn = {r.urn: r for r in resources}
    created: dict[str, pulumi.Resource] = {}

    def make(r: RecordedResource) -> pulumi.Resource:
        if r.urn in created:
            return created[r.urn]
        parent = make(by_urn[r.parent_urn]) if r.parent_urn in by_urn else None
        deps = [make(by_urn[d]) for d in r.dependencies if d in by_urn]
        provider = next((make(p) for u, p in by_urn.items() if r.provider and r.provider.startswith(u + "::")), None)
        opts = pulumi.ResourceOptions(parent=parent, depends_on=deps, provider=provider)  # type: ignore[arg-type]
        if r.is_provider:
            res: pulumi.Resource = pulumi.ProviderResource("kubernetes", r.name, dict(r.inputs), opts)
        elif r.custom:
            res = pulumi.CustomResource(r.type_token, r.name, dict(r.inputs), opts)
        else:
            res = pulumi.ComponentResource(r.type_token, r.name, None, opts)
        created[r.urn] = res
        return res

    def program() -> None:
        for r in resources:
            make(r)

    start = time.perf_counter()
    run_in_engine(program)
    return time.perf_counter() - start


@dataclass
class Samples:
    """One stack size's measurements over the rounds (seconds; steps in ms)."""

    groups: int
    resources: int = 0
    preview: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    shaped: list[float] = field(default_factory=list)
    steps: list[dict[str, float]] = field(default_factory=list)

    def median_steps(self) -> dict[str, float]:
        return {k: statistics.median(s[k] for s in self.steps) for k in self.steps[0]}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line ``y = intercept + slope * x``: (intercept, slope)."""
    slope = statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope
    return statistics.fmean(y for _, y in points) - slope * statistics.fmean(x for x, _ in points), slope


def first_run_cost(tmp: Path) -> tuple[float, float]:
    """(cold, warm) seconds of a 1-group preview in a fresh interpreter: imports and schema loads are the gap."""
    code = (
        "import sys, time; t = time.perf_counter(); sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])\n"
        "import bench_preview as b\n"
        "from pathlib import Path\n"
        "d = b.project(Path(sys.argv[3]), 1)\n"
        "b.run_preview(d, 'bench', Path(sys.argv[3]) / 'cold', b.CORE_STEPS); c = time.perf_counter() - t\n"
        "t = time.perf_counter(); b.run_preview(d, 'bench', Path(sys.argv[3]) / 'warm2', b.CORE_STEPS)\n"
        "print(c, time.perf_counter() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(ROOT / "bench"), str(tmp)],
                         check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def preview_once(directory: Path, out: Path, s: Samples) -> float:
    start = time.perf_counter()
    result = run_preview(directory, "bench", out, CORE_STEPS)
    elapsed = time.perf_counter() - start
    if not result.ok:
        raise SystemExit("\n".join(str(p) for p in result.problems))
    s.resources = len(result.resources)
    s.steps.append(dict(result.timings_ms))
    return elapsed


def measure(tmp: Path, sizes: tuple[int, ...], rounds: int, empty: list[float]) -> list[Samples]:
    """Every size every round; inside a round the preview runs first in even rounds and last in odd ones."""
    recorded: dict[int, tuple[RecordedResource, ...]] = {}
    for size in sizes:  # warm-up (imports, schema caches) and the registrations the baselines replay
        result = run_preview(project(tmp, size), "bench", tmp / f"warm-{size}", CORE_STEPS)
        if not result.ok:
            raise SystemExit("\n".join(str(p) for p in result.problems))
        recorded[size] = result.resources
    samples = [Samples(size) for size in sizes]
    for round_no in range(rounds):
        empty.append(baseline(()))
        for s in samples:
            directory, out = tmp / f"p{s.groups}", tmp / f"out-{s.groups}-{round_no}"
            if round_no % 2 == 0:
                s.preview.append(preview_once(directory, out, s))
            s.plain.append(baseline(recorded[s.groups]))
            s.shaped.append(structured_baseline(recorded[s.groups]))
            if round_no % 2 == 1:
                s.preview.append(preview_once(directory, out, s))
            # Outputs stay until the end: deleting thousands of files here (ext4 with online discard) slowed
            # the next runs' file creation tenfold on the benchmark machine.
    return samples


def report(samples: list[Samples], empty: list[float], first: tuple[float, float] | None) -> list[str]:
    med = statistics.median
    lines = [
        f"{'groups':>6} {'resources':>9} {'preview':>8} {'plain':>8} {'ratio':>6} {'no-io':>6} {'shaped':>8}"
        f" {'ratio':>6}  (ms per resource, medians; preview steps in ms)"
    ]
    for s in samples:
        p, b, sh = med(s.preview), med(s.plain), med(s.shaped)
        # The same preview runs less the time spent waiting for the output files after the last step: the
        # writes are the preview's own work, but their cost depends on the disk (see the io-wait step).
        p_cpu = med(run - step["io-wait"] / 1000 for run, step in zip(s.preview, s.steps, strict=True))
        steps = " ".join(f"{k}={v:.0f}" for k, v in s.median_steps().items())
        lines.append(f"{s.groups:>6} {s.resources:>9} {p / s.resources * 1000:>8.3f} {b / s.resources * 1000:>8.3f}"
                     f" {p / b:>6.2f} {p_cpu / b:>6.2f} {sh / s.resources * 1000:>8.3f} {p / sh:>6.2f}  {steps}")
    head, tail = samples[0], samples[-1]
    growth = (med(tail.preview) / tail.resources) / (med(head.preview) / head.resources)
    base_growth = (med(tail.plain) / tail.resources) / (med(head.plain) / head.resources)
    lines.append(f"per-resource cost at {tail.groups} groups / at {head.groups}: preview {growth:.2f}, "
                 f"plain {base_growth:.2f} (1.0 = linear)")
    if len(samples) >= 2:
        # Preview time as a line in plain time through the two smallest sizes: the slope is the cost ratio of
        # the work that grows with the stack, the intercept what a run pays whatever its size.
        small = samples[:2]
        fixed, slope = fit([(med(s.plain), med(s.preview)) for s in small])
        p1, b1 = med(head.preview), med(head.plain)
        lines.append(f"split through {small[0].groups} and {small[1].groups} groups: preview = {fixed * 1000:.1f} ms "
                     f"fixed + {slope:.2f} x plain; an empty mock-engine run costs {med(empty) * 1000:.1f} ms")
        lines.append(f"at {head.groups} group: preview {p1 * 1000:.1f} ms, plain {b1 * 1000:.1f} ms; without the "
                     f"fixed {fixed * 1000:.1f} ms the ratio would be {(p1 - fixed) / b1:.2f}")
    if first is not None:
        lines.append(f"per process, before any of the above (paid once, by neither side): first 1-group preview in a "
                     f"fresh interpreter {first[0] * 1000:.0f} ms incl. imports and schema loads, the next "
                     f"{first[1] * 1000:.0f} ms")
    worst = max(med(s.preview) / med(s.plain) for s in samples)
    lines.append(f"worst ratio to the plain baseline: {worst:.2f} (target <= {TARGET:.2f})")
    return lines


def profile(groups: int) -> None:
    from pyinstrument import Profiler  # noqa: PLC0415 - the profiler: only with --profile, a dev-only install

    with tempfile.TemporaryDirectory(dir=ROOT / "out", prefix="bench-") as tmp_name:
        tmp = Path(tmp_name)
        directory = project(tmp, groups)
        run_preview(directory, "bench", tmp / "warm", CORE_STEPS)
        profiler = Profiler(interval=0.0005)
        profiler.start()
        run_preview(directory, "bench", tmp / "out", CORE_STEPS)
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="node-group counts, comma-separated")
    parser.add_argument("--profile", type=int, metavar="GROUPS", help="profile one preview instead")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile)
        return 0
    sizes = tuple(int(x) for x in args.sizes.split(","))
    # Under out/ like `make preview` (gitignored); this machine's /tmp creates files 20x slower.
    (ROOT / "out").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "out", prefix="bench-") as tmp_name:
        tmp = Path(tmp_name)
        first = first_run_cost(tmp)
        empty: list[float] = []
        samples = measure(tmp, sizes, args.rounds, empty)
    print("\n".join(report(samples, empty, first)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
