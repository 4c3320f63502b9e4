"""The kubelet-facing edge of the node agent: the only package that imports grpc.

One sub-package per kubelet protocol, each with its ``.proto`` files (stubs generated, never committed),
thin servicers that translate between protobuf and the domain packages, and the process that serves
them: ``deviceplugin`` (the device plugin API, over ``node_agent.deviceplugin``) and ``dra`` (plugin
registration and the DRA services, over ``node_agent.dra``). Shared here: ``codegen`` (stub generation:
``make proto``, the image build and first import).
"""
