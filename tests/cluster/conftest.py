"""The real control plane for the ``cluster`` tests: one per test session, on loopback.

Started from the pinned binaries (``make tools``); ``make test`` and CI set
``NVIDIA_GPU_REQUIRE_CLUSTER=1`` so that missing binaries fail the run instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import ControlPlane, Kube
from localcluster.dryrun import install_crds
from tests.cluster import stack as stack_helpers
from tests.cluster.pulumi_project import KINDS, prepare_cluster
from tests.cluster.realnode import NODE_TOOLS
from tests.kit.tools import missing, required_bin

REPO = Path(__file__).resolve().parents[2]


@pytest.hookimpl(tryfirst=True)  # before `-m "not cluster"` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bin_dir = required_bin()
    cp = ControlPlane(directory=tmp_path_factory.mktemp("cluster"), bin_dir=bin_dir)
    cp.start()
    try:
        install_crds(cp.admin(), sorted((REPO / "nvidia_gpu" / "preview" / "crds").glob("*.yaml")))
        print(f"\ncontrol plane up in {cp.startup_s:.1f} s at {cp.server}")
        yield cp
    finally:
        cp.stop(remove=False)


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    return control_plane.admin()


@pytest.fixture(scope="session")
def dev_stack(kube: Kube) -> stack_helpers.AppliedStack:
    """The dev stack rendered by the preview and applied for real (Deckhouse NodeGroups in place)."""
    return stack_helpers.apply_stack(kube, "dev")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own, prepared as a Deckhouse user's (``prepare_cluster``), for the
    real engine's tests: the session's one holds the dev stack applied by the dry-run harness, which a
    real ``pulumi up`` would collide with."""
    cp = ControlPlane(directory=tmp_path_factory.mktemp("engine-cluster"), bin_dir=required_bin())
    cp.start()
    try:
        prepare_cluster(cp, KINDS)
        yield cp
    finally:
        cp.stop(remove=False)



@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own for real nodes (``localcluster.node``): the session's holds the
    dev stack, whose DaemonSets would schedule onto a real node. Needs root (network/mount/UTS namespaces,
    mounts, cgroups) and gcc (the pause image is compiled here)."""
    if os.geteuid() != 0:
        missing("a real node needs root (network/mount/UTS namespaces, mounts, cgroups)")
    bin_dir = required_bin(*NODE_TOOLS)
    if shutil.which("gcc") is None:
        missing("gcc is needed to build the pause image")
    cp = ControlPlane(directory=tmp_path_factory.mktemp("real-node"), bin_dir=bin_dir,
                      components=("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop(remove=False)  # removes any node a failed test left

