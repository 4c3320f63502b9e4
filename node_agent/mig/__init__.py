"""The MIG manager: converge a node's GPUs to the layout named by its ``nvidia.com/mig.config`` label.

Layers, top to bottom: ``executor`` (runs actions, journals before each destructive step),
``machine`` (the pure decision function and its states), ``kube`` (the Node/Pod/Event calls over the
official client), ``apply`` and ``plan`` (NVML work through the
:class:`~node_agent.mig.hardware.MigBackend` protocol) and ``journal`` (the crash-safe progress record
on the host). The ``mig-manager`` and ``mig plan|apply|assert`` commands are ``node_agent.cli.mig``.

Host files (the journal, the markers) are read and written through the ``JournalFiles``/``StateFiles``
protocols, which the agent's ``node_agent.host.HostRoot`` satisfies as it is; ``hostfiles`` holds only
what is not a host file: the step lock in the container, the GPU reset command and the reboot.
"""
