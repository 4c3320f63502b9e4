"""Helpers to render the node scripts once and run them against fake host roots."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nvgpu.nodescripts import render_node_scripts
from tests.kit.fakehost import FakeHost
from tests.nvgpu.nodescripts.nodescript_helpers import RunScript


@pytest.fixture(scope="session")
def script_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("nodescripts")
    for s in render_node_scripts(vfio=True):
        (d / s.name).write_text(s.content)
    return d


@pytest.fixture
def run_script(script_dir: Path) -> RunScript:
    def run(host: FakeHost, name: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script_dir / name)], env=host.env(**env), capture_output=True,
                              text=True, timeout=120, check=False)

    return run
