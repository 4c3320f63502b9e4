"""CrossGuard rules of nvidia-gpu: GPU-config validity and Kubernetes security.

The rules live in :mod:`nvidia_gpu.policies.gpu_validity` and :mod:`nvidia_gpu.policies.k8s_security`
(with the manifest, node-selection and stack-config readers they share), and the list the pack serves in
:mod:`nvidia_gpu.policies.pack`. The pack directory the Pulumi CLI runs is the repository's ``policies/``
(PulumiPolicy.yaml and a ``__main__.py`` that constructs the ``PolicyPack`` from this package; it serves
gRPC and never returns, so nothing imports it). :mod:`nvidia_gpu.preview.policyrun` runs that pack
offline exactly as the CLI does; this package never imports it.
"""
