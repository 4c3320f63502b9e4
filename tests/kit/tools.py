"""The pinned binaries for the tests that need them (``make tools``), found one way.

Without them a plain ``pytest`` skips those tests and says why; ``make test`` and CI set
``NVIDIA_GPU_REQUIRE_CLUSTER=1``, which turns the skip into a failure, so a missing build can never
pass for a green run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

from localcluster import ToolsMissing, tools_bin

MOCK_NVML = "libnvidia-ml.so.1"


def missing(reason: str) -> NoReturn:
    if os.environ.get("NVIDIA_GPU_REQUIRE_CLUSTER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def required_bin(*names: str) -> Path:
    """The tools bin directory, holding every one of ``names``."""
    try:
        bin_dir = tools_bin()
    except ToolsMissing as e:
        missing(str(e))
    for name in names:
        if not (bin_dir / name).exists():
            missing(f"{bin_dir / name} is missing: run tools/build.sh (make tools)")
    return bin_dir
