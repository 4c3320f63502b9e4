"""``tools/build.sh``, the cache of the pinned components, run on components of its own (a recipe that
writes a file, one that fails) in a cache of its own: built once, keyed by the component's files, a
failure shown with the end of its log, and a second run waiting for the first's lock, then reusing it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tools(tmp_path: Path, recipes: dict[str, str]) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir()
    shutil.copy(REPO / "tools" / "build.sh", tools / "build.sh")
    for name, body in recipes.items():
        (tools / name).mkdir()
        recipe = f"#!/usr/bin/env bash\n# cold: 1 s on 2 cores\nset -euo pipefail\n{body}\n"
        (tools / name / "build.sh").write_text(recipe)
    return tools


def _run(tools: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("go") is None:
        pytest.skip("the build script asks Go for its release")
    return subprocess.run(["bash", str(tools / "build.sh"), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NVIDIA_GPU_TOOLS_CACHE": str(cache)}, check=False)


def test_components_are_built_once_and_rebuilt_when_their_files_change(tmp_path: Path) -> None:
    tools = _tools(tmp_path, {"hello": 'echo "go: downloading noise"; printf "#!/bin/sh\\necho hi\\n" > "$1/hello"'})
    cache = tmp_path / "cache"
    assert _run(tools, cache, "--print").returncode == 1
    first = _run(tools, cache)
    assert first.returncode == 0, first.stderr
    bin_dir = Path(first.stdout.strip().splitlines()[-1])
    assert (bin_dir / "hello").read_text() == "#!/bin/sh\necho hi\n"
    assert "building 1 of 1 components (hello)" in first.stderr and "[1/1] hello built in" in first.stderr
    assert "go: downloading" not in first.stderr  # Go's chatter goes to the component's .build.log
    warm = _run(tools, cache)
    assert (warm.returncode, warm.stdout.strip(), warm.stderr) == (0, str(bin_dir), "")
    assert _run(tools, cache, "--print").stdout.strip() == str(bin_dir)
    (tools / "hello" / "go.mod").write_text("module x\n")  # a pin change: that component again
    again = _run(tools, cache)
    assert again.returncode == 0 and "[1/1] hello built in" in again.stderr
    assert Path(again.stdout.strip()) != bin_dir


def test_a_failed_recipe_stops_the_build_with_the_end_of_its_log(tmp_path: Path) -> None:
    noisy = 'for i in $(seq 1 100); do echo "line $i"; done; echo "compile error" >&2; exit 3'
    tools = _tools(tmp_path, {"broken": noisy})
    done = _run(tools, tmp_path / "cache")
    assert done.returncode == 1
    assert "tools: broken failed; the end of" in done.stderr and "compile error" in done.stderr
    assert "line 60" not in done.stderr and "line 100" in done.stderr
    assert _run(tools, tmp_path / "cache", "--print").returncode == 1  # nothing half-built counts as built


def test_a_second_build_waits_for_the_first_and_uses_its_result(tmp_path: Path) -> None:
    tools = _tools(tmp_path, {"slow": 'sleep 2; touch "$1/slow"'})
    cache = tmp_path / "cache"
    if shutil.which("go") is None:
        pytest.skip("the build script asks Go for its release")
    env = {**os.environ, "NVIDIA_GPU_TOOLS_CACHE": str(cache)}
    first = subprocess.Popen(["bash", str(tools / "build.sh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        for _ in range(100):  # until the first holds the lock
            if (cache / ".lock").exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        second = _run(tools, cache)
    finally:
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert second.returncode == 0, second.stderr
    assert "another build holds" in second.stderr and "[1/1] slow" not in second.stderr
    assert second.stdout.strip().splitlines()[-1] == out.strip().splitlines()[-1]
