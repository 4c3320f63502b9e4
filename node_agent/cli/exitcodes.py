"""Exit codes shared by every agent command (documented in ``node_agent.cli``)."""

from __future__ import annotations

OK = 0  #: done, or nothing to do (no GPU on this node)
FAILED = 1  #: the node or the operation is not OK (unusable GPU, setup failed); reason printed
USAGE = 2  #: bad command line
HOST_INPUT = 3  #: bad input on the host (malformed config, unreadable /proc, unknown format); host unchanged
KUBE = 4  #: the Kubernetes API call failed
REFUSED = 5  #: refused to act: GPU in use, a file that is not ours, NVML cannot confirm it is safe
