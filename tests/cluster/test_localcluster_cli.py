"""``make cluster-up`` / ``cluster-down`` (``python -m localcluster``): a control plane that outlives
the command, a working cluster-admin kubeconfig, and a clean stop."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import ControlPlane, Kube, controlplane
from localcluster.processes import alive

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localcluster", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=180, check=False)


def test_up_status_down(control_plane: ControlPlane, tmp_path: Path) -> None:
    del control_plane  # only for its skip/fail policy when the binaries are missing
    state = tmp_path / "cluster"
    up = _cli("up", "--dir", str(state))
    assert up.returncode == 0, up.stderr
    assert "control plane v1.34.4 up in" in up.stdout
    pids = json.loads((state / "state.json").read_text())["pids"]
    try:
        # netproxy: the path between the host and real nodes (localcluster.node), always beside the API server.
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
                             "netproxy"}
        assert all(alive(pid) for pid in pids.values()), "the processes outlive `up`"
        kube = Kube.from_kubeconfig(state / "kubeconfig")
        assert kube.can_i("*", "*"), "the kubeconfig is cluster-admin"
        assert kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "nodegroups.deckhouse.io")
        assert (state / "kubeconfig").stat().st_mode & 0o077 == 0, "credentials are private to the user"

        again = _cli("up", "--dir", str(state))
        assert again.returncode == 0 and "already running" in again.stdout
        status = _cli("status", "--dir", str(state))
        assert status.returncode == 0 and "running: v1.34.4" in status.stdout
    finally:
        down = _cli("down", "--dir", str(state))
    assert down.returncode == 0, down.stderr
    assert not state.exists()
    assert not any(alive(pid) for pid in pids.values())
    assert _cli("status", "--dir", str(state)).returncode == 1


def test_a_port_taken_between_picking_and_binding_is_picked_again(control_plane: ControlPlane, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clones start control planes at once: a port one picked free may be bound by the other before its
    API server binds it. The start picks again instead of failing."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    picks = iter([held.getsockname()[1]])
    real = controlplane.free_port
    monkeypatch.setattr(controlplane, "free_port", lambda: next(picks, None) or real())
    cp = ControlPlane(directory=tmp_path / "cp", components=("etcd", "kube-apiserver"), bin_dir=control_plane.bin_dir)
    try:
        cp.start(timeout=60)
        assert cp.ports["etcd"] != held.getsockname()[1]
        assert cp.admin().get("v1", "Namespace", "default")
    finally:
        cp.stop()
        held.close()
