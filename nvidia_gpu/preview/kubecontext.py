"""``python -m nvidia_gpu.preview.kubecontext --stack dev KUBECONFIG``: the stack's kube context is there.

The stack config names the kubeconfig context its provider uses (``nvidia-gpu:cluster.kubeContext``;
without it, the kubeconfig's current context). A CI secret whose kubeconfig names its context
otherwise (``kubernetes-admin@prod``, an EKS ARN) makes ``pulumi preview`` fail deep inside the
provider with ``context "prod" does not exist``; the workflows run this first, so the message says
which context is missing, which ones the kubeconfig has and where to fix it. Exit 0 when present, 1
when not (or when the files cannot be read), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from nvgpu.stackconfig import StackConfigError, load_stack_file


def problem(stack_file: Path, kubeconfig: Path) -> str | None:
    """Why the stack's context is not usable from ``kubeconfig``, or None when it is."""
    try:
        wanted = load_stack_file(stack_file).cluster.kube_context
    except StackConfigError as e:
        return str(e)
    try:
        doc = yaml.safe_load(kubeconfig.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        return f"{kubeconfig}: cannot read the kubeconfig: {e}"
    if not isinstance(doc, dict):
        return f"{kubeconfig}: not a kubeconfig (expected a mapping)"
    contexts = sorted(str(c.get("name")) for c in doc.get("contexts") or [] if isinstance(c, dict))
    if wanted is None:
        current = doc.get("current-context")
        if current in contexts:
            return None
        return (f"{kubeconfig}: {stack_file.name} sets no nvidia-gpu:cluster.kubeContext, and the kubeconfig's "
                f"current-context {current!r} is not one of its contexts ({', '.join(contexts) or 'none'})")
    if wanted in contexts:
        return None
    return (f"{kubeconfig}: no context {wanted!r}, which {stack_file.name} names in nvidia-gpu:cluster.kubeContext; "
            f"the kubeconfig has: {', '.join(contexts) or 'no contexts'}. Rename the context in the kubeconfig "
            f"(kubectl config rename-context) or set kubeContext to one of these")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvidia_gpu.preview.kubecontext",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument("--project-dir", type=Path, default=Path.cwd(), help="directory holding Pulumi.yaml")
    parser.add_argument("kubeconfig", type=Path)
    args = parser.parse_args(argv)
    found = problem(args.project_dir / f"Pulumi.{args.stack}.yaml", args.kubeconfig)
    if found is not None:
        print(found, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
