"""The rendered NodeGroupConfiguration scripts: shape, catalogue thresholds, shellcheck."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nvgpu import catalogue
from nvgpu.nodescripts import WEIGHTS, NodeScript, plan, render_node_scripts
from nvgpu.nodescripts.bashplan import render_chosen
from nvgpu.nodescripts.content import sysctl_dropin
from tests.kit.tools import missing


def test_script_set_and_weights() -> None:
    plain = render_node_scripts()
    assert [(s.name, s.weight) for s in plain] == [("gpu-devices.sh", 24), ("gpu-check.sh", 25), ("gpu-runtime.sh", 31),
                                                   ("gpu-sysctl.sh", 40)]
    dra = render_node_scripts(vfio=True)
    assert [s.name for s in dra] == ["gpu-devices.sh", "gpu-check.sh", "gpu-runtime.sh", "gpu-vfio.sh", "gpu-sysctl.sh"]
    assert all(isinstance(s, NodeScript) and s.weight == WEIGHTS[s.name] for s in dra)
    for s in dra:
        assert s.content.startswith("#!/usr/bin/env bash\n")
        assert "@@" not in s.content


def test_check_carries_catalogue_thresholds() -> None:
    check = next(s for s in render_node_scripts() if s.name == "gpu-check.sh").content
    assert f'GLOBAL_MIN_DRIVER="{catalogue.GLOBAL_MIN_DRIVER}"' in check
    major, minor = catalogue.MIN_COMPUTE_CAPABILITY
    assert f"plan_minimum={major}.{minor}" in check and f"< {major * 1000 + minor}))" in check
    for model in catalogue.MODELS:
        for name in model.product_names:
            assert f'"{name}"' in check
        assert f") echo {model.effective_min_driver} ;;" in check
        ids = " | ".join(f'"{d:04X}"' for d in model.pci_device_ids)  # by PCI device ID first
        assert f"{ids}) echo {model.effective_min_driver}; return 0 ;;" in check
    assert "timeout -k 5 15" in check


def test_root_prefix_is_the_default_of_the_env_override() -> None:
    check = render_node_scripts(root_prefix="/host/")[0].content
    assert 'ROOT="${NVIDIA_GPU_ROOT-/host}"' in check
    assert 'ROOT="${NVIDIA_GPU_ROOT-}"' in render_node_scripts()[0].content


def test_the_plans_are_rendered_into_the_scripts() -> None:
    runtime = next(s for s in render_node_scripts() if s.name == "gpu-runtime.sh").content
    assert render_chosen(plan.RUNTIME_DROPIN, refuse="runtime_refuse") in runtime
    sysctl = next(s for s in render_node_scripts() if s.name == "gpu-sysctl.sh").content
    assert sysctl_dropin() in sysctl


@pytest.mark.parametrize("script", [s.name for s in render_node_scripts(vfio=True)])
def test_shellcheck_clean(script: str, tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        missing("shellcheck is not installed (make deps installs it)")
    content = next(s for s in render_node_scripts(vfio=True) if s.name == script).content
    path = tmp_path / script
    path.write_text(content)
    result = subprocess.run(["shellcheck", "--severity=info", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout
