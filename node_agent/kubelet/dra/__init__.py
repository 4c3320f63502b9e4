"""The kubelet-facing side of the DRA driver: plugin registration, the DRA gRPC services, the process.

Only this package (with the rest of ``node_agent.kubelet``) imports grpc. The servicers here are thin
(``server``): they translate protobuf messages to the driver's domain calls in ``node_agent.dra`` and
back; ``protos`` loads the generated stubs and ``process`` runs one ``dra-driver`` process (driver,
plugin server, inventory and uninstall loops) until it is told to stop.
"""
