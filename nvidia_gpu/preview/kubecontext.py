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
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from nvgpu.stackconfig import StackConfigError, load_stack_file


def problem(stack_file: Path, kubeconfig: Path) -> str | None:
    """Why the stack's context is not usable from ``kubeconfig``, or None when it is."""
    try:
        wanted = load_stack_file(stack_file).cluster.kube_context
    except StackConfigError as e:
        return str(e)
    return context_problem(wanted, [kubeconfig], stack_file.name, missing_ok=False)


def kubeconfig_files(env: Mapping[str, str]) -> list[Path]:
    """The files the Kubernetes provider merges, as kubectl does: ``$KUBECONFIG`` (a path list), else
    ``~/.kube/config``."""
    listed = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [Path(env.get("HOME", str(Path.home()))) / ".kube" / "config"]


def context_problem(wanted: str | None, files: Sequence[Path], source: str = "the stack", *,
                    missing_ok: bool = True) -> str | None:
    """Why ``wanted`` (None: the current context) is not a context of the merged ``files``, in one line,
    or None when it is. With ``missing_ok``, files that do not exist are skipped and none at all is not a
    problem: the provider may then run with the in-cluster configuration, and says so when it cannot."""
    contexts: list[str] = []
    current: str | None = None
    read: list[Path] = []
    for path in files:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError as e:
            if missing_ok:
                continue
            return f"{path}: cannot read the kubeconfig: {e.strerror}"
        except (OSError, yaml.YAMLError) as e:
            return f"{path}: cannot read the kubeconfig: {str(e).splitlines()[0]}"
        if not isinstance(doc, dict):
            return f"{path}: not a kubeconfig (expected a mapping)"
        read.append(path)
        contexts += [str(c.get("name")) for c in doc.get("contexts") or [] if isinstance(c, dict)]
        current = current or (str(doc["current-context"]) if doc.get("current-context") else None)
    if not read:
        return None
    where = ", ".join(map(str, read))
    known = ", ".join(sorted(set(contexts))) or "no contexts"
    if wanted is None:
        if current in contexts:
            return None
        return (f"{where}: {source} sets no nvidia-gpu:cluster.kubeContext, and the kubeconfig's current-context "
                f"{current!r} is not one of its contexts ({known})")
    if wanted in contexts:
        return None
    return (f"{where}: no context {wanted!r}, which {source} names in nvidia-gpu:cluster.kubeContext; the kubeconfig "
            f"has: {known}. Rename the context in the kubeconfig (kubectl config rename-context) or set kubeContext "
            "to one of these")


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
