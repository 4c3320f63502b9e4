"""CrossGuard policy pack of nvidia-gpu: GPU-config validity and Kubernetes security.

``__main__.py`` only constructs the ``PolicyPack`` (it serves gRPC and never returns, so nothing may
import it); the rules live in :mod:`policies.gpu_validity` and :mod:`policies.k8s_security`, the list
the pack serves in :mod:`policies.pack`, and :mod:`policies.analyzer_client` runs the pack offline
exactly as the Pulumi CLI does.
"""
