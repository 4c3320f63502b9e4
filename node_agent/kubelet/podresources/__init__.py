"""kubelet's PodResources API v1 (``podresources_v1.proto``): which container holds which device.

``client`` asks kubelet's ``List`` and turns the answer into :class:`node_agent.exporter.holders.
ContainerDevices`; the metrics exporter labels its series with the holders. Only ``node_agent.kubelet``
imports grpc.
"""
