"""The kubelet-facing edge of the node agent: the only package that imports grpc.

It holds the kubelet protocols (``.proto`` files, generated stubs), thin servicers that translate
between protobuf and the domain packages (``node_agent.deviceplugin``), and the lifecycle that serves,
registers and re-registers plugins when kubelet restarts.
"""
