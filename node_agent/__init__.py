"""The nvidia-gpu node agent: prepares a GPU node (checks, container runtime, sysctl, VFIO, labels)
and hosts the device plugin, MIG manager and DRA driver.

Layers, top to bottom: ``kubelet`` (gRPC) → ``state``/``deviceplugin``/``mig``/``dra`` → ``nvml``
(the only importer of ``pynvml``) and ``host`` (the only code touching host paths) → ``nvgpu``.
"""
