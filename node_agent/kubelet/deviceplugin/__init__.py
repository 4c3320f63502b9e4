"""The kubelet-facing side of the device plugin: the device plugin API v1beta1 and the process serving it.

``api`` (the protocol as the rest imports it: the stubs generated from ``deviceplugin_v1beta1.proto``,
loaded once), ``servicer`` (thin: protobuf to the domain calls of ``node_agent.deviceplugin`` and back),
``lifecycle`` (serve, register with kubelet, re-register when kubelet restarts, which ``dirwatch``
notices) and ``process`` (one ``device-plugin`` process: NVML session, config selection and reloads,
health, metrics, MPS daemons).
Symmetric with ``node_agent.kubelet.dra``; only ``node_agent.kubelet`` imports grpc.
"""
