"""Offline preview: run the real Pulumi program under the SDK's mock engine, render and validate what it would deploy.

``python -m nvidia_gpu.preview --stack dev`` (what ``make preview`` runs) needs no Pulumi CLI and no cluster. It is a
pipeline of steps (:mod:`nvidia_gpu.preview.pipeline`): load and validate the stack config, run ``__main__.py``
with every registration recorded, render one manifest per Kubernetes object in apply order plus
``plan.json``, and validate the manifests against the Kubernetes OpenAPI schema of the stack's version
and custom resources against their CRDs. Later steps (policy analysis) consume the same typed result.
"""
