"""The wheel: one import root for the Pulumi side, declared dependencies in step with the pinned ones."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import nvidia_gpu
from nvidia_gpu.components import node_group, platform, program

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _pins(name: str) -> dict[str, str]:
    out = {}
    for line in (REPO / name).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def _ranges(specs: list[str]) -> dict[str, tuple[str, str | None]]:
    out = {}
    for spec in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([^,]+)(?:,<(\S+))?", spec)
        assert m, f"{spec}: a compatible range `name>=tested,<next` is expected"
        out[m.group(1).lower()] = (m.group(2), m.group(3))
    return out


def test_packages_are_one_pulumi_root_and_no_generic_names() -> None:
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(include) == ["localcluster*", "node_agent*", "nvgpu*", "nvidia_gpu*", "nvml_sim*"]
    for generic in ("components", "policies", "preview"):
        assert not (REPO / generic / "__init__.py").exists(), f"{generic}/ must not be a top-level package"


def test_library_dependencies_start_at_the_tested_pins() -> None:
    """Every runtime dependency of the library is declared, its lower bound the version requirements.txt
    pins (what CI tests); so a user's resolver can never pick an older, untested one."""
    declared = _ranges(PYPROJECT["project"]["dependencies"])
    pins = _pins("requirements.txt")
    runtime = {"pulumi", "pulumi-kubernetes", "pulumi-policy", "pydantic", "pyyaml", "protobuf", "grpcio",
               "kubernetes-validate", "jsonschema", "referencing"}
    assert set(declared) == runtime
    for name, (low, _high) in declared.items():
        assert pins[name] == low, f"{name}: pyproject says >={low}, requirements.txt pins {pins[name]}"


def test_agent_extra_matches_the_agent_requirements_and_has_no_pulumi() -> None:
    declared = _ranges(PYPROJECT["project"]["optional-dependencies"]["agent"])
    pins = {k: v for k, v in _pins("requirements-agent.txt").items() if k not in {"pydantic", "pyyaml", "grpcio",
                                                                                   "protobuf"}}
    assert {k: v[0] for k, v in declared.items()} == pins
    assert not any("pulumi" in name for name in declared)


def test_license_is_an_spdx_string() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"


def test_the_top_level_exports_the_public_components() -> None:
    assert nvidia_gpu.GpuPlatform is platform.GpuPlatform and nvidia_gpu.GpuNodeGroupArgs is node_group.GpuNodeGroupArgs
    assert nvidia_gpu.build_stack is program.build_stack
    for name in nvidia_gpu.__all__:
        assert getattr(nvidia_gpu, name).__name__ == name
    assert set(nvidia_gpu.__all__) <= set(dir(nvidia_gpu))
