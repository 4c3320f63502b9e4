"""What the Kubernetes provider costs a cold ``make tools``, against the provider built as upstream builds it.

The provider was the slowest component of a cold build (7.5 of 24 minutes on 2 cores). Both sides run in
one run, each with an empty Go build cache of its own and the shared module cache warm (downloads are
not compiling), on the same scratch copy of ``tools/pulumi-kubernetes``:

* upstream: its ``go generate`` (``go run generate.go``, plain flags) and ``go build`` of
  ``cmd/pulumi-resource-kubernetes``, which compiles the whole generated Go SDK through ``yaml/v2``;
* ours: ``tools/pulumi-kubernetes/build.sh`` (the SDK file replaced, the generator built with the
  provider's flags).

Also: the Go SDK's ``yaml/v2`` package alone on top of Pulumi's Go SDK, the share the replacement cuts.
Prints seconds per side and the ratio. About 12 minutes on 2 cores; needs Go and the module cache warm
(``make tools`` once).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "pulumi-kubernetes"
PROVIDER = "github.com/pulumi/pulumi-kubernetes/provider/v4"
CMD = "cmd/pulumi-resource-kubernetes"


def _env(gocache: Path, cgo: str = "1") -> dict[str, str]:
    return {**os.environ, "GOCACHE": str(gocache), "GOFLAGS": "-buildvcs=false -mod=mod", "CGO_ENABLED": cgo}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - t0


def upstream(work: Path) -> float:
    """The provider as its own Makefile builds it: generate, then build, no replacement."""
    gocache = work / "gocache-upstream"
    src = work / "upstream"
    (src / "cmd").mkdir(parents=True)
    for f in ("go.mod", "go.sum"):
        shutil.copy(TOOL / f, src / f)
    cmd_dir = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", PROVIDER], cwd=TOOL, env=_env(gocache),
                             check=True, capture_output=True, text=True).stdout.strip()
    shutil.copytree(Path(cmd_dir) / CMD, src / CMD)
    for p in src.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    generate = _run(["go", "run", "generate.go"], src / CMD, {**_env(gocache), "VERSION": "4.34.2"})
    build = _run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(work / "upstream.bin"), f"./{CMD}"],
                 src, _env(gocache, "0"))
    return generate + build


def ours(work: Path) -> float:
    out = work / "ours"
    out.mkdir()
    return _run(["bash", "./build.sh", str(out)], TOOL, _env(work / "gocache-ours"))


def sdk_share(work: Path) -> tuple[float, float]:
    """Pulumi's Go SDK alone, then the Kubernetes Go SDK's yaml/v2 on top (what the replacement avoids)."""
    env = _env(work / "gocache-sdk", "0")
    base = _run(["go", "build", "-trimpath", "github.com/pulumi/pulumi/sdk/v3/go/pulumi"], TOOL, env)
    top = _run(["go", "build", "-trimpath", "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/yaml/v2"],
               TOOL, env)
    return base, top


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        work = Path(tmp)
        up = upstream(work)
        print(f"upstream build (generate + build)       {up:7.0f} s")
        our = ours(work)
        print(f"ours (tools/pulumi-kubernetes/build.sh) {our:7.0f} s   ratio {our / up:.2f}")
        base, top = sdk_share(work)
        print(f"Pulumi Go SDK alone                     {base:7.0f} s")
        print(f"Kubernetes Go SDK (yaml/v2) on top      {top:7.0f} s   {top / up:.0%} of upstream's build")


if __name__ == "__main__":
    main()
