"""A real Kubernetes control plane on loopback, for the cluster tests and the preview's server dry-run.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok, built from their pinned Go
modules by ``make tools`` (``tools/build.sh``), run as child processes in one state directory. The
same code serves ``make cluster-up`` / ``cluster-down`` (``python -m localcluster``), the pytest
``cluster`` fixture and ``make preview``'s dry-run, so what the tests prove is what users can rerun.
"""

from localcluster.client import ApiError, Kube
from localcluster.controlplane import ControlPlane, ToolsMissing, tools_bin

__all__ = ["ApiError", "ControlPlane", "Kube", "ToolsMissing", "tools_bin"]
