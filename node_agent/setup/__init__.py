"""Node setup: what makes a GPU node usable by containers, and undoes it.

``check`` (is the GPU usable: the twin of ``gpu-check.sh``), ``runtime`` (containerd / CRI-O: the
nvidia runtime and CDI), ``sysctl`` (the drop-in and live value the toolkit needs), ``vfio`` (a GPU
handed to ``vfio-pci`` and back), and ``flow`` (``setup`` / ``teardown``: those steps in order, then the
Node's gate label). Their shared means of changing host files reversibly: ``journal`` (what a file was
before we changed it, for rollback) and ``tomlwrite`` (containerd's TOML written back). ``executor`` applies
the steps declared as plans (``nvgpu.nodescripts.plan``: sysctl, VFIO, the check's host requirements), which the
Deckhouse scripts run rendered as bash (docs/node-setup.md). Host access only
through ``node_agent.host``; the command line for all of it is ``node_agent.cli``.
"""
