"""The nvidia-gpu node agent: prepares a GPU node (checks, container runtime, sysctl, VFIO, labels)
and hosts the device plugin, MIG manager and DRA driver.

Layers, top to bottom (import-linter's agent-layers contract): ``cli`` (the one command-line layer:
every ``python -m node_agent <command>``) → ``kubelet`` (gRPC: the device plugin and DRA servicers
and their processes) beside ``setup`` (check, runtime, sysctl, vfio, setup/teardown) → ``labeller``
(feature and node-group labels) → ``deviceplugin`` / ``dra`` / ``mig`` → ``cdi``, ``nvml`` (the only
importer of ``pynvml``) and ``kube`` (the only importer of ``kubernetes``) → ``host`` (the only code
touching host paths) → ``nvgpu``.
"""
