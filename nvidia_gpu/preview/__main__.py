"""``python -m nvidia_gpu.preview --stack dev``: the offline preview's command line (what ``make preview`` runs).

Exit status: 0 when the stack renders and validates cleanly, 1 when there are problems (listed on
stderr, one per line, each naming the config path, resource or manifest), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from nvidia_gpu.preview.pipeline import run_preview
from nvidia_gpu.preview.summary import problem_lines, summary_lines

log = logging.getLogger("preview")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvidia_gpu.preview", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="dev", help="stack name: reads Pulumi.<stack>.yaml (default: dev)")
    parser.add_argument("--project-dir", type=Path, default=Path.cwd(), help="directory holding Pulumi.yaml")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: out/<stack>)")
    parser.add_argument("--quiet", action="store_true", help="print only problems")
    parser.add_argument("--server-dry-run", type=Path, default=None, metavar="KUBECONFIG",
                        help="dry-run every object against this cluster's API server (nothing is written)")
    parser.add_argument("--context", default=None, help="kubeconfig context for --server-dry-run")
    parser.add_argument("--no-server-dry-run", action="store_true",
                        help="schemas and policies only: skip the dry-run on a throwaway control plane")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="level=%(levelname)s logger=%(name)s msg=%(message)s")

    if not (args.project_dir / f"Pulumi.{args.stack}.yaml").is_file():
        print(f"no stack file Pulumi.{args.stack}.yaml in {args.project_dir.resolve()}", file=sys.stderr)
        return 2
    if args.server_dry_run is not None and not args.server_dry_run.is_file():
        print(f"--server-dry-run: no kubeconfig at {args.server_dry_run}", file=sys.stderr)
        return 2
    result = run_preview(args.project_dir, args.stack, args.out,
                         server_mode="off" if args.no_server_dry_run else "auto",
                         server_kubeconfig=args.server_dry_run, server_context=args.context)
    if result.manifests and not args.quiet:
        print("\n".join(summary_lines(result)))
    log.info("preview stack=%s resources=%d manifests=%d problems=%d timings_ms=%s", result.stack,
             len(result.resources), len(result.manifests), len(result.problems), result.timings_ms)
    if result.problems:
        print("\n".join(problem_lines(result)), file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"\nNo problems: {len(result.manifests)} manifests valid for Kubernetes "
              f"{result.config.cluster.kubernetes_version if result.config else '?'}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
