"""The offline policy runner: the CrossGuard pack (``policies/``) over a stack without the Pulumi CLI.

It drives the real pack process over gRPC exactly as ``pulumi preview --policy-pack`` does
(:mod:`~nvidia_gpu.preview.policyrun.analyzer_client`), over a whole stack or a plan file
(:mod:`~nvidia_gpu.preview.policyrun.offline`), and as a step of the offline preview
(:mod:`~nvidia_gpu.preview.policyrun.preview_step`). It never imports the rules
(:mod:`nvidia_gpu.policies`): they run in the pack's own process, as under the CLI.
"""
