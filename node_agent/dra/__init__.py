"""The DRA kubelet plugin's domain: devices, ResourceSlices, claims, opaque configs, CDI and the checkpoint.

Nothing here imports grpc or pynvml. ``node_agent.kubelet.dra`` adapts the kubelet's gRPC calls to
:class:`node_agent.dra.driver.DraDriver`; the NVML inventory arrives through the
:class:`node_agent.dra.devices.InventorySource` protocol, and host files through the
:class:`~node_agent.dra.hostfs.HostPaths` protocol, which the agent's ``node_agent.host.HostRoot``
satisfies as it is (paths that climb out with ``..`` are refused there, once for every caller).
"""
