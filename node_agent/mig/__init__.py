"""The MIG manager: converge a node's GPUs to the layout named by its ``nvidia.com/mig.config`` label.

Layers, top to bottom: ``executor`` (runs actions, journals before each destructive step),
``machine`` (the pure decision function and its states), ``kube`` (the Node/Pod/Event calls over the
official client), ``apply`` and ``plan`` (NVML work through the
:class:`~node_agent.mig.hardware.MigBackend` protocol) and ``journal`` (the crash-safe progress record
on the host). The ``mig-manager`` and ``mig plan|apply|assert`` commands are ``node_agent.cli.mig``.
"""
