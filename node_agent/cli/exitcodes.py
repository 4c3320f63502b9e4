"""The agent's exit codes: one table for every command.

====  ==========================================================================================
code  meaning
====  ==========================================================================================
0     OK, or nothing to do (no GPU on this node)
1     not OK: GPU present but unusable, setup failed, a MIG layout not applied (reason printed)
2     bad command line (for ``mig``: also an unreadable config file, an unknown config name, a
      layout for another GPU model)
3     bad input on the host (malformed containerd config, unreadable /proc entry, unknown driver
      version format, GPU model missing from the catalogue, an invalid device-plugin config);
      the host is left as it was
4     Kubernetes API error
5     refused: the GPU is in use, a file in the way is not ours, safety cannot be confirmed, or a
      MIG mode change needs a reboot
====  ==========================================================================================

Only the command line (``node_agent.cli``) turns results and domain errors into these; the domain
packages report what happened in their own types.
"""

from __future__ import annotations

OK = 0  #: done, or nothing to do (no GPU on this node)
FAILED = 1  #: the node or the operation is not OK (unusable GPU, setup failed); reason printed
USAGE = 2  #: bad command line
HOST_INPUT = 3  #: bad input on the host (malformed config, unreadable /proc, unknown format); host unchanged
KUBE = 4  #: the Kubernetes API call failed
REFUSED = 5  #: refused to act: GPU in use, a file that is not ours, NVML cannot confirm it is safe

#: The one-line summary ``--help`` prints.
SUMMARY = "exit codes: 0 ok, 1 not ok, 2 usage, 3 bad host input, 4 Kubernetes API, 5 refused"
