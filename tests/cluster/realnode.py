"""What the real-node tests share (``localcluster.node``; the ``real_cluster`` fixture is in conftest)."""

from __future__ import annotations

import subprocess

from localcluster import ControlPlane

#: What a real node runs, from the tools cache.
NODE_TOOLS = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "crictl", "runc", "kubectl", "cni")


def kubectl(cp: ControlPlane, *args: str, check: bool = True) -> str:
    """``kubectl`` as a user runs it against ``cp``; its output (``""`` on failure when not ``check``)."""
    assert cp.bin_dir is not None
    done = subprocess.run([str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout if done.returncode == 0 else ""
