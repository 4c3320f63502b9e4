"""The kubelet-facing side of the DRA driver: plugin registration and the DRA gRPC services.

Only this package (with the rest of ``node_agent.kubelet``) imports grpc. The servicers here are thin:
they translate protobuf messages to the driver's domain calls in ``node_agent.dra`` and back.
"""
