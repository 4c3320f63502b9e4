"""The labeller: GPU feature-discovery labels for NFD and the Node, and the node group's labels and taints.

``gfd`` (the labels from the NVML inventory, as NVIDIA's GFD computes them), ``nodeconfig`` (the node
group's labels and taints: planned against a Node snapshot, without an API server), ``nodepatch`` (that
plan applied to the Node, one merge patch) and ``labels`` (one labelling run and the loop: read the GPUs
and the device plugin's config, write the feature file, patch the Node, withdraw it all when the
DaemonSet is gone). The command line is ``node_agent.cli.labels``.
"""
