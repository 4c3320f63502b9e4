"""The agent image's size, built as CI builds it (``node_agent/image/build.sh``), with what is in it.

Prints the image and its base as ``buildah images`` shows them (layers uncompressed, as ``docker images``),
and the largest packages of the agent's virtualenv inside it, so a dependency that grows shows up here.
The figure before the lean image was 408 MB (on ``python:3.11-slim``, 199 MB). Needs root, buildah and
debootstrap; the base is cached outside the checkout, so a warm run takes about 25 s.
Run: ``python bench/bench_image_size.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE_MB = 408
TAG = "localhost/nvidia-gpu-agent:bench"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="nvgpu-image-bench-") as storage:
        env = dict(os.environ, BUILDAH_ROOT=storage)
        cas = Path("/usr/local/share/ca-certificates")
        if list(cas.glob("*.crt")):
            env["CA_DIR"] = str(cas)
        t0 = time.monotonic()
        done = subprocess.run(["bash", str(ROOT / "node_agent/image/build.sh"), TAG], env=env, capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-4000:], file=sys.stderr)
            return 1
        build_s = time.monotonic() - t0
        bah = ["buildah", "--storage-driver", "vfs", "--root", f"{storage}/root", "--runroot", f"{storage}/run"]
        images = {i["names"][0]: i["size"] for i in json.loads(subprocess.run(
            [*bah, "images", "--json"], capture_output=True, text=True, check=True).stdout) if i.get("names")}
        ctr = subprocess.run([*bah, "from", "--quiet", TAG], capture_output=True, text=True, check=True).stdout.strip()
        du = subprocess.run([*bah, "run", "--isolation", "chroot", ctr, "--", "sh", "-c",
                             "du -sk /opt/agent/lib/python3*/site-packages/* /app | sort -n | tail -8"],
                            capture_output=True, text=True, check=False).stdout
        subprocess.run([*bah, "rm", "--all"], capture_output=True, check=False)
    agent = images.get(TAG, "?")
    base = next((size for name, size in images.items() if "nvidia-gpu-base" in name), "?")
    print(f"build: {build_s:.0f} s")
    print(f"agent image: {agent} (before: {BEFORE_MB} MB); base: {base}")
    print("largest in the image (KiB):")
    for line in du.splitlines():
        size, path = line.split(maxsplit=1)
        print(f"  {int(size):>7}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
