"""``--nvml real --driver-root``: NVIDIA's mock NVML placed under a fake driver root, no ``LD_LIBRARY_PATH``.

What the setup container of the daemonset backend does on a node whose runtime is not configured yet:
the image has no ``libnvidia-ml.so.1`` and nothing injects one, so the agent loads it from the driver
root mounted at ``/driver-root``. Each run is a subprocess (the mock's Go runtime stays out of pytest).
Skipped without the mock library (``tools/build.sh``) unless ``NVIDIA_GPU_REQUIRE_CLUSTER=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fakehost import build_fake_host
from tests.kit.tools import required_bin

#: NVIDIA's mock NVML (go-nvml's machines behind NVML's C ABI, built by make tools): the compare tier.
pytestmark = pytest.mark.compare

REPO = Path(__file__).resolve().parents[2]
LIBRARY = "libnvidia-ml.so.1"
LIB_DIR = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def mock_library() -> Path:
    return required_bin(LIBRARY) / LIBRARY


def _driver_root(tmp_path: Path, library: Path) -> Path:
    root = tmp_path / "driver-root"
    (root / LIB_DIR).mkdir(parents=True)
    shutil.copy(library, root / LIB_DIR / LIBRARY)
    return root


def _agent(host: Path, driver_root: Path, *args: str) -> tuple[int, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVIDIA_DRIVER_ROOT")}
    env.update(PYTHONPATH=str(REPO), MOCK_NVML_MACHINE="dgxh100")
    done = subprocess.run(
        [sys.executable, "-m", "node_agent", "--host-root", str(host), "--host-exec", "direct", "--nvml", "real",
         "--driver-root", str(driver_root), "--json", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{args} (rc {done.returncode}): {done.stdout}\n{done.stderr}") from None


def test_check_finds_the_gpus_in_the_driver_root(tmp_path: Path, mock_library: Path) -> None:
    host = build_fake_host(tmp_path / "host", "dgx-h100")
    code, doc = _agent(host.root, _driver_root(tmp_path, mock_library), "check", "--phase", "host", "--no-record")
    assert (code, doc["verdict"]) == (0, "ok"), doc
    assert len(doc["gpus"]) == 8 and {g["model"] for g in doc["gpus"]} == {"H100-80GB"}


def test_empty_driver_root_fails_naming_the_paths(tmp_path: Path, mock_library: Path) -> None:
    host = build_fake_host(tmp_path / "host", "dgx-h100")
    empty = tmp_path / "empty-driver-root"
    empty.mkdir()
    code, doc = _agent(host.root, empty, "check", "--phase", "host", "--no-record")
    assert (code, doc["reasons"]) == (1, ["nvml-failed"]), doc
    message = doc["findings"][0]["message"]
    assert f"no {LIBRARY} under driver root {empty}" in message
    for d in ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib", "lib/x86_64-linux-gnu", "lib64"):
        assert str(empty / d / LIBRARY) in message
    assert str(empty / "etc/ld.so.cache") in message


def test_setup_on_a_node_whose_runtime_is_not_configured(tmp_path: Path, mock_library: Path) -> None:
    """The daemonset backend's setup: NVML comes from the driver root, then the runtime gets configured."""
    host = build_fake_host(tmp_path / "host", "dgx-h100", containerd=2, deckhouse=False)
    code, doc = _agent(host.root, _driver_root(tmp_path, mock_library), "setup", "--no-patch-node")
    assert doc["steps"][0]["name"] == "check" and doc["steps"][0]["ok"], doc
    assert doc["steps"][0]["detail"].startswith("8 GPU(s)")
    assert (code, doc["complete"], [s["name"] for s in doc["steps"]]) == (0, True, ["check", "runtime", "sysctl"])
    assert "changed: nothing" not in doc["steps"][1]["detail"]  # the runtime was not configured before
