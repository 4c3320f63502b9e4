"""Policy pack cost through the analyzer protocol, on a synthetic stack of 100 GPU node groups.

Runs the real program under the preview's mock engine to record the stack, then drives the real pack
process over gRPC as the Pulumi CLI does (``Analyze`` per resource, ``AnalyzeStack`` once) and reports:

* the pack's start time (spawn to first answered ``GetAnalyzerInfo``; target under 1 s);
* analysis time per resource, ``Analyze`` plus the resource's share of ``AnalyzeStack`` (target under 2 ms);
* the ratio to a baseline pack with one no-op policy, measured in the same run (the protocol's floor).

Usage: ``python bench/bench_policies.py [--groups 100] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nvidia_gpu.preview.engine import run_program  # noqa: E402
from nvidia_gpu.preview.policyrun.analyzer_client import PACK_DIR, AnalyzerResource, PackProcess, StackContext  # noqa: E402
from nvidia_gpu.preview.stackfile import engine_config  # noqa: E402

TARGET_START_S = 1.0
TARGET_PER_RESOURCE_MS = 2.0
_SHARING = (
    ("H100-80GB", {"sharing": "MIG", "mig": {"partedConfig": "all-1g.10gb"}}),
    ("L4", {"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 8}}),
    ("A100-80GB", {"sharing": "Exclusive"}),
    ("A30-24GB", {"sharing": "MPS", "mps": {"partitionCount": 4}}),
)
_NOOP_PACK = '''
from pulumi_policy import PolicyPack, ResourceValidationPolicy, StackValidationPolicy
PolicyPack("baseline", [
    ResourceValidationPolicy("noop", "does nothing", lambda args, report: None),
    StackValidationPolicy("noop-stack", "does nothing", lambda args, report: None),
])
'''


def synthetic_config(groups: int) -> dict[str, object]:
    node_groups = []
    for i in range(groups):
        model, gpu = _SHARING[i % len(_SHARING)]
        node_groups.append({"name": f"g{i:03d}", "nodeGroup": f"gpu-{i:03d}", "gpu": {"model": model, **gpu}})
    return {
        "nvidia-gpu:cluster": {
            "kubernetesVersion": "1.34", "nodeSetup": "deckhouse",
            "agentImage": {"repository": "registry.example.com/nvidia-gpu-agent", "tag": "0.1.0"},
        },
        "nvidia-gpu:nodeGroups": node_groups,
    }


def record(groups: int) -> tuple[list[AnalyzerResource], dict[str, str]]:
    config, _ = engine_config(synthetic_config(groups))
    resources, error = run_program(ROOT / "__main__.py", "nvidia-gpu", "bench", config)
    if error is not None:
        raise SystemExit(f"program failed: {error}")
    return [
        AnalyzerResource(r.type_token, r.urn, r.name, r.inputs, r.parent_urn or "", r.dependencies) for r in resources
    ], config


def measure(pack_dir: Path, resources: list[AnalyzerResource], stack: StackContext, rounds: int) -> dict[str, float]:
    starts, analyze, stack_s, diagnostics = [], [], [], 0
    for _ in range(rounds):
        with PackProcess(pack_dir, stack) as pack:
            starts.append(pack.start_seconds)
            t0 = time.perf_counter()
            for r in resources:
                diagnostics += len(pack.analyze(r))
            t1 = time.perf_counter()
            diagnostics += len(pack.analyze_stack(resources))
            t2 = time.perf_counter()
            analyze.append(t1 - t0)
            stack_s.append(t2 - t1)
    n = len(resources)
    return {
        "start_s": statistics.median(starts),
        "analyze_ms_per_resource": statistics.median(analyze) / n * 1000,
        "stack_ms_per_resource": statistics.median(stack_s) / n * 1000,
        "total_ms_per_resource": statistics.median(a + s for a, s in zip(analyze, stack_s, strict=True)) / n * 1000,
        "diagnostics": diagnostics / rounds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    began = time.perf_counter()
    resources, config = record(args.groups)
    print(f"recorded {len(resources)} resources for {args.groups} node groups "
          f"in {time.perf_counter() - began:.2f} s")
    stack = StackContext("nvidia-gpu", "bench", config)
    ours = measure(PACK_DIR, resources, stack, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp)
        (base_dir / "PulumiPolicy.yaml").write_text("runtime: python\nversion: 0.0.1\n")
        (base_dir / "__main__.py").write_text(_NOOP_PACK)
        base = measure(base_dir, resources, stack, args.rounds)

    print(f"{'':28}{'nvidia-gpu pack':>18}{'no-op baseline':>18}{'ratio':>8}")
    for key, label in (("start_s", "pack start (s)"), ("analyze_ms_per_resource", "Analyze (ms/resource)"),
                       ("stack_ms_per_resource", "AnalyzeStack (ms/resource)"),
                       ("total_ms_per_resource", "total (ms/resource)")):
        print(f"{label:28}{ours[key]:18.3f}{base[key]:18.3f}{ours[key] / base[key]:8.2f}")
    print(f"violations reported: {ours['diagnostics']:.0f}")
    ok_start = ours["start_s"] < TARGET_START_S
    ok_total = ours["total_ms_per_resource"] < TARGET_PER_RESOURCE_MS
    print(f"target pack start < {TARGET_START_S:.0f} s: {'met' if ok_start else 'MISSED'} "
          f"({ours['start_s'] / TARGET_START_S:.2f} of target); "
          f"target < {TARGET_PER_RESOURCE_MS:.0f} ms/resource: {'met' if ok_total else 'MISSED'} "
          f"({ours['total_ms_per_resource'] / TARGET_PER_RESOURCE_MS:.2f} of target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
