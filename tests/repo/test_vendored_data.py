"""The files the stack ships unchanged from their projects (nvgpu/data, nvidia_gpu/preview/crds) are the same
bytes as the public copies in the workspace's ``shared/data`` (where a checkout has it beside the repository),
and each is listed with its source and licence."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
VENDORED = {
    REPO / "nvgpu" / "data" / "dcgm-exporter-default-counters.csv": "nvidia-dcgm-exporter-default-counters.csv",
    REPO / "nvgpu" / "data" / "dcgm-exporter-dashboard.json": "nvidia-dcgm-exporter-dashboard.json",
    **{REPO / "nvidia_gpu" / "preview" / "crds" / f"{p}.monitoring.coreos.com.yaml": f"prometheus-operator-crd-{p}.yaml"
       for p in ("servicemonitors", "podmonitors", "prometheusrules")},
    REPO / "nvidia_gpu" / "preview" / "crds" / "nvidiadrivers.nvidia.com.yaml":
        "nvidia-gpu-operator-nvidiadriver-crd.yaml",
}


@pytest.mark.parametrize("path", sorted(VENDORED), ids=lambda p: p.name)
def test_a_vendored_file_is_listed_with_its_source(path: Path) -> None:
    assert path.name in (path.parent / "SOURCES.md").read_text()


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared/data beside this checkout")
@pytest.mark.parametrize("path", sorted(VENDORED), ids=lambda p: p.name)
def test_a_vendored_file_is_unchanged(path: Path) -> None:
    assert path.read_bytes() == (SHARED / VENDORED[path]).read_bytes()
