"""The kubelet device plugin's domain: config, devices, allocation, topology, health, CDI and metrics.

Nothing here imports grpc (``node_agent.kubelet.deviceplugin`` adapts these types to the protocol) or pynvml (the
devices of a node arrive through the :class:`~node_agent.deviceplugin.devices.NodeDevices` protocol).
"""
