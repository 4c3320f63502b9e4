"""``diagnose``: everything a support engineer asks of a GPU node, read and never changed.

What NVIDIA's ``nvidia-bug-report.sh`` and the GPU Operator's must-gather collect, in one JSON document
(and, with ``--bundle``, a tar.gz holding it and the raw files it read): the driver, NVML and the symbols
the driver's library exports; per GPU its identity, MIG mode current and pending, instances and possible
placements per profile, persistence and compute mode, fabric state, row remapping, retired pages, the
recovery action NVML asks for, and the processes using it; recent XIDs from the kernel log; the device
nodes and kernel modules present and which processes hold ``/dev/nvidia*``; the container runtime's
configuration and the CDI specs; the agent's own state files; and, with a kubeconfig, the node's GPU
labels, taints and GPU inventory objects.

Read-only by construction: NVML is only queried (getters; :meth:`NvmlSession.query` refuses anything
else), host files are only read, and nothing is written but the bundle the caller names. Every value is
collected on its own: a call a GPU, a driver or a simulator does not support is recorded as
``{"error": ...}`` in its place, so the document keeps one shape on every node, real or simulated.
"""

from node_agent.diagnose.bundle import write_bundle
from node_agent.diagnose.collect import Collector, collect

__all__ = ["Collector", "collect", "write_bundle"]
