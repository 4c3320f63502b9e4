"""Offline preview cost per registered resource, against the Pulumi mock engine's own registration floor.

For synthetic stacks of 1, 10 and 100 node groups (cycling through the four sharing modes) it runs
the preview's own steps in process (config, program, render, validate; the policy step is measured
by the policy benchmarks) and, in the same run, a baseline that registers the same number of plain
resources (``pulumi.CustomResource`` with the same inputs, flat, no components, no dependencies) under
a fresh mock engine. A second baseline registers the same resources with their recorded parents, provider and
dependencies (the SDK's cost for a component tree of this shape). Printed: ms per resource, the ratios,
and how the per-resource cost grows from 1 to 100 groups (flat means linear growth). Target: <= 1.3.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pulumi
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from preview.engine import install_mocks, run_in_engine  # noqa: E402
from preview.model import RecordedResource  # noqa: E402
from preview.pipeline import DEFAULT_STEPS, run_preview  # noqa: E402

SIZES = (1, 10, 100)
#: The preview's own steps; later steps (policy analysis) have their own benchmark.
CORE_STEPS = tuple(s for s in DEFAULT_STEPS if s.name in ("config", "validate-start", "program", "render", "validate"))
REPEATS = 3
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
            pulumi.CustomResource(r.type_token if r.custom else "bench:index:Plain", f"r{i}", dict(r.inputs))

    start = time.perf_counter()
    run_in_engine(program)
    return time.perf_counter() - start


def structured_baseline(resources: tuple[RecordedResource, ...]) -> float:
    """Seconds to register the same resources with the same parents, provider and dependencies, and nothing else.

    This is the SDK's floor for a stack of this shape (a component tree with an explicit provider):
    no manifest building, no components' own code, no config, no rendering or validation.
    """
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


def main() -> int:
    rows = []
    # Under out/ like `make preview` (gitignored); this machine's /tmp creates files 20x slower.
    (ROOT / "out").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "out", prefix="bench-") as tmp_name:
        tmp = Path(tmp_name)
        run_preview(project(tmp, 1), "bench", tmp / "warm", CORE_STEPS)  # imports, schema caches
        for size in SIZES:
            directory = project(tmp, size)
            best_preview, best_base, best_shape, count = float("inf"), float("inf"), float("inf"), 0
            for attempt in range(REPEATS):
                start = time.perf_counter()
                result = run_preview(directory, "bench", tmp / f"out-{size}-{attempt}", CORE_STEPS)
                elapsed = time.perf_counter() - start
                if not result.ok:
                    print("\n".join(str(p) for p in result.problems), file=sys.stderr)
                    return 1
                count = len(result.resources)
                best_preview = min(best_preview, elapsed)
                best_base = min(best_base, baseline(result.resources))
                best_shape = min(best_shape, structured_baseline(result.resources))
            rows.append((size, count, best_preview, best_base, best_shape, result.timings_ms))
    print(f"{'groups':>6} {'resources':>9} {'preview':>8} {'plain':>8} {'ratio':>6} {'shaped':>8} {'ratio':>6}"
          "  (ms per resource; steps in ms)")
    for size, count, p, b, sh, timings in rows:
        steps = " ".join(f"{k}={v:.0f}" for k, v in timings.items())
        print(f"{size:>6} {count:>9} {p / count * 1000:>8.3f} {b / count * 1000:>8.3f} {p / b:>6.2f}"
              f" {sh / count * 1000:>8.3f} {p / sh:>6.2f}  {steps}")
    first, last = rows[0], rows[-1]
    growth = (last[2] / last[1]) / (first[2] / first[1])
    print(f"per-resource cost at {last[0]} groups / at {first[0]} group: {growth:.2f} (1.0 = linear)")
    worst = max(p / b for _, _, p, b, _, _ in rows)
    worst_shaped = max(p / sh for _, _, p, _, sh, _ in rows)
    print(f"worst ratio to the plain baseline: {worst:.2f}, to the same-shape baseline: {worst_shaped:.2f}"
          " (target <= 1.30)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
